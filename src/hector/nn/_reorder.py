r"""Linear operator reordering for dot-product attention (Hector section 3.2, applied to
``TransformerConv``): move the key and value projections across the attention, so the
attention gathers each source node's input row once instead of its key and value rows.

For one head, with :math:`k_j = W_k x_j + b_k` and :math:`v_j = W_v x_j + b_v`:

.. math::
    \langle q_i, k_j\rangle = \langle W_k^\top q_i, x_j\rangle + \langle q_i, b_k\rangle,
    \qquad \sum_j \alpha_{ij} v_j = W_v \Big(\sum_j \alpha_{ij} x_j\Big) + b_v [i \text{ has edges}]

The term :math:`\langle q_i, b_k\rangle` is the same for every edge of row :math:`i`, so the
softmax cancels it; the weights :math:`\alpha_{ij}` sum to 1 over a row with edges (no
attention dropout), so :math:`b_v` is added once per such row.  The layer then computes

* ``q' = x (W_q^T W_k) + b_q W_k`` (``[N, F]``, with the skip projection in the same product),
* ``a = attention(q', x, x)`` (the attention reads ``x`` as both key and value), and
* ``out = a W_v^T + b_v + skip``,

three node products of ``F x F``, ``F x C`` and ``F x C`` multiply-adds per row where the
layer as written runs four of ``F x C`` (query, key, value, skip), and each edge gathers ``F``
elements instead of ``2 C``.  With ``H`` heads each head does the same with its own weights:
``q'`` is ``[N, H, F]``, the attention reads one row of ``x`` per node as the key and value
of every head (head stride 0: the kernels' ``AttentionSpec.shared_kv``), and ``W_v[h]``
applies per head (one batched product; with the heads averaged, one product of the stacked
weights): ``H F (F + C)`` multiply-adds per row instead of ``3 H C F``.  Per edge each head's
program gathers the whole ``F``-wide row and scores and aggregates over it: ``H F`` elements
and ``2 H F`` multiply-adds instead of ``2 H C`` and ``2 H C``.  With one head both sides
shrink exactly when ``F <= 2 C``; with the heads concatenated (``F = H C``) the edge side
grows ``H / 2``-fold, and on the H200 (64x4) the reordered layer ran at about half the
written one's speed (docs/perf-notes.md, "Attention layers", 2026-11-28).  :func:`transformer_reorder`
decides with the compiler's cost units (a moved element weighs ``MACS_PER_ELEMENT``
multiply-adds) and declines where it does not pay or does not hold.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..compiler.passes.common import Decision
from ..compiler.passes.reorder import MACS_PER_ELEMENT

NAME = "reorder"
WHAT = "key and value projections across the attention (q' = W_k^T q, aggregate x, then W_v)"
#: The fixed price of reordering, in multiply-add equivalents (~55 us at the ~18 T/s of
#: ``MACS_PER_ELEMENT``): the folded weights on every call (``W_k^T W_q``, ``W_k^T b_q``, the
#: stacked weight and bias) and the backward's products of the weights, some ten launches
#: more per training step than the layer as written, and the byte and multiply-add savings
#: that the two counts above overstate on mid-size graphs.  Calibrated on the H200 (captured,
#: 128x1): graphs under ~300k edges ran slower reordered, github-musae (578k edges) and the
#: larger ones faster; this price declines the first and takes the others (docs/perf-notes.md,
#: "Attention layers", 2026-11-28).
FIXED_MACS = 1_000_000_000


def transformer_reorder(in_channels: int, out_channels: int, heads: int, skip: int,
                        num_nodes: int, num_edges: int, dropout_active: bool,
                        setting="auto") -> Decision:
    """Whether ``TransformerConv`` reorders its projections on a graph of ``num_nodes`` rows
    and ``num_edges`` edges (``skip``: the skip projection's width, 0 without one);
    ``setting``: ``"auto"`` (the cost model), True (whenever it holds) or False."""
    def no(reason):
        return Decision(NAME, WHAT, False, reason)
    if setting is False:
        return no("reorder=False")
    if dropout_active:
        return no("attention dropout: the kept weights of a row no longer sum to 1, so b_v "
                  "cannot be added after the aggregation")
    # per row: the node products; per edge: the elements each head's program gathers and
    # its score and aggregation multiply-adds (2 per element of the head's row)
    f, hc = in_channels, heads * out_channels
    old = num_nodes * f * (3 * hc + skip) + num_edges * 2 * hc * (MACS_PER_ELEMENT + 1)
    new = (num_nodes * (f * (heads * f + skip) + f * hc)
           + num_edges * heads * f * (MACS_PER_ELEMENT + 2) + FIXED_MACS)
    cost = f"cost {new:.3g} vs {old:.3g} multiply-add equivalents"
    if setting is True:
        return Decision(NAME, WHAT, True, "reorder=True; " + cost)
    if heads > 1 and new < old:
        # Only averaged wide heads (C near F) get here.  Where several heads were timed
        # (concatenated, 64x4, on the H200) the model declines, as measured; this case has
        # not been timed, so "auto" does not take it on the model's word.
        return no(f"{cost}, but several heads are reordered only with reorder=True: the "
                  "shared-row case the model favours has not been timed on a GPU")
    if new >= old:
        return no(cost + (f" (F={f} > 2C={2 * out_channels})" if f > 2 * out_channels
                          else ""))
    return Decision(NAME, WHAT, True, cost)


class _QueryKey(torch.autograd.Function):
    """Per head ``h``: ``(W_k[h]^T W_q[h], W_k[h]^T b_q[h])`` stacked over the heads, and the
    backward as batched products of the parameters themselves: every gradient a fresh dense
    tensor that the parameter's ``.grad`` takes over (slices of a concatenation would be
    copied into each ``.grad``, four launches); ``b_k`` gets its exact gradient, zero: the
    per-row constant ``<q_i, b_k>`` is cancelled by the softmax (a gradient nevertheless, as
    DistributedDataParallel and optimizers expect of every parameter that the layer as
    written reads)."""

    @staticmethod
    def forward(ctx, w_q, b_q, w_k, b_k, heads):
        ctx.save_for_backward(w_q, b_q, w_k, b_k)
        ctx.heads = heads
        wq, wk = (w.view(heads, -1, w.shape[1]) for w in (w_q, w_k))       # [H, C, F]
        f = w_q.shape[1]
        weight = torch.bmm(wk.transpose(1, 2), wq).view(heads * f, f)
        bias = None if b_q is None else torch.bmm(
            wk.transpose(1, 2), b_q.view(heads, -1, 1)).view(heads * f)
        return weight, bias

    @staticmethod
    def backward(ctx, d_w, d_b):
        w_q, b_q, w_k, b_k = ctx.saved_tensors
        need_wq, need_bq, need_wk, need_bk, _ = ctx.needs_input_grad
        h, f = ctx.heads, w_q.shape[1]
        wq, wk = (w.view(h, -1, f) for w in (w_q, w_k))
        if d_w is None:
            d_w = w_q.new_zeros(h * f, f)
        dw = d_w.view(h, f, f)
        g_wq = torch.bmm(wk, dw).view(w_q.shape) if need_wq else None
        g_bq = None
        if need_bq:
            g_bq = (torch.zeros_like(b_q) if d_b is None else
                    torch.bmm(wk, d_b.view(h, f, 1)).view(b_q.shape))
        g_wk = None
        if need_wk:
            g_wk = torch.bmm(wq, dw.transpose(1, 2))
            if b_q is not None and d_b is not None:
                g_wk = g_wk.baddbmm_(b_q.view(h, -1, 1), d_b.view(h, 1, f))
            g_wk = g_wk.view(w_k.shape)
        g_bk = torch.zeros_like(b_k) if need_bk else None
        return g_wq, g_bq, g_wk, g_bk, None


def query_key(w_q: torch.Tensor, b_q: Optional[torch.Tensor], w_k: torch.Tensor,
              b_k: Optional[torch.Tensor], heads: int = 1
              ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The folded query-key projection as ``F.linear`` takes it: ``(weight [H*F, F], bias
    [H*F] or None)`` whose head ``h`` block is ``W_k[h]^T W_q[h]`` and ``W_k[h]^T b_q[h]``,
    for ``nn.Linear`` weights ``[H*C, F]`` (:class:`_QueryKey`: two launches forward, five
    backward)."""
    return _QueryKey.apply(w_q, b_q, w_k, b_k, heads)


def has_edges(graph, dtype: torch.dtype) -> torch.Tensor:
    """``[N, 1]``: 1 where a node has incoming edges, else 0 (made once per graph; under
    ``torch.compile`` made in the compiled code instead, since a tensor that a compiled
    region made, kept on the graph, may live in a CUDA-graph pool that later replays
    overwrite)."""
    def make():
        return (graph.csr_in.degrees() > 0).to(dtype).unsqueeze(1)
    if torch.compiler.is_compiling():
        return make()
    return graph.derived(("has_in_edges", dtype), make)


def messages(agg: torch.Tensor, weight: torch.Tensor, addend: Optional[torch.Tensor],
             bias: Optional[torch.Tensor], mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``agg [n, K] W^T [K, C]`` plus ``addend [n, C]`` and ``bias [C]`` where given (the
    bias on the rows where ``mask [n, 1]`` is 1, as a rank-1 product whose gradient is a
    GEMV; every row when ``mask`` is None).  Plain aten ops: an ``autograd.Function``
    doing the same (one saved copy of a stride-0 output gradient fewer) lost every
    gradient under ``torch.compile`` on CUDA (inductor, both modes).

    The product is a plain ``mm`` and the addend is added after it, in place: cuBLAS's
    ``addmm`` first copies its addend into the output (a strided one elementwise, then
    reads it back with beta = 1), slower than ``mm`` and the add on the H200
    (docs/perf-notes.md, "Attention layers", 2026-11-28)."""
    return messages_added(agg @ weight.t(), addend, bias, mask)


def messages_added(out: torch.Tensor, addend: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``out`` plus ``addend`` and ``bias`` as :func:`messages` adds them (in place: ``out``
    is a fresh product that no backward reads).  The masked bias is a rank-1 ``addmm``
    where its gradient is wanted (a GEMV backward: ``addcmul``'s would be a column
    reduction) and ``addcmul_`` otherwise (one pass; the ``addmm`` copies the output
    first: 98 against 71 us on synthetic arxiv)."""
    if addend is not None:
        out = out.add_(addend)
    if bias is None:
        return out
    if mask is None:
        return out.add_(bias)
    if torch.is_grad_enabled() and bias.requires_grad:
        return torch.addmm(out, mask, bias.unsqueeze(0))
    return out.addcmul_(mask, bias)
