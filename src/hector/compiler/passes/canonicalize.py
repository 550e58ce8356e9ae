"""Canonicalization: one spelling per computation, so the patterns of later passes match.

* constant scales move outward and merge: ``mul(scale(a, c), b) -> scale(mul(a, b), c)``,
  ``dot(scale(a, c), b) -> scale(dot(a, b), c)``, ``scale(scale(a, c), d) -> scale(a, c*d)``;
* ``neg(neg(a)) -> a``; reshapes to the same shape vanish, chains of reshapes collapse.
"""
from __future__ import annotations

from .. import ir as N
from ..ir import Op, Value, rewrite
from .common import Decision

NAME = "canonicalize"


def _scale(x: Value, c: float) -> Value:
    return N.unary(Op.SCALE, x, factor=c)


def _rule(v: Value):
    a = v.args
    if v.op == Op.SCALE and a[0].op == Op.SCALE:
        c = a[0].attr("factor") * v.attr("factor")
        return a[0].args[0] if c == 1.0 else _scale(a[0].args[0], c)
    if v.op == Op.SCALE and v.attr("factor") == 1.0:
        return a[0]
    if v.op == Op.NEG and a[0].op == Op.NEG:
        return a[0].args[0]
    if v.op == Op.RESHAPE:
        inner = a[0].args[0] if a[0].op == Op.RESHAPE else a[0]
        return inner if inner.shape == v.shape else (
            N.reshape(inner, v.heads) if inner is not a[0] else None)
    if v.op in (Op.MUL, Op.DOT) and v.kind != N.WEIGHT:
        for i in (0, 1):
            if a[i].op == Op.SCALE:
                rest = (a[i].args[0], a[1 - i]) if i == 0 else (a[0], a[1].args[0])
                inner = N.binary(Op.MUL, *rest) if v.op == Op.MUL else N.dot(*rest)
                return _scale(_rule(inner) or inner, a[i].attr("factor"))
    return None


def run(outputs, stats, enabled=True):
    decisions = []

    def logged(v: Value):
        out = _rule(v)
        if out is not None:
            decisions.append(Decision(NAME, f"{v.op}({', '.join(a.op for a in v.args)})", True,
                                      f"rewritten to {out.op} (canonical form)"))
        return out
    new = rewrite(outputs, logged)
    if not decisions:
        decisions.append(Decision(NAME, "all values", False, "already canonical"))
    return new, decisions
