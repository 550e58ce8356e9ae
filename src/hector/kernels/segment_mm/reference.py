"""Plain-PyTorch segment GEMM: the CPU path and the reference the Triton kernels are tested
against.  One matmul per segment (segments are relations or node types, so few), vectorised
inside a segment; the weight of a segment is used as is, never copied per row.  Autograd
comes from torch: the gathers, matmuls, concatenation and ``index_add`` are differentiable."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .spec import PROLOGUES

_HALF = (torch.float16, torch.bfloat16)


def segment_mm_torch(x: torch.Tensor, weight: torch.Tensor, bounds: Sequence[int],
                     gather: Optional[torch.Tensor] = None,
                     scatter: Optional[torch.Tensor] = None,
                     num_out_rows: Optional[int] = None,
                     transpose_weight: bool = False,
                     bias: Optional[torch.Tensor] = None,
                     prologue: Optional[str] = None) -> torch.Tensor:
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
    return out.to(x.dtype)
