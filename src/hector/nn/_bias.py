"""Linear layers whose bias gradient is one GEMV: ``db = dy^T 1`` instead of torch's column
reduction.

``nn.Linear``'s backward gives its bias ``dy.sum(0)``.  On the H200 that reduction of a
[169343, 128] fp32 gradient took 156 us against 33 us for ``torch.mv(dy.t(), ones)`` (the
same sum as a matrix-vector product; [37700, 128]: 46 against 16 us).  Transformer has four
such biases per layer: its training step on synthetic arxiv (128x1, captured) went from 3.79
to 3.45 ms.  (GAT's output bias is added by the attention kernels' epilogue instead, its
gradient the same GEMV: ``kernels.attention.custom_ops.bias_grad``.)  The forward is
unchanged (``F.linear`` keeps the bias fused into its GEMM); the function is a plain
``autograd.Function`` of aten ops, so it traces under ``torch.compile`` and is captured in
CUDA graphs like the op it replaces.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels.reduce import column_sum


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        dx = dy @ weight if need_x else None
        dw = (dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1])) if need_w else None
        db = column_sum(dy) if need_b else None
        return dx, dw, db


def linear(x: torch.Tensor, module: torch.nn.Linear) -> torch.Tensor:
    """``module(x)`` for an ``nn.Linear``, its bias gradient a GEMV."""
    return linear_of(x, module.weight, module.bias)


def linear_of(x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, its bias gradient a GEMV."""
    if bias is None:
        return F.linear(x, weight)
    return _Linear.apply(x, weight, bias)

