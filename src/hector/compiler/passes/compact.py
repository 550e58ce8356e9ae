"""Compact materialization (Hector section 3.3).

An edge-wise value that depends only on its edge's (src, relation) -- say ``x_u W_r`` -- is
the same on every edge from ``u`` with relation ``r``.  Computing it once per unique
(src, relation) pair (``graph.compact_src``) and letting edges read it through
``edge_row`` saves work and memory whenever such pairs are fewer than edges.  The same holds
on the destination side with ``graph.compact_dst`` (RGAT's ``x_v W_r q``).

``lift(v, end)`` rebuilds ``v`` on compact rows when it can; the pass replaces every
edge-wise value that contains a typed linear (the work worth saving) and lifts by
``gather(lift(v), compact -> edge)``.  Bottom-up, so chains compact as a whole: the
gather of a lifted child lifts back to the child itself.

A value whose weights are all shared (none picked by relation) depends on its end node
alone -- GAT's ``z_u a_src`` on the edges out of ``u`` -- and is lifted further, onto the
node rows themselves (``at_nodes``): PyG's layers compute it there too, a homogeneous
graph's compact rows are its nodes over again, and terms on node rows let the attention
backward run as one operator (``fuse_attention.fused_backward``) instead of through its
unfused operators.
"""
from __future__ import annotations

from typing import List, Optional

from .. import ir as N
from ..ir import CDST, CSRC, EDGE, NODE, Op, Value, WEIGHT, rewrite
from .common import Cheaper, Decision, GraphStats

NAME = "compact"
_TARGET = {"src": CSRC, "dst": CDST}
_LIFTABLE = N.UNARY + (Op.RESHAPE, Op.HEAD_MEAN)


def lift(v: Value, end: str) -> Optional[Value]:
    """``v`` (edge-wise) recomputed on compact ``end`` rows, or None when it depends on more
    than (end node, relation)."""
    c = _TARGET[end]
    if v.kind == WEIGHT:
        return v
    if v.kind != EDGE:
        return None
    a = v.args
    if v.op == Op.GATHER:
        if a[0].kind == NODE and v.attr("end") == end and v.attr("norm") is None:
            return N.gather(a[0], c, end)
        return a[0] if a[0].kind == c else None
    if v.op == Op.LINEAR:
        x = lift(a[0], end)
        return None if x is None else N.linear(x, a[1], v.attr("heads"))
    if v.op in _LIFTABLE:
        x = lift(a[0], end)
        return None if x is None else Value(v.op, (x,), c, v.shape, v.attrs)
    if v.op in N.BINARY or v.op == Op.DOT:
        xs = [lift(x, end) for x in a]
        if any(x is None for x in xs):
            return None
        return N.dot(*xs) if v.op == Op.DOT else N.binary(v.op, *xs)
    return None


def at_nodes(v: Value, end: str) -> Optional[Value]:
    """``v`` (edge-wise) recomputed on node rows, or None when it depends on more than its
    ``end`` node (an edge, the other end, a weight picked per relation or node type)."""
    if v.kind == WEIGHT:
        return v if v.per is None else None
    if v.kind != EDGE:
        return None
    a = v.args
    if v.op == Op.GATHER:
        ok = a[0].kind == NODE and v.attr("end") == end and v.attr("norm") is None
        return a[0] if ok else None
    if v.op == Op.LINEAR or v.op in N.BINARY or v.op == Op.DOT or v.op in _LIFTABLE:
        xs = [at_nodes(x, end) for x in a]
        if any(x is None for x in xs):
            return None
        if v.op == Op.LINEAR:
            return N.linear(xs[0], xs[1], v.attr("heads"))
        if v.op in _LIFTABLE:
            return Value(v.op, (xs[0],), NODE, v.shape, v.attrs)
        return N.dot(*xs) if v.op == Op.DOT else N.binary(v.op, *xs)
    return None


def _has_linear(v: Value) -> bool:
    """Does ``v`` hold a typed linear, or read one already compacted (so that, say, a
    per-relation bias added to compact rows is added there too, where the GEMM's epilogue can
    take it, rather than once per edge)?"""
    if v.op == Op.LINEAR or (v.op == Op.GATHER and v.args[0].kind in (CSRC, CDST)):
        return True
    return v.kind != WEIGHT and any(_has_linear(a) for a in v.args if a.kind == EDGE)


def run(outputs, stats: Optional[GraphStats], enabled: bool = True):
    decisions: List[Decision] = []
    if not enabled:
        return outputs, [Decision(NAME, "all values", False, "disabled (compact=False)")]

    def rule(v: Value):
        if v.kind != EDGE or v.op == Op.GATHER or not _has_linear(v):
            return None
        for end in ("src", "dst"):
            node_value = at_nodes(v, end)
            if node_value is not None:
                what = f"{v.op} {list(v.shape)} on edges depends only on its {end} node"
                decisions.append(Decision(NAME, what, True, "computed once per node (no weight "
                                          "picked per relation), read per edge by the gather"))
                return N.gather(node_value, EDGE, end)
            lifted = lift(v, end)
            if lifted is None:
                continue
            what = f"{v.op} {list(v.shape)} on edges depends only on ({end}, relation)"
            if stats is None:
                decisions.append(Decision(NAME, what, False, "no graph statistics to cost it"))
                return None
            rows, E = stats.rows(_TARGET[end]), stats.num_edges
            q = Cheaper(new=((1, _TARGET[end]),), old=((1, EDGE),))
            if not q.answer(stats):
                decisions.append(Decision(NAME, what, False, f"{rows} unique ({end}, relation) "
                                          f"rows >= {E} edges: nothing to share", q))
                return None
            decisions.append(Decision(NAME, what, True, f"computed on {rows} {_TARGET[end]} rows "
                                      f"instead of {E} edges ({E / max(rows, 1):.2f}x fewer)", q))
            return N.gather(lifted, EDGE, end)
        return None

    new = rewrite(outputs, rule)
    if not decisions:
        decisions.append(Decision(NAME, "all values", False,
                                  "no edge-wise typed linear depends only on (src|dst, relation)"))
    return new, decisions
