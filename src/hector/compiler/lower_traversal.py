"""Lowering of ``traversal`` steps: a traversal body -> its ``TraversalSpec``
(:func:`traversal_spec`), with the form of kernel that runs it: a sum of moved inputs for the
``traversal_csr`` kernel (:func:`linear_traversal`), an edge softmax
(:func:`edge_softmax_form`), or else a generated ``edgewise`` program
(:func:`edgewise_lowering`, built by :class:`_EdgewiseBuilder`).

Separate from :mod:`.lower` (which dispatches to it) because these are the traversal
templates' own rules; :mod:`.lower_gemm` reads a CSR prologue or epilogue through
:func:`linear_traversal`, and fusion and the Triton steps import from here too.
"""
from __future__ import annotations

import math
from typing import Tuple

from ..kernels.edgewise.spec import EdgewiseSpec, node
from ..kernels.traversal.spec import MAX_ADDENDS
from .ir import CDST, CSRC, EDGE, NODE, Op, Value, WEIGHT, toposort
from .plan import EdgewiseLowering, LinearTraversal, TraversalSpec


def _describe(v: Value, names) -> str:
    attrs = ", ".join(f"{k}={x}" for k, x in v.attrs if k not in ("per", "body", "index")
                      and x is not None)
    args = ", ".join(names[a] for a in v.args)
    return f"{names[v]} = {v.op}({args}{', ' if args and attrs else ''}{attrs})"


def traversal_spec(body: Value) -> TraversalSpec:
    if body.op in (Op.RESHAPE, Op.COLS) and body.args[0].op == Op.ARG:
        # A reshape of a whole input, or a window of its columns: a view, which the torch
        # backend's reshape / slice gives; an edgewise kernel would copy every row (HGT's
        # dq: 1.9M x 64 on mag).
        names = {body: "t1", body.args[0]: f"in0[{body.kind}]"}
        return TraversalSpec(space=body.kind, statements=(_describe(body, names),),
                             reductions=(), schedule="view")
    names, statements, reductions = {}, [], []
    for i, b in enumerate(toposort([body])):
        if b.op == Op.ARG:
            names[b] = f"in{b.attr('index')}[{b.kind}]"
            continue
        names[b] = f"t{i}"
        line = _describe(b, names)
        statements.append(line)
        if b.op == Op.SCATTER:
            reductions.append(line)
    space = _space(body)
    linear, declined = linear_traversal(body)
    softmax = edge_softmax_form(body)
    edgewise = None
    if linear is None and softmax is None:
        edgewise, why = edgewise_lowering(body)
        if edgewise is None:
            declined = f"{declined}; edgewise: {why}"
    if linear is not None or softmax is not None:   # one program per output row (CSR walk)
        sched = "node-parallel"
        declined = ""
    elif edgewise is not None:
        sched = "edge-parallel" if edgewise.program.form == "map" and space == EDGE else \
            "row-parallel" if edgewise.program.form == "map" else "node-parallel"
        declined = ""
    else:
        sched = "node-parallel" if body.op == Op.SCATTER and body.kind in (NODE, CDST, CSRC) \
            else "edge-parallel" if space == EDGE else "row-parallel"
    return TraversalSpec(space=space, statements=tuple(statements),
                         reductions=tuple(reductions), schedule=sched, linear=linear,
                         declined=declined, softmax=softmax, edgewise=edgewise)


def edge_softmax_form(body: Value):
    """(input index, leaky slope or None) when ``body`` is ``edge_softmax`` of an edge input,
    optionally through ``leaky_relu`` (the ``edge_softmax`` kernel's form); else None."""
    if body.op != Op.EDGE_SOFTMAX:
        return None
    x, slope = body.args[0], None
    if x.op == Op.LEAKY_RELU:
        x, slope = x.args[0], float(x.attr("slope"))
    return (x.attr("index"), slope) if x.op == Op.ARG and x.kind == EDGE else None


class _Decline(Exception):
    """A traversal body the ``traversal_csr`` kernel cannot run (the message says why)."""


def linear_traversal(body: Value) -> Tuple[object, str]:
    """(:class:`LinearTraversal`, "") when ``body`` is a sum of moved inputs (chains of
    gathers, scatters with sum/mean, scales), unmoved inputs shaped like the output and at
    most one bias vector; else (None, the reason)."""
    try:
        terms, biases = _terms(body)
        sources = [(a, tuple(ms), c) for a, ms, c in terms if ms]
        addends = [(a, c) for a, ms, c in terms if not ms]
        if not sources:
            raise _Decline("no gather or scatter to run")
        width = math.prod(body.shape)   # rows are read flat: a reshape costs nothing
        for a, _, _ in sources:
            if math.prod(a.shape) != width:
                raise _Decline(f"moved input shape {a.shape} differs from the output's "
                               f"{body.shape}")
        for a, _ in addends:
            if a.kind != body.kind or math.prod(a.shape) != width:
                raise _Decline(f"addend {a.kind}{a.shape} is not shaped like the output "
                               f"{body.kind}{body.shape}")
        if len(addends) > MAX_ADDENDS:
            raise _Decline(f"more than {MAX_ADDENDS} addends")
        if len(biases) > 1 or any(c != 1.0 for _, c in biases):
            raise _Decline("more than one weight vector added, or one scaled")
        return LinearTraversal(
            sources=tuple((a.attr("index"), ms, c) for a, ms, c in sources),
            addends=tuple((a.attr("index"), c) for a, c in addends),
            bias=biases[0][0].attr("index") if biases else None), ""
    except _Decline as why:
        return None, str(why)


def _terms(v: Value):
    """``v`` as ([(arg, movements innermost first, coef)], [(weight arg, coef)]): movements
    distribute over sums (``scatter(a + b) = scatter(a) + scatter(b)``)."""
    if v.op == Op.ARG:
        if v.kind != WEIGHT:
            return [(v, [], 1.0)], []
        if v.per is not None:
            raise _Decline(f"a per-{v.per} weight vector is read per row")
        return [], [(v, 1.0)]
    if v.op in (Op.GATHER, Op.SCATTER):
        if v.op == Op.SCATTER and v.attr("reduce") not in ("sum", "mean"):
            raise _Decline(f"scatter reduce {v.attr('reduce')!r}")
        terms, biases = _terms(v.args[0])
        if biases:
            raise _Decline("a weight is moved")
        move = (("gather", v.args[0].kind, v.kind, v.attr("end"), v.attr("norm"))
                if v.op == Op.GATHER else
                ("scatter", v.kind, v.args[0].kind, v.attr("end"), v.attr("reduce")))
        return [(a, ms + [move], c) for a, ms, c in terms], []
    if v.op == Op.RESHAPE:   # same row, other (heads, features) split
        return _terms(v.args[0])
    if v.op in (Op.SCALE, Op.NEG):
        f = -1.0 if v.op == Op.NEG else float(v.attr("factor"))
        terms, biases = _terms(v.args[0])
        return [(a, ms, c * f) for a, ms, c in terms], [(a, c * f) for a, c in biases]
    if v.op in (Op.ADD, Op.SUB):
        (tx, bx), (ty, by) = _terms(v.args[0]), _terms(v.args[1])
        sign = -1.0 if v.op == Op.SUB else 1.0
        return (tx + [(a, ms, sign * c) for a, ms, c in ty],
                bx + [(a, sign * c) for a, c in by])
    raise _Decline(f"statement {v.op!r} is not a movement, a scale or an addition")


def _space(body: Value) -> str:
    """The largest row kind a traversal touches: it iterates over that."""
    order = {EDGE: 3, CSRC: 2, CDST: 2, NODE: 1, WEIGHT: 0}
    kinds = [b.kind for b in toposort([body]) if b.op != Op.ARG or True]
    return max(kinds, key=lambda k: order.get(k, 0))


_EW_OPS = {Op.NEG: "neg", Op.EXP: "exp", Op.SIGMOID: "sigmoid", Op.TANH: "tanh", Op.GELU: "gelu",
           Op.RELU: "relu", Op.LEAKY_RELU: "leaky_relu", Op.SCALE: "scale",
           Op.LEAKY_RELU_GRAD: "leaky_relu_grad", Op.GELU_GRAD: "gelu_grad", Op.ADD: "add",
           Op.SUB: "sub", Op.MUL: "mul"}


class _EdgewiseBuilder:
    """IR body -> an ``edgewise`` program: each ``arg`` becomes a load through the access
    scheme its gathers spell (node row by src/dst, compact row through the compact map), a
    weight operand a per-slice load picked by the row's relation or node type, a scatter a
    node-parallel loop over the CSR grouping its rows.  Reshapes are views of the loaded row
    (rows are flat), pushed down to the loads through elementwise ops."""

    def __init__(self):
        self.inputs, self.arrays, self.memo = [], [], {}

    def slot(self, items: list, key) -> int:
        if key not in items:
            items.append(key)
        return items.index(key)

    def index(self, rows, key):
        return node("index", rows, array=self.slot(self.arrays, key))

    def build(self, v: Value, rows, kind: str, view=None, in_loop=False):
        key = (v, rows, view)
        if key not in self.memo:
            self.memo[key] = self._build(v, rows, kind, view, in_loop)
        return self.memo[key]

    def _build(self, v: Value, rows, kind: str, view, in_loop):
        shape = tuple(view or v.shape)
        if v.op == Op.ARG and v.kind == WEIGHT:
            wshape = tuple(v.shape) if len(v.shape) == 2 else (1, v.shape[0])
            size = math.prod(v.shape)
            if len(v.shape) > 2 or view is not None and size not in (1, math.prod(view)):
                raise _Decline(f"a weight operand of shape {v.shape} read per row")
            if view is not None:   # a whole row (read through the view) or a scalar
                wshape = tuple(view) if size > 1 else (1, 1)
            if v.per == "relation" and kind in (EDGE, CSRC, CDST):
                sel = self.index(rows, ("relation", kind))
            elif v.per == "node_type" and kind == NODE:
                sel = self.index(rows, ("node_type",))
            elif v.per is None:
                sel = node("zero")
            else:
                raise _Decline(f"a per-{v.per} weight read on {kind} rows")
            return node("weight", sel, shape=wshape, input=self.slot(self.inputs, v.attr("index")))
        if v.kind != kind:
            raise _Decline(f"{v.op} on {v.kind} rows read as {kind} rows")
        if v.op == Op.ARG:
            return node("load", rows, shape=shape, input=self.slot(self.inputs, v.attr("index")))
        if v.op == Op.GATHER:
            one, end = v.args[0].kind, v.attr("end")
            inner = self.index(rows, ("move", one, kind, end))
            x = self.build(v.args[0], inner, one, view, in_loop)
            if v.attr("norm") == "mean":
                count = node("load", inner, shape=(1, 1),
                             input=self.slot(self.inputs, ("counts", one, kind, end)))
                x = node("div", x, count, shape=x.shape)
            return x
        if v.op == Op.SCATTER:
            if in_loop or rows != node("own"):
                raise _Decline("a scatter inside another reduction or under a gather")
            if v.attr("reduce") not in ("sum", "mean"):
                raise _Decline(f"scatter reduce {v.attr('reduce')!r}")
            many, end = v.args[0].kind, v.attr("end")
            x = self.build(v.args[0], node("entry"), many, view, True)
            return node("scatter", x, shape=shape, mean=v.attr("reduce") == "mean",
                        ptr=self.slot(self.arrays, ("csr_ptr", kind, many, end)),
                        perm=self.slot(self.arrays, ("csr_perm", kind, many, end)))
        if v.op == Op.RESHAPE:
            return self.build(v.args[0], rows, kind, view or v.shape, in_loop)
        if v.op in _EW_OPS:
            args = v.args
            if view is not None and view != v.shape and any(a.shape != v.shape for a in args
                                                             if a.kind != WEIGHT):
                raise _Decline(f"a reshape over a broadcasting {v.op}")
            attrs = {k: x for k, x in v.attrs if k in ("slope", "factor")}
            return node(_EW_OPS[v.op], *(self.build(a, rows, kind, view, in_loop) for a in args),
                        shape=shape, **attrs)
        if v.op in (Op.DOT, Op.REDUCE_TO, Op.EXPAND):
            if view is not None and view != v.shape:
                raise _Decline(f"a reshape over {v.op}")
            return node(v.op, *(self.build(a, rows, kind, None, in_loop) for a in v.args),
                        shape=shape)
        raise _Decline(f"statement {v.op!r} has no edgewise rule")


def edgewise_lowering(body: Value) -> Tuple[object, str]:
    """(:class:`EdgewiseLowering`, "") when the ``edgewise`` kernel runs ``body``: a map over
    the body's rows, a node-parallel reduction when it scatters, or the softmax of an edge
    score over each destination's edges; else (None, the reason)."""
    b = _EdgewiseBuilder()
    try:
        if body.op == Op.EDGE_SOFTMAX:
            if body.kind != EDGE:
                raise _Decline("a softmax over rows that are not edges")
            score = b.build(body.args[0], node("entry"), EDGE, None, True)
            root = node("softmax", score, shape=body.shape,
                        ptr=b.slot(b.arrays, ("csr_ptr", NODE, EDGE, "dst")),
                        perm=b.slot(b.arrays, ("csr_perm", NODE, EDGE, "dst")))
            form = "softmax"
        else:
            root = b.build(body, node("own"), body.kind)
            form = "reduce" if any(x.op == Op.SCATTER for x in toposort([body])) else "map"
        if not b.inputs:
            raise _Decline("no row read")
        program = EdgewiseSpec(form, root, len(b.inputs), len(b.arrays))
    except (_Decline, ValueError) as why:
        return None, str(why)
    return EdgewiseLowering(program, tuple(b.inputs), tuple(b.arrays), body.kind), ""
