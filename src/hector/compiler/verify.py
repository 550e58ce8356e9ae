"""Structural checks of an IR: every value's kind and shape is what its operator infers from
its arguments.  Passes run it after each rewrite in debug mode (``HECTOR_DEBUG=1``)."""
from __future__ import annotations

import os
from typing import Sequence

from . import ir as N
from .ir import Value, toposort

_LEAVES = ("input", "param", "saved", "grad_output", "const", "arg")


def debug_enabled() -> bool:
    return os.environ.get("HECTOR_DEBUG", "0") not in ("", "0")


def _infer(v: Value) -> Value:
    a = v.args
    op = v.op
    if op == "linear":
        return N.linear(a[0], a[1], v.attr("heads"))
    if op == "gather":
        return N.gather(a[0], v.kind, v.attr("end"))
    if op == "scatter":
        return N.scatter(a[0], v.kind, v.attr("end"), v.attr("reduce"))
    if op == "edge_softmax":
        return N.edge_softmax(a[0])
    if op == "dot":
        return N.dot(*a)
    if op in N.BINARY:
        return N.binary(op, *a)
    if op == "head_mean":
        return N.head_mean(a[0])
    if op == "reshape":
        return N.reshape(a[0], v.heads)
    if op == "wmul":
        return N.wmul(*a)
    if op == "wcombine":
        return N.wcombine(*a)
    if op == "blockdiag":
        return N.blockdiag(a[0])
    if op == "wT":
        return N.wT(a[0])
    return v   # unary ops, reductions, kernels: kind/shape carried through, checked below


class IRError(ValueError):
    pass


def verify(outputs: Sequence[Value], where: str = "") -> None:
    """Raise :class:`IRError` naming the first value whose kind or shape is inconsistent."""
    for v in toposort(outputs):
        if v.op in _LEAVES:
            continue
        if v.op in N.UNARY and (v.kind != v.args[0].kind or v.shape != v.args[0].shape):
            raise IRError(f"{where}: {v.op} changes kind/shape {v.args[0].kind}{v.args[0].shape}"
                          f" -> {v.kind}{v.shape}")
        try:
            want = _infer(v)
        except ValueError as e:
            raise IRError(f"{where}: {v.op} is ill-formed: {e}") from None
        if (want.kind, want.shape) != (v.kind, v.shape):
            raise IRError(f"{where}: {v.op} has {v.kind}{list(v.shape)} but its arguments give "
                          f"{want.kind}{list(want.shape)}")
