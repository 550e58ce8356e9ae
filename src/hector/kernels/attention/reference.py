"""Plain-PyTorch twin of the fused attention kernels: the CPU path and the reference every
Triton kernel is tested against.

On the CPU the attention matrix of each head is a sparse CSR matrix: the aggregation is one
sparse-dense product, the q.k scores and the gradient of the weights are sampled dense-dense
products (SDDMM), and the backward is written by hand from the forward's weights, so no
``[E, H, D]`` message tensor is ever built (that is where the edge-wise version spent its
time).  Off the CPU the edge-wise version (per-edge gathers, scatter-based segment softmax,
autograd from torch) remains: the sparse kernels there are untested."""
from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn.functional as F

from ...graph.build import ptr_of, stable_argsort
from ..ptr import rows_of_entries

_MASK32 = 0xFFFFFFFF
#: Multipliers of the "lowbias32" integer finaliser (C. Wellons); shared with the Triton code.
HASH_MUL1 = 0x7FEB352D
HASH_MUL2 = 0x846CA68B


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2^32 without int64 overflow: torch has no wrapping uint32 multiply, and
    # x * c can reach 2^64, so split c into 16-bit halves (each product stays below 2^48).
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, HASH_MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, HASH_MUL2)
    return x ^ (x >> 16)


def dropout_threshold(p: float) -> int:
    """Keep an (edge, head) when its 24-bit hash is >= this; integer so that both backends
    compare exactly the same numbers (no float rounding of ``p`` in two places)."""
    return min(int(round(p * (1 << 24))), 1 << 24)


def dropout_keep(seed, eid: torch.Tensor, heads: int, p: float) -> torch.Tensor:
    """``[len(eid), heads]`` bool keep-mask of canonical edges ``eid``: a counter-based hash of
    (seed, edge id, head), so forward, backward and both backends draw the same mask without
    storing it.  Bit-identical to ``dropout_keep`` in kernels/templates/_macros.py.j2.
    ``seed``: an int, or a one-element integer tensor (read on the device, no sync)."""
    h = torch.arange(heads, device=eid.device, dtype=torch.int64)
    x = (eid.to(torch.int64)[:, None] * heads + h[None, :]) & _MASK32
    if isinstance(seed, torch.Tensor):
        seed = seed.to(device=eid.device, dtype=torch.int64).reshape(())
    x = _mix32(_mix32(x) ^ (seed & 0x7FFFFFFF))
    return (x >> 8) >= dropout_threshold(p)


def edge_scores(graph, heads: int, q=None, k=None, a_src=None, a_dst=None, scale: float = 1.0,
                negative_slope: Optional[float] = None, dtype=torch.float32) -> torch.Tensor:
    """``[E, H]`` scores in canonical edge order (before the softmax); all zero (a plain mean
    over each row) when no term is given."""
    src, dst = graph.src.long(), graph.dst.long()
    s = torch.zeros(graph.num_edges, heads, dtype=dtype, device=graph.device)
    if q is not None:
        s = s + scale * (q.to(dtype)[dst] * k.to(dtype)[src]).sum(-1)
    if a_src is not None:
        s = s + a_src.to(dtype)[src]
    if a_dst is not None:
        s = s + a_dst.to(dtype)[dst]
    if negative_slope is not None:
        s = F.leaky_relu(s, negative_slope)
    return s


def segment_softmax(scores: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Softmax of ``scores`` [E, H] over the edges sharing a destination."""
    heads = scores.shape[1]
    idx = dst[:, None].expand(-1, heads)
    # The row max only stabilises exp(); softmax does not depend on it, so no gradient.
    row_max = torch.full((num_nodes, heads), float("-inf"), dtype=scores.dtype,
                         device=scores.device).scatter_reduce(0, idx, scores.detach(), "amax")
    p = torch.exp(scores - row_max[dst])
    denom = torch.zeros(num_nodes, heads, dtype=scores.dtype, device=scores.device)
    denom = denom.index_add(0, dst, p)
    return p / denom[dst]


def edge_attention_torch(graph, v: torch.Tensor, q=None, k=None, a_src=None, a_dst=None,
                         scale: float = 1.0, negative_slope: Optional[float] = None,
                         dropout: float = 0.0, seed: Optional[int] = None) -> torch.Tensor:
    """Reference for :func:`hector.kernels.attention.op.edge_attention` (inputs already validated).
    Accumulates in float32 (float64 for float64 inputs) and returns ``v.dtype``."""
    acc = torch.float64 if v.dtype == torch.float64 else torch.float32
    # Under torch.compile the edge-wise form is traced instead (dynamo cannot create sparse
    # tensors, and inductor fuses the gathers and scatters itself); a graph without nodes
    # too (the sparse layout's [0, -1] views are undefined).
    if v.device.type != "cpu" or v.shape[0] == 0 or torch.compiler.is_compiling():
        return _edge_attention_gather(graph, v, q, k, a_src, a_dst, scale, negative_slope,
                                      dropout, seed, acc)
    heads = v.shape[1]
    layout = _layout(graph, heads)
    drop_scale = None
    if dropout > 0.0:
        keep = dropout_keep(seed, torch.arange(graph.num_edges), heads, dropout)
        drop_scale = keep.reshape(-1).index_select(0, layout.keep_index).to(acc) / (1.0 - dropout)
    cast = [None if t is None else t.to(acc) for t in (v, q, k, a_src, a_dst)]
    out = _CsrAttention.apply(layout, *cast, float(scale), negative_slope, drop_scale)
    return out.to(v.dtype)


def _edge_attention_gather(graph, v, q, k, a_src, a_dst, scale, negative_slope, dropout, seed,
                           acc):
    """The edge-wise formulation: ``[E, H]`` scores by gathers, softmax by scatters,
    ``[E, H, Dv]`` messages summed by ``index_add``; torch's autograd does the backward."""
    n, heads, dim_v = v.shape
    src, dst = graph.src.long(), graph.dst.long()
    s = edge_scores(graph, heads, q, k, a_src, a_dst, scale, negative_slope, acc)
    alpha = segment_softmax(s, dst, n)
    if dropout > 0.0:
        eid = torch.arange(graph.num_edges, device=v.device)
        keep = dropout_keep(seed, eid, heads, dropout)
        alpha = torch.where(keep, alpha / (1.0 - dropout), torch.zeros_like(alpha))
    out = torch.zeros(n, heads, dim_v, dtype=acc, device=v.device)
    out = out.index_add(0, dst, alpha[:, :, None] * v.to(acc)[src])
    return out.to(v.dtype)


# -- the CPU path: every head in one block-diagonal sparse matrix --------------------------------

class _Layout:
    """Where the ``E * H`` attention weights live in a block-diagonal CSR matrix of shape
    ``[N * H, N * H]``: row ``n * H + h`` holds head ``h`` of node ``n``'s incoming edges, in
    column ``u * H + h`` for source ``u``.  With features viewed as ``[N * H, D]`` (a free view
    of ``[N, H, D]``) every head is then served by one sparse product.  Entries are ordered by
    row, so each softmax group is a contiguous segment ``crow[r]:crow[r + 1]``."""

    def __init__(self, graph, heads: int):
        e, rows = graph.num_edges, graph.num_nodes * heads
        ptr, src, eid = (t.long() for t in (graph.csr_in.ptr, graph.csr_in.col, graph.csr_in.eid))
        node = rows_of_entries(ptr, e)
        h = torch.arange(heads)
        # entry (CSR position p, head h) sorts to row node[p] * H + h, p ascending inside it
        row_of = (node[:, None] * heads + h).reshape(-1)
        order = stable_argsort(row_of)
        pos, head = order // heads, order % heads
        self.rows = rows
        self.row = row_of.index_select(0, order)
        self.col = src.index_select(0, pos) * heads + head
        self.crow = ptr_of(self.row, rows)
        # dropout hashes canonical (edge, head) pairs: where each entry reads the [E, H] mask
        self.keep_index = eid.index_select(0, pos) * heads + head
        # the transpose (rows by source), for gradients flowing back to the source side
        self.t_order = stable_argsort(self.col)
        self.t_crow = ptr_of(self.col, rows)
        self.t_col = self.row.index_select(0, self.t_order)

    def matrix(self, values: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        if transpose:
            values = values.index_select(0, self.t_order)
            crow, col = self.t_crow, self.t_col
        else:
            crow, col = self.crow, self.col
        return torch.sparse_csr_tensor(crow, col, values, (self.rows, self.rows),
                                       check_invariants=False)

    def segment_sum(self, x: torch.Tensor) -> torch.Tensor:
        return torch.segment_reduce(x, "sum", offsets=self.crow)


def _layout(graph, heads: int) -> _Layout:
    # Kept on the (immutable) graph, like its self-loop twin: built once per head count.
    return graph.derived(("csr_attention", heads), lambda: _new_layout(graph, heads))


def _new_layout(graph, heads: int) -> _Layout:
    with warnings.catch_warnings():
        # torch warns once per process that sparse CSR is "beta"; it is not news to a user
        warnings.simplefilter("ignore", UserWarning)
        layout = _Layout(graph, heads)
        layout.matrix(torch.zeros(layout.col.numel()))
    return layout


def _sddmm(layout: _Layout, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``alpha * <a[row], b[col]>`` for every entry, ``a`` and ``b`` ``[N, H, D]``."""
    rows, a, b = layout.rows, a.reshape(layout.rows, -1), b.reshape(layout.rows, -1)
    if layout.col.numel() > rows * rows:
        # torch's sampled_addmm refuses more entries than the dense matrix has (only tiny
        # multigraphs get there): gather instead
        return alpha * (a.index_select(0, layout.row) * b.index_select(0, layout.col)).sum(-1)
    pattern = layout.matrix(a.new_zeros(layout.col.numel()))
    return torch.sparse.sampled_addmm(pattern, a, b.t(),
                                      beta=0.0, alpha=alpha).values()


def _spmm(layout: _Layout, values: torch.Tensor, x: torch.Tensor, transpose: bool = False):
    """``A @ x`` (``A^T @ x`` with ``transpose``) with ``x`` ``[N, H, D]``, same shape out."""
    return (layout.matrix(values, transpose) @ x.reshape(layout.rows, -1)).view(x.shape)


class _CsrAttention(torch.autograd.Function):
    """Scores, segment softmax, dropout and aggregation; the backward reuses the forward's
    weights (no recomputation) and builds only ``E * H`` edge values."""

    @staticmethod
    def forward(ctx, layout, v, q, k, a_src, a_dst, scale, negative_slope, drop_scale):
        s = _sddmm(layout, q, k, scale) if q is not None else v.new_zeros(layout.col.numel())
        if a_src is not None:
            s = s + a_src.reshape(-1).index_select(0, layout.col)
        if a_dst is not None:
            s = s + a_dst.reshape(-1).index_select(0, layout.row)
        positive = None
        if negative_slope is not None:
            positive = s > 0
            s = torch.where(positive, s, s * negative_slope)
        # The row max only keeps exp() finite; empty rows get -inf but are never read.
        row_max = torch.segment_reduce(s, "max", offsets=layout.crow)
        p = torch.exp(s - row_max.index_select(0, layout.row))
        alpha = p / layout.segment_sum(p).index_select(0, layout.row)
        weights = alpha if drop_scale is None else alpha * drop_scale
        out = _spmm(layout, weights, v)
        ctx.layout, ctx.scale, ctx.negative_slope = layout, scale, negative_slope
        ctx.save_for_backward(v, q, k, alpha, weights, drop_scale, positive)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        v, q, k, alpha, weights, drop_scale, positive = ctx.saved_tensors
        layout, scale = ctx.layout, ctx.scale
        need = ctx.needs_input_grad
        grad_out = grad_out.contiguous()
        grad_v = _spmm(layout, weights, grad_out, transpose=True) if need[1] else None
        grad_q = grad_k = grad_a_src = grad_a_dst = None
        if any(need[2:6]):
            grad_w = _sddmm(layout, grad_out, v)
            if drop_scale is not None:
                grad_w = grad_w * drop_scale
            # softmax backward inside each row: alpha * (g - sum_row(alpha * g))
            dot = layout.segment_sum(alpha * grad_w).index_select(0, layout.row)
            grad_s = alpha * (grad_w - dot)
            if positive is not None:
                grad_s = torch.where(positive, grad_s, grad_s * ctx.negative_slope)
            if need[2]:
                grad_q = _spmm(layout, grad_s * scale, k)
            if need[3]:
                grad_k = _spmm(layout, grad_s * scale, q, transpose=True)
            if need[4]:
                grad_a_src = grad_s.new_zeros(layout.rows).index_add_(0, layout.col, grad_s)
                grad_a_src = grad_a_src.view(-1, v.shape[1])
            if need[5]:
                grad_a_dst = layout.segment_sum(grad_s).view(-1, v.shape[1])
        return None, grad_v, grad_q, grad_k, grad_a_src, grad_a_dst, None, None, None
