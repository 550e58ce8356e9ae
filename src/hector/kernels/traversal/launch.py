"""Triton launches of the traversal kernel and its ``autograd.Function``.

The backward of ``out = M x + sum_i c_i a_i + b`` is the same kernel on ``M^T`` (the CSR by
source, built once per CSR and kept on it): ``dx = M^T dy``, ``da_i = c_i dy``, ``db = sum dy``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .. import registry
from .csr import WeightedCSR
from .spec import TraversalKernelSpec

#: CSR entries a program loads per step (a tile of rows ``[BLOCK_E, BLOCK_F]``).
BLOCK_E = 16


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def transposed(m: WeightedCSR) -> WeightedCSR:
    """``m``'s transpose, built on first use and kept on ``m`` (graph-derived, like a CSC)."""
    t = m.__dict__.get("_transposed")
    if t is None:
        t = m.transpose()
        object.__setattr__(m, "_transposed", t)
    return t


def launch(m: WeightedCSR, x: torch.Tensor, addends: Sequence[torch.Tensor],
           coefs: Sequence[float], bias: Optional[torch.Tensor]) -> torch.Tensor:
    """One traversal kernel launch: ``[m.rows, F]`` output in ``x``'s dtype."""
    width = x[0].numel() if x.shape[0] else int(torch.Size(x.shape[1:]).numel())
    out = torch.empty((m.rows,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    if m.rows == 0 or width == 0:
        return out
    spec = TraversalKernelSpec(num_addends=len(addends), has_bias=bias is not None)
    kern = registry.kernel("traversal_csr", **spec.params())
    block_f = min(_next_pow2(width), 128)
    pairs = []
    for a, c in zip(addends, coefs):
        pairs += [a.contiguous(), float(c)]
    grid = (m.rows, -(-width // block_f))
    kern[grid](m.ptr, m.col, m.val, x.contiguous(), out, *pairs,
               bias.contiguous() if bias is not None else out, width,
               BLOCK_E=BLOCK_E, BLOCK_F=block_f)
    return out


class TraversalFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, m, coefs, has_bias, x, *rest):
        addends = rest[:len(coefs)]
        bias = rest[len(coefs)] if has_bias else None
        ctx.m, ctx.coefs, ctx.has_bias = m, coefs, has_bias
        ctx.bias_shape = None if bias is None else bias.shape
        return launch(m, x, addends, coefs, bias)

    @staticmethod
    def backward(ctx, dy):
        dy = dy.contiguous()
        dx = launch(transposed(ctx.m), dy, (), (), None) if ctx.needs_input_grad[3] else None
        da = [c * dy if need else None
              for c, need in zip(ctx.coefs, ctx.needs_input_grad[4:])]
        db = None
        if ctx.has_bias and ctx.needs_input_grad[-1]:
            db = dy.reshape(dy.shape[0], -1).float().sum(0).to(dy.dtype).reshape(ctx.bias_shape)
        return (None, None, None, dx, *da, *([db] if ctx.has_bias else []))


def launch_edge_softmax(ptr: torch.Tensor, eid: torch.Tensor, s: torch.Tensor,
                        slope: Optional[float]) -> torch.Tensor:
    """``softmax`` of ``s [E, H, 1]`` (after ``leaky_relu(slope)`` when given) over each CSR
    row's edges, written in ``s``'s edge order and dtype."""
    out = torch.empty_like(s)
    rows, heads = ptr.shape[0] - 1, int(s[0].numel()) if s.shape[0] else 0
    if rows == 0 or s.shape[0] == 0:
        return out.zero_()
    kern = registry.kernel("edge_softmax", has_leaky=slope is not None)
    kern[(rows,)](ptr, eid, s.contiguous(), out, heads, float(slope or 0.0),
                  BLOCK_E=BLOCK_E, BLOCK_H=_next_pow2(heads))
    return out
