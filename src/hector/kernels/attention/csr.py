"""The attention on the CPU as sparse-CSR products: every head's weights in one block-diagonal
CSR matrix (:class:`Layout`, kept on the graph), the q.k scores and the weights' gradient by
SDDMM, the aggregation and the row gradients by sparse-dense products, the softmax over
contiguous rows: no ``[E, H, D]`` gather or ``index_add``.  One set of steps for both users:
the op's torch path (:class:`CsrAttention`, an autograd Function keeping the weights) and
the compiler's torch backend (``compiler.attention_csr``, forward and IR backward from the
log-sum-exp)."""
from __future__ import annotations

import warnings
from typing import Callable, Dict, Optional, Tuple

import torch

from ...graph.build import ptr_of, stable_argsort
from ..ptr import rows_of_entries


class Layout:
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


def layout(graph, heads: int) -> Layout:
    """The graph's layout for ``heads`` heads, kept on the (immutable) graph."""
    return graph.derived(("csr_attention", heads), lambda: _new_layout(graph, heads))


def _new_layout(graph, heads: int) -> Layout:
    with warnings.catch_warnings():
        # torch warns once per process that sparse CSR is "beta"; it is not news to a user
        warnings.simplefilter("ignore", UserWarning)
        made = Layout(graph, heads)
        made.matrix(torch.zeros(made.col.numel()))
    return made


def sddmm(lay: Layout, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``alpha * <a[row], b[col]>`` for every entry, ``a`` and ``b`` ``[N, H, D]``."""
    rows, a, b = lay.rows, a.reshape(lay.rows, -1), b.reshape(lay.rows, -1)
    if lay.col.numel() > rows * rows:
        # torch's sampled_addmm refuses more entries than the dense matrix has (only tiny
        # multigraphs get there): gather instead
        return alpha * (a.index_select(0, lay.row) * b.index_select(0, lay.col)).sum(-1)
    pattern = lay.matrix(a.new_zeros(lay.col.numel()))
    return torch.sparse.sampled_addmm(pattern, a, b.t(), beta=0.0, alpha=alpha).values()


def spmm(lay: Layout, values: torch.Tensor, x: torch.Tensor, transpose: bool = False):
    """``A @ x`` (``A^T @ x`` with ``transpose``) with ``x`` ``[N, H, D]``, same shape out."""
    return (lay.matrix(values, transpose) @ x.reshape(lay.rows, -1)).view(x.shape)


def scores(lay: Layout, q, k, a_src, a_dst, scale: float, slope: Optional[float],
           dtype: torch.dtype = torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per entry, the activated score and the score before the leaky ReLU (the terms given:
    ``scale <q_dst, k_src>``, ``a_src`` by source row, ``a_dst`` by destination row; none:
    zeros of ``dtype``)."""
    s = sddmm(lay, q, k, scale) if q is not None else None
    for term, at in ((a_src, lay.col), (a_dst, lay.row)):
        if term is not None:
            t = term.reshape(-1).index_select(0, at)
            s = t if s is None else s + t
    if s is None:
        s = torch.zeros(lay.col.numel(), dtype=dtype)
    return (s if slope is None else torch.where(s > 0, s, s * slope)), s


def softmax(lay: Layout, t: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The weights of each row's softmax and the rows' log-sum-exp (0 where a row has no
    entries)."""
    top = torch.segment_reduce(t, "max", offsets=lay.crow)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)     # (rows without edges)
    p = torch.exp(t - top.index_select(0, lay.row))
    total = lay.segment_sum(p)
    lse = top + torch.log(torch.where(total > 0, total, torch.ones_like(total)))
    return p / total.index_select(0, lay.row), lse


def score_grad(lay: Layout, alpha: torch.Tensor, d_alpha: torch.Tensor, s: torch.Tensor,
               slope: Optional[float]) -> torch.Tensor:
    """The gradient of the scores before the activation, given the weights' gradient: the
    softmax backward inside each row, ``alpha (d_alpha - sum_row(alpha d_alpha))`` (E*H
    products rather than N*H*D), then the leaky ReLU's."""
    delta = lay.segment_sum(alpha * d_alpha).index_select(0, lay.row)
    ds = alpha * (d_alpha - delta)
    return ds if slope is None else torch.where(s > 0, ds, ds * slope)


def role_grads(lay: Layout, needs, ds: torch.Tensor, weights: torch.Tensor,
               grad_out: torch.Tensor, q, k, scale: float) -> Dict[str, torch.Tensor]:
    """Role -> gradient on the role's rows, ``[N, H, D]`` or ``[N * H]`` (score terms), for
    the roles in ``needs``: ``weights`` the applied weights (dropout included)."""
    made: Dict[str, Callable[[], torch.Tensor]] = {
        "v": lambda: spmm(lay, weights, grad_out, transpose=True),
        "a_src": lambda: ds.new_zeros(lay.rows).index_add_(0, lay.col, ds),
        "a_dst": lambda: lay.segment_sum(ds),
        "q": lambda: spmm(lay, ds * scale, k),
        "k": lambda: spmm(lay, ds * scale, q, transpose=True),
    }
    return {role: made[role]() for role in needs}


class CsrAttention(torch.autograd.Function):
    """Scores, segment softmax, dropout and aggregation; the backward reuses the forward's
    weights (no recomputation) and builds only ``E * H`` edge values."""

    @staticmethod
    def forward(ctx, lay, v, q, k, a_src, a_dst, scale, negative_slope, drop_scale):
        t, s = scores(lay, q, k, a_src, a_dst, scale, negative_slope, v.dtype)
        alpha, _ = softmax(lay, t)
        weights = alpha if drop_scale is None else alpha * drop_scale
        ctx.layout, ctx.scale, ctx.negative_slope = lay, scale, negative_slope
        ctx.save_for_backward(v, q, k, alpha, weights, drop_scale, s)
        return spmm(lay, weights, v)

    @staticmethod
    def backward(ctx, grad_out):
        v, q, k, alpha, weights, drop_scale, s = ctx.saved_tensors
        lay = ctx.layout
        need = ctx.needs_input_grad
        grad_out = grad_out.contiguous()
        names = [r for r, n in zip(("v", "q", "k", "a_src", "a_dst"), need[1:6]) if n]
        ds = None
        if any(r != "v" for r in names):
            d_alpha = sddmm(lay, grad_out, v)
            if drop_scale is not None:
                d_alpha = d_alpha * drop_scale
            ds = score_grad(lay, alpha, d_alpha, s, ctx.negative_slope)
        got = role_grads(lay, names, ds, weights, grad_out, q, k, ctx.scale)
        heads = v.shape[1]
        for r in ("a_src", "a_dst"):
            if r in got:
                got[r] = got[r].view(-1, heads)
        return (None, got.get("v"), got.get("q"), got.get("k"), got.get("a_src"),
                got.get("a_dst"), None, None, None)
