r"""Linear operator reordering across a dot-product attention (Hector section 3.2 applied to
the Transformer): move the key and value projections to the other side of the attention, so
that it gathers each source's input row once instead of its key and value rows.

For one head, with :math:`k_j = W_k^\top x_j + b_k` and :math:`v_j = W_v^\top x_j + b_v`
(``linear(x, W)`` is ``x W``):

.. math::
    \langle q_i, k_j\rangle = \langle W_k q_i, x_j\rangle + \langle q_i, b_k\rangle,
    \qquad \sum_j \alpha_{ij} v_j = W_v^\top \Big(\sum_j \alpha_{ij} x_j\Big)
    + b_v [i \text{ has edges}]

:math:`\langle q_i, b_k\rangle` is the same for every edge of row :math:`i`: the softmax
cancels it (``b_k`` leaves the program; the executor gives its parameter a zero gradient).
The weights :math:`\alpha_{ij}` of a row with edges sum to 1 (no attention dropout), so
:math:`b_v` is added once per row that has an incoming edge: to every row where the graph
says each has one (:class:`~hector.compiler.passes.common.EveryRowHasEdges`), else times the
graph's has-edges mask (``ir.has_edges``, a node leaf made once per graph).  With ``q = x W_q
+ b_q`` read only here the query side folds into one product, ``q' = x (W_q W_k^T) + b_q
W_k^T``:

* before: three node products of ``F x C`` (query, key, value) and, per edge, the key and
  value rows gathered (``2 C`` elements) with ``2 C`` multiply-adds;
* after: ``F x F`` and ``F x C`` per node and, per edge, one ``F``-wide row of ``x`` with
  ``2 F`` multiply-adds.

So it pays on graphs with many edges per node when ``F <= 2 C``; :func:`rule` asks the
graph (:class:`~hector.compiler.passes.common.Cheaper`) with the compiler's cost units and a
fixed price, :data:`FIXED_MACS`.  One head only: several heads would read one row of ``x`` as
every head's key and value, a head-stride-0 operand the IR does not express (and on the
H200, 64x4, the hand-written multi-head form ran at half the speed of the layer as written:
docs/perf-notes.md, "Attention layers", 2026-11-28).
"""
from __future__ import annotations

from typing import Callable, List, Optional

from .. import ir as N
from ..ir import EDGE, NODE, Op, Value
from .common import ONE, Cheaper, Decision, EveryRowHasEdges, GraphStats, bias_split

#: A row element moved through DRAM costs about the time of this many fp32 multiply-adds on
#: the H200 (a K = N = 64 segment GEMM, FMA-bound: 7.9 G multiply-adds in 0.44 ms, ~18 T/s,
#: against ~1.1 T fp32 elements/s of DRAM bandwidth); every reorder rule's unit.
MACS_PER_ELEMENT = 16
#: The fixed price of the rewrite, in multiply-add equivalents (~55 us at the ~18 T/s of
#: ``MACS_PER_ELEMENT``): the folded weights on every call, the backward's weight products
#: (some ten launches more per training step), and the savings the counts overstate on
#: mid-size graphs.  Calibrated on the H200 (captured, 128x1): graphs under ~300k edges ran
#: slower reordered, github-musae (578k edges) and larger ones faster (docs/perf-notes.md,
#: "Attention layers", 2026-11-28).
FIXED_MACS = 1_000_000_000

WHAT = "key and value projections across the attention (q' = q W_k^T, aggregate x, then W_v)"


def _affine(v: Value):
    """``(x, W, b or None, chain)`` for ``v = [reshape](linear(x, W) [+ b])`` with a dense
    weight shared by every row and one head (``chain``: ``v`` and the values between it and
    ``x``); else None."""
    chain = [v]
    if v.op == Op.RESHAPE and v.shape == v.args[0].shape:
        v = v.args[0]
        chain.append(v)
    split = bias_split(v)
    if split is None:
        return None
    v, b = split
    chain.append(v)
    if b is not None and b.per is not None:
        return None
    if v.op != Op.LINEAR or v.kind != NODE or v.heads != 1:
        return None
    x, W = v.args
    if len(W.shape) != 2 or W.per is not None or x.heads != 1:
        return None
    return x, W, b, tuple(dict.fromkeys(chain))


def _parts(v: Value):
    """The pieces of ``scatter_dst_sum([dropout](edge_softmax([scale](dot(dst(q), src(k)))))
    * src(v))``: ``(q, k, v, softmax, dropout or None, scale or None)``, else None."""
    if not (v.op == Op.SCATTER and v.kind == NODE and v.attr("end") == "dst"
            and v.attr("reduce") == "sum" and v.args[0].op == Op.MUL):
        return None
    a, m = v.args[0].args
    if m.op in (Op.EDGE_SOFTMAX, Op.DROPOUT):
        a, m = m, a
    dropped = a if a.op == Op.DROPOUT else None
    soft = a.args[0] if dropped is not None else a
    if soft.op != Op.EDGE_SOFTMAX or m.op != Op.GATHER or m.attr("end") != "src":
        return None
    s = soft.args[0]
    scale = s if s.op == Op.SCALE else None
    d = s.args[0] if scale is not None else s
    if d.op != Op.DOT:
        return None
    ends = {g.attr("end"): g.args[0] for g in d.args if g.op == Op.GATHER}
    if set(ends) != {"src", "dst"}:
        return None
    return ends["dst"], ends["src"], m.args[0], soft, dropped, scale


def rule(stats: Optional[GraphStats], uses, always: bool,
         decisions: List[Decision]) -> Callable[[Value], Optional[Value]]:
    """The rewrite for :func:`hector.compiler.ir.rewrite` (``always``: apply wherever it holds,
    without the cost model)."""
    def declined(reason: str, question=None) -> None:
        decisions.append(Decision("reorder", WHAT, False, reason, question))

    def across(v: Value) -> Optional[Value]:
        found = _parts(v)
        if found is None:
            return None
        q, k, val, soft, dropped, scale = found
        ks, vs = _affine(k), _affine(val)
        if ks is None or vs is None or ks[0] != vs[0]:
            if q.heads > 1 and k.heads > 1:
                declined(f"{q.heads} heads: one row of x as every head's key and value is a "
                         "head-stride-0 operand the IR does not express")
            return None
        x, w_k, _, k_chain = ks
        _, w_v, b_v, v_chain = vs
        if any(uses[t] != 1 for t in k_chain + v_chain):
            declined("the key or value rows are read elsewhere too")
            return None
        if dropped is not None:
            declined("attention dropout: a row's kept weights no longer sum to 1, so b_v "
                     "cannot be added after the aggregation")
            return None
        covered = stats is not None and EveryRowHasEdges().answer(stats)
        F, C = x.dim, k.dim
        folded = _affine(q) if uses[q] == 1 else None
        e = MACS_PER_ELEMENT
        old = ((3 * F * C, NODE), (2 * C * (e + 1), EDGE))
        new = ((F * (F if folded else 2 * C) + F * C, NODE), (F * (e + 2), EDGE),
               (FIXED_MACS, ONE))
        question = Cheaper(new=new, old=old)
        cost = (f"F={F}, C={C}" if stats is None else
                f"cost {question.cost(new, stats):.3g} vs {question.cost(old, stats):.3g} "
                "multiply-add equivalents")
        if always:
            reason = "reorder='always'; " + cost
        else:
            if stats is None:
                declined("no graph statistics to cost it")
                return None
            if not question.answer(stats):
                declined(cost + (f" (F={F} > 2C={2 * C})" if F > 2 * C else ""), question)
                return None
            reason = cost
        decisions.append(Decision("reorder", WHAT, True, reason,
                                  None if always else question))
        if b_v is not None:      # (a graph fact the rewritten IR rests on: asked, recorded)
            decisions.append(Decision(
                "reorder", "b_v added to every row after the aggregation", covered,
                "every node has an incoming edge" if covered else
                "a node without incoming edges keeps 0: b_v times the graph's has-edges mask",
                None if stats is None else EveryRowHasEdges()))
        w_kt = N.wT(w_k)
        if folded is not None:
            x_q, w_q, b_q, _ = folded
            q2 = N.linear(x_q, N.wmul(w_q, w_kt), 1)
            if b_q is not None:
                q2 = N.binary(Op.ADD, q2, N.wmul(b_q, w_kt))
        else:
            q2 = N.linear(q, w_kt, 1)
        score = N.dot(N.gather(q2, EDGE, "dst"), N.gather(x, EDGE, "src"))
        if scale is not None:
            score = Value(scale.op, (score,), scale.kind, scale.shape, scale.attrs)
        alpha = N.edge_softmax(score)
        agg = N.scatter(N.binary(Op.MUL, alpha, N.gather(x, EDGE, "src")), NODE, "dst", "sum")
        out = N.linear(agg, w_v, 1)
        if b_v is None:
            return out
        return N.binary(Op.ADD, out, b_v if covered else N.binary(Op.MUL, N.has_edges(), b_v))
    return across
