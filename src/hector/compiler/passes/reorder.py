"""Linear operator reordering (Hector section 3.2): use linearity to do less work.

* **weight-first products**: ``linear(linear(x, A), B) -> linear(x, A @ B)`` -- RGAT's score
  ``<x_u W_r, k>`` becomes ``<x_u, W_r k>``: a per-relation ``in x heads`` matrix instead of
  a second product per row.  Applied when it costs no more multiply-adds per row (the inner
  product is still computed when something else reads it, e.g. RGAT's message ``z_u``).
* **prior into the weight**: ``<a, x W> p -> <a, x (W p)>`` for a per-head weight and a
  per-head scalar ``p`` sliced like it (HGT's relation prior ``p_r``): the score needs no
  per-row multiply, and the attention reads its keys as the GEMM wrote them (no ``k p_r``
  copy of the keys forward or backward; ``p``'s gradient comes from the weight's).  Always
  applied when the product is read only by that score.
* **typed linear into the relation's**: ``linear(src(x A_tau + b_tau), B_r) -> linear(src(x),
  A_tau(r) B_r) + b_tau(r) B_r`` -- HGT's ``K_tau x`` then ``W_r``: one per-relation product
  of the source rows instead of a node GEMM and a second product (and their backward), with
  ``tau(r)`` the relation's source type (``ir.wsrc``; needs ``GraphStats.typed_sources``).
  Decided by a cost model over the graph's row counts (multiply-adds and elements moved).
* **keys and values across a dot-product attention** (:mod:`.reorder_attention`): the
  Transformer's ``W_k`` folded into the query side and ``W_v`` applied after the
  aggregation, so the attention gathers one input row per edge.  Decided by a cost model.
* **linear across aggregation**: ``aggregate_{(v, r)}(x_u W_r) -> (aggregate_{(v, r)} x_u) W_r``
  -- a per-relation linear commutes with a sum over rows of one relation, so RGCN multiplies
  once per unique (dst, relation) row instead of once per edge or (src, relation) row.
  Decided by a cost model over the graph's row counts.
"""
from __future__ import annotations

from collections import Counter
from typing import List, Optional

from .. import ir as N
from ..ir import CDST, CSRC, EDGE, NODE, Op, Value, WEIGHT, rewrite, toposort
from .common import Cheaper, Decision, GraphStats, bias_split
from .compact import lift
from . import reorder_attention

NAME = "reorder"


def _flat(v: Value) -> int:
    return v.heads * v.dim


def _dense(w: Value) -> bool:
    return w.kind == WEIGHT and len(w.shape) == 2 and w.op != Op.WT


def _src_compactable(v: Value) -> bool:
    """Does edge value ``v`` depend only on (src, relation)?  (Then compaction would run its
    linear on compact rows, which the cost of *not* reordering must account for.)"""
    return lift(v, "src") is not None


MACS_PER_ELEMENT = reorder_attention.MACS_PER_ELEMENT    # (the unit every rule costs in)


def _typed_input(g: Value):
    """``(x, A, b, chain)`` when ``g`` is ``gather_src([reshape](linear(x, A) [+ b]))`` with
    ``A`` a dense weight shared or per node type and ``b`` a bias row sliced like it
    (``chain``: the node values between ``g`` and ``x``); else None."""
    if g.op != Op.GATHER or g.attr("end") != "src" or g.attr("norm") is not None:
        return None
    y = g.args[0]
    z = y.args[0] if y.op == Op.RESHAPE else y
    split = bias_split(z)
    if split is None:
        return None
    chain = [y, z, split[0]]
    z, b = split
    if z.op != Op.LINEAR or z.kind != NODE or not _dense(z.args[1]):
        return None
    x, A = z.args
    if A.per not in (None, "node_type") or z.heads != 1:
        return None
    if b is not None and (b.per not in (None, A.per) or b.shape != (A.shape[1],)):
        return None
    return x, A, b, tuple(dict.fromkeys(chain))


def run(outputs, stats: Optional[GraphStats], enabled=True):
    """``enabled``: True, False, or ``"always"`` (the keys and values across an attention
    wherever that holds, without its cost model: :mod:`.reorder_attention`)."""
    decisions: List[Decision] = []
    if not enabled:
        return outputs, [Decision(NAME, "all rewrites", False, "disabled (reorder=False)")]
    uses = Counter(a for v in toposort(outputs) for a in v.args)

    def decide(what: str, q: Cheaper, detail: str) -> bool:
        """Put ``q`` to the graph; record the decision (``detail``: the reason)."""
        applied = q.answer(stats)
        decisions.append(Decision(NAME, what, applied, detail, q))
        return applied

    def weight_first(v: Value):
        if v.op != Op.LINEAR or v.args[0].op != Op.LINEAR:
            return None
        x, B = v.args
        if not _dense(B) or not _dense(x.args[1]):
            return None
        inner_x, A = x.args
        if A.per != B.per and None not in (A.per, B.per):
            return None
        K, M, Nn = _flat(inner_x), A.shape[1], B.shape[1]
        shared = uses[x] > 1
        old = M * Nn + (0 if shared else K * M)
        new = K * Nn
        what = f"linear(linear(x, {_wname(A)}), {_wname(B)}) -> linear(x, {_wname(A)} @ {_wname(B)})"
        if new > old:
            decisions.append(Decision(NAME, what, False, f"per-row cost {new} > {old} "
                                      f"multiply-adds (K={K}, M={M}, N={Nn})"))
            return None
        decisions.append(Decision(NAME, what, True, f"per-row cost {new} <= {old} multiply-adds"
                                  f" (K={K}, M={M}, N={Nn}){'; inner product still read elsewhere' if shared else ''}"))
        return N.linear(inner_x, N.wmul(A, B), v.attr("heads"))

    def across_aggregation(v: Value):
        if v.op != Op.SCATTER or v.args[0].op != Op.LINEAR or v.args[0].kind != EDGE:
            return None
        lin = v.args[0]
        g, W = lin.args
        if W.per == "node_type" or (W.per == "relation" and v.kind != CDST):
            return None
        what = f"{v.attr('reduce')}_{v.kind}(linear(edge, {_wname(W)})) -> linear({v.attr('reduce')}_{v.kind}(edge), {_wname(W)})"
        if stats is None:
            decisions.append(Decision(NAME, what, False, "no graph statistics to cost it"))
            return None
        K, Nn = _flat(g), _flat(lin)
        before = CSRC if _src_compactable(lin) else EDGE
        # before: the linear on `before` rows, then the aggregation of its outputs;
        # after: the aggregation of the inputs, then the linear on the aggregate's rows.
        q = Cheaper(new=((K, EDGE), (K * Nn, v.kind)), old=((K * Nn, before), (Nn, EDGE)))
        if not decide(what, q, f"{stats.rows(v.kind)} {v.kind} rows vs {stats.rows(before)} "
                      f"{'compact_src' if before == CSRC else 'edge'} rows; cost "
                      f"{q.cost(q.new, stats)} vs {q.cost(q.old, stats)}"):
            return None
        return N.linear(N.scatter(g, v.kind, v.attr("end"), v.attr("reduce")), W, lin.attr("heads"))

    def prior_into_weight(v: Value):
        if v.op != Op.MUL:
            return None
        w = [a for a in v.args if a.kind == WEIGHT]
        rest = [a for a in v.args if a.kind != WEIGHT]
        if len(w) != 1 or len(rest) != 1 or rest[0].op != Op.DOT:
            return None
        p, score = w[0], rest[0]
        for i, lin in enumerate(score.args):
            W = lin.args[1] if lin.op == Op.LINEAR else None
            if (W is None or W.kind != WEIGHT or len(W.shape) != 3 or W.op == Op.WT
                    or p.shape != (W.shape[0], 1) or p.per not in (None, W.per)
                    or uses[lin] != 1):
                continue
            decisions.append(Decision(NAME, f"dot(., linear(x, {_wname(W)})) * {_wname(p)} -> "
                                      f"dot(., linear(x, wscale({_wname(W)}, {_wname(p)})))",
                                      True, "a per-head scalar of the weight's slices folds "
                                      "into it: no per-row multiply of the keys"))
            args = list(score.args)
            args[i] = N.linear(lin.args[0], N.wscale(W, p), lin.attr("heads"))
            return N.dot(*args)
        return None

    across_attention = reorder_attention.rule(stats, uses, enabled == "always", decisions)

    def rule(v: Value):
        return (weight_first(v) or prior_into_weight(v) or across_aggregation(v)
                or across_attention(v))

    def typed_into_relation(v: Value):
        if v.op != Op.LINEAR or v.kind != EDGE:
            return None
        B = v.args[1]
        if B.kind != WEIGHT or B.per != "relation" or B.op == Op.WT or len(B.shape) not in (2, 3):
            return None
        found = _typed_input(v.args[0])
        if found is None:
            return None
        x, A, b, inner = found
        what = (f"linear(src(linear(x, {_wname(A)}){' + ' + _wname(b) if b is not None else ''}),"
                f" {_wname(B)}) -> linear(src(x), {_wname(A)} @ {_wname(B)})")
        if stats is None:
            decisions.append(Decision(NAME, what, False, "no graph statistics to cost it"))
            return None
        if A.per == "node_type" and not stats.typed_sources:
            decisions.append(Decision(NAME, what, False, "a relation of this graph leaves "
                                      "nodes of several types: no one source type per relation"))
            return None
        K, M = _flat(x), A.shape[1]
        Nout = _flat(v)
        b_macs = B.shape[0] * B.shape[1] * B.shape[2] if len(B.shape) == 3 else M * Nout
        rows = CSRC if _src_compactable(v) else EDGE
        shared = any(uses2[u] > 1 for u in inner)
        e = MACS_PER_ELEMENT
        node = () if shared else ((K * M + e * (K + M), NODE),)
        q = Cheaper(new=((K * Nout + e * (K + Nout), rows),),
                    old=node + ((b_macs + e * (M + Nout), rows),))
        if not decide(what, q, f"cost {q.cost(q.new, stats)} vs {q.cost(q.old, stats)} "
                      f"(multiply-adds + {e} x elements moved; {stats.rows(NODE)} nodes, "
                      f"{stats.rows(rows)} {rows} rows)"
                      f"{'; the node linear is still read elsewhere' if shared else ''}"):
            return None
        def per_rel(w: Value) -> Value:     # a node-type slice read per relation
            return N.wsrc(w) if w.per == "node_type" else w
        out = N.linear(N.gather(x, EDGE, "src"), N.wmul(per_rel(A), B), 1)
        if b is not None:
            out = N.binary(Op.ADD, out, N.wmul(per_rel(b), B))
        return N.reshape(out, v.heads)

    new = rewrite(outputs, rule)
    uses2 = Counter(a for v in toposort(new) for a in v.args)
    new = rewrite(new, typed_into_relation)
    if not decisions:
        decisions.append(Decision(NAME, "all rewrites", False, "no linear-of-linear or "
                                  "aggregate-of-linear pattern in the IR"))
    return new, decisions


def _wname(w: Value) -> str:
    if w.op == Op.PARAM:
        return w.attr("name")
    return f"{w.op}({', '.join(_wname(a) for a in w.args)})"
