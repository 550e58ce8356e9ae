"""Plain-PyTorch segment GEMM: the CPU path and the reference the Triton kernels are tested
against.  One matmul per segment (segments are relations or node types, so few), vectorised
inside a segment; the weight of a segment is used as is, never copied per row.  Autograd
comes from torch: the gathers, matmuls, concatenation and ``index_add`` are differentiable."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..ptr import rows_of_entries
from .spec import PROLOGUES

_HALF = (torch.float16, torch.bfloat16)


def segment_mm_torch(x: torch.Tensor, weight: torch.Tensor, bounds: Sequence[int],
                     gather: Optional[torch.Tensor] = None,
                     scatter: Optional[torch.Tensor] = None,
                     num_out_rows: Optional[int] = None,
                     transpose_weight: bool = False,
                     bias: Optional[torch.Tensor] = None,
                     prologue: Optional[str] = None,
                     addend: Optional[torch.Tensor] = None,
                     extra_weight: Optional[torch.Tensor] = None):
    """See :func:`hector.kernels.segment_mm.op.segment_mm` (inputs already validated).

    ``bounds`` is ``seg_ptr`` as Python ints (the op reads it on the host once).  Half
    precision is multiplied in fp32 and rounded once at the end, the same arithmetic as the
    kernels (fp32 accumulation, including across the rows a scatter sums); a ``prologue`` is
    computed in fp32 and rounded to x's dtype, as the kernels load it."""
    work = torch.float32 if x.dtype in _HALF else x.dtype
    if prologue:     # (computed in fp32 at least, rounded to x's dtype as the kernels load it)
        x = PROLOGUES[prologue][0](x.to(torch.promote_types(x.dtype, torch.float32))) \
            .to(x.dtype)
    xs = x.to(work)
    ws = weight.to(work)
    if transpose_weight:
        ws = ws.transpose(1, 2)
    num_segments = weight.shape[0]
    parts = []
    for s in range(num_segments):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        # Empty segments still go through the matmul so that x and weight stay in the
        # autograd graph (their gradients are then zeros rather than missing).
        rows = xs.index_select(0, gather[lo:hi]) if gather is not None else xs[lo:hi]
        parts.append(rows @ ws[s] + bias[s].to(work) if bias is not None else rows @ ws[s])
    if not parts:   # no segment at all: an empty product keeps both inputs in the graph
        parts.append(xs[:0] @ ws.sum(0))
    y = torch.cat(parts, dim=0)
    if scatter is not None:
        out = y.new_zeros(num_out_rows, y.shape[1])
        out = out.index_add(0, scatter, y)
    else:
        out = y
    if addend is not None:      # (in fp32 at least, before the one rounding, as the kernel)
        out = out + addend.to(work)
    if extra_weight is not None:    # (from the unrounded rows, as the kernel's epilogue)
        return out.to(x.dtype), (out @ extra_weight.to(work)).to(x.dtype)
    return out.to(x.dtype)


def csr_rows_torch(x: torch.Tensor, ptr: torch.Tensor, col: torch.Tensor,
                   val: torch.Tensor) -> torch.Tensor:
    """``a [R, K]``, ``a_i = sum_{e in row i} val[e] x[col[e]]``: the rows the CSR prologue
    sums, in fp32 (at least) and rounded once to ``x``'s dtype, as the kernel does.
    Differentiable in ``x``."""
    work = torch.promote_types(x.dtype, torch.float32)
    terms = x.index_select(0, col.long()).to(work) * val.to(work)[:, None]
    a = terms.new_zeros(ptr.numel() - 1, x.shape[1])
    return a.index_add(0, rows_of_entries(ptr, col.numel()), terms).to(x.dtype)


def csr_rows_transposed_torch(da: torch.Tensor, ptr: torch.Tensor, col: torch.Tensor,
                              val: torch.Tensor, num_x_rows: int) -> torch.Tensor:
    """``dx [num_x_rows, K]``: the gradient of :func:`csr_rows_torch` given ``da``."""
    work = torch.promote_types(da.dtype, torch.float32)
    terms = da.index_select(0, rows_of_entries(ptr, col.numel())).to(work) * val.to(work)[:, None]
    dx = terms.new_zeros(num_x_rows, da.shape[1])
    return dx.index_add(0, col.long(), terms).to(da.dtype)
