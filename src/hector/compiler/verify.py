"""Structural checks of an IR: every value's kind and shape is what its operator infers from
its arguments.  Passes run it after each rewrite in debug mode (``HECTOR_DEBUG=1``)."""
from __future__ import annotations

from typing import Sequence

from . import ir as N
from .ir import LEAVES, Op, Value, toposort


def _infer(v: Value) -> Value:
    a = v.args
    op = v.op
    if op == Op.LINEAR:
        return N.linear(a[0], a[1], v.attr("heads"))
    if op == Op.GATHER:
        return N.gather(a[0], v.kind, v.attr("end"))
    if op == Op.SCATTER:
        return N.scatter(a[0], v.kind, v.attr("end"), v.attr("reduce"))
    if op == Op.EDGE_SOFTMAX:
        return N.edge_softmax(a[0])
    if op == Op.DOT:
        return N.dot(*a)
    if op in N.BINARY:
        return N.binary(op, *a)
    if op == Op.HEAD_MEAN:
        return N.head_mean(a[0])
    if op == Op.NORMALIZE:
        return N.normalize(a[0])
    if op == Op.NORMALIZE_GRAD:
        return N.normalize_grad(*a)
    if op == Op.RESHAPE:
        return N.reshape(a[0], v.heads)
    if op == Op.WMUL:
        return N.wmul(*a)
    if op == Op.WSCALE:
        return N.wscale(*a)
    if op == Op.WSRC:
        return N.wsrc(a[0])
    if op == Op.WCOMBINE:
        return N.wcombine(*a)
    if op == Op.BLOCKDIAG:
        return N.blockdiag(a[0])
    if op == Op.WT:
        return N.wT(a[0])
    if op == Op.WCAT:
        return N.wcat(a, bool(v.attr("rows")))
    if op == Op.WHEADS:
        return N.wheads(a)
    if op == Op.WBLOCKS:
        return N.wblocks(a)
    if op == Op.WCOLS:
        return N.wcols(a[0], v.attr("start"), v.shape[-1])
    if op == Op.COLS:
        return N.cols(a[0], v.attr("start"), v.shape)
    if op == Op.PLACE:
        return N.place(a, v.attr("starts"), v.shape)
    return v   # unary ops, reductions, kernels: kind/shape carried through, checked below


class IRError(ValueError):
    pass


def verify(outputs: Sequence[Value], where: str = "") -> None:
    """Raise :class:`IRError` naming the first value whose kind or shape is inconsistent."""
    for v in toposort(outputs):
        if v.op in LEAVES:
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
