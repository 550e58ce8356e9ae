"""Reductions shared by the layers' and the kernels' gradient formulas, and the precision the
torch paths accumulate in."""
import torch


def column_sum(dy: torch.Tensor) -> torch.Tensor:
    """``dy.sum`` over every dim but the last, as a GEMV ``dy^T 1`` (fp32 accumulation, as
    the reduction has): on the GPU a fraction of torch's column reduction's time
    (docs/perf-notes.md, "Transformer's bias gradients as GEMVs")."""
    flat = dy.reshape(-1, dy.shape[-1])
    return torch.mv(flat.t(), flat.new_ones(flat.shape[0]))


def accumulating(t: torch.Tensor) -> torch.Tensor:
    """``t`` in its accumulation precision: fp32 at least (half-precision inputs accumulate
    in fp32, as the kernels do), float64 kept (``.float()`` would round a float64 layer's
    softmax and gradients to fp32)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))
