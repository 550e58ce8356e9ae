"""Reductions shared by the layers' and the kernels' gradient formulas."""
import torch


def column_sum(dy: torch.Tensor) -> torch.Tensor:
    """``dy.sum`` over every dim but the last, as a GEMV ``dy^T 1`` (fp32 accumulation, as
    the reduction has).  On the H200 torch's column reduction of a [169343, 128] fp32
    gradient took 156 us against 33 us for the GEMV ([37700, 128]: 46 against 16 us)."""
    flat = dy.reshape(-1, dy.shape[-1])
    return torch.mv(flat.t(), flat.new_ones(flat.shape[0]))
