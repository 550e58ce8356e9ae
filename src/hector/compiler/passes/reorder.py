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
* **linear across aggregation**: ``aggregate_{(v, r)}(x_u W_r) -> (aggregate_{(v, r)} x_u) W_r``
  -- a per-relation linear commutes with a sum over rows of one relation, so RGCN multiplies
  once per unique (dst, relation) row instead of once per edge or (src, relation) row.
  Decided by a cost model over the graph's row counts.
"""
from __future__ import annotations

from collections import Counter
from typing import List, Optional

from .. import ir as N
from ..ir import CDST, CSRC, EDGE, Op, Value, WEIGHT, rewrite, toposort
from .common import Cheaper, Decision, GraphStats
from .compact import lift

NAME = "reorder"


def _flat(v: Value) -> int:
    return v.heads * v.dim


def _dense(w: Value) -> bool:
    return w.kind == WEIGHT and len(w.shape) == 2 and w.op != Op.WT


def _src_compactable(v: Value) -> bool:
    """Does edge value ``v`` depend only on (src, relation)?  (Then compaction would run its
    linear on compact rows, which the cost of *not* reordering must account for.)"""
    return lift(v, "src") is not None


def run(outputs, stats: Optional[GraphStats], enabled: bool = True):
    decisions: List[Decision] = []
    if not enabled:
        return outputs, [Decision(NAME, "all rewrites", False, "disabled (reorder=False)")]
    uses = Counter(a for v in toposort(outputs) for a in v.args)

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
        applied = q.answer(stats)
        detail = (f"{stats.rows(v.kind)} {v.kind} rows vs {stats.rows(before)} "
                  f"{'compact_src' if before == CSRC else 'edge'} rows; cost "
                  f"{q.cost(q.new, stats)} vs {q.cost(q.old, stats)}")
        decisions.append(Decision(NAME, what, applied, detail, q))
        if not applied:
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

    def rule(v: Value):
        return weight_first(v) or prior_into_weight(v) or across_aggregation(v)

    new = rewrite(outputs, rule)
    if not decisions:
        decisions.append(Decision(NAME, "all rewrites", False, "no linear-of-linear or "
                                  "aggregate-of-linear pattern in the IR"))
    return new, decisions


def _wname(w: Value) -> str:
    if w.op == Op.PARAM:
        return w.attr("name")
    return f"{w.op}({', '.join(_wname(a) for a in w.args)})"
