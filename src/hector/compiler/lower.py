"""Lowering: inter-operator IR -> :class:`~hector.compiler.plan.Plan` of kernel steps.

After fusion the IR's non-leaf values are ``kernel`` nodes, each becoming one step.  Without
fusion every operator is wrapped as a kernel of its own (the unfused baseline the passes are
measured against).  Each step gets the spec of its template: a ``GemmSpec`` with the row
segmentation for a typed linear, an ``AttentionSpec`` for a fused attention, a
``TraversalSpec`` listing the fused statements for everything else.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from ..kernels.attention.spec import AttentionSpec
from ..kernels.segment_mm.spec import GemmSpec
from .ir import CDST, CSRC, EDGE, LEAVES, NODE, Op, Value, WEIGHT, arg, attention_roles, kernel, toposort
from .plan import Plan, RowSegments, Step, TraversalSpec

def template_of(v: Value) -> str:
    if v.op == Op.WGRAD:   # segment-grouped outer products: the GEMM template's weight gradient
        return "gemm"
    if v.kind == WEIGHT:
        return "weight"
    if v.op == Op.LINEAR:
        return "gemm"
    if v.op == Op.ATTENTION:
        return "attention"
    return "traversal"


def single_kernel(v: Value) -> Value:
    """Wrap one operator as a kernel node (what lowering does when fusion is off)."""
    body = Value(v.op, tuple(arg(i, a) for i, a in enumerate(v.args)), v.kind, v.shape, v.attrs)
    return kernel(template_of(v), body, v.args)


def lower(outputs: Sequence[Value], dtype: torch.dtype = torch.float32) -> Plan:
    steps: List[Step] = []
    leaves: List[Value] = []
    for v in toposort(outputs):
        if v.op in LEAVES:
            leaves.append(v)
            continue
        k = v if v.op == Op.KERNEL else single_kernel(v)
        template, body = k.attr("template"), k.attr("body")
        spec, note = _spec(template, body, dtype)
        steps.append(Step(name=_name(template, body), template=template, body=body,
                          inputs=v.args, output=v, spec=spec, note=note))
    return Plan(tuple(steps), tuple(outputs), tuple(leaves))


def _name(template: str, body: Value) -> str:
    ops = [b.op for b in toposort([body]) if b.op != Op.ARG]
    return f"{template}_{body.kind}_" + "_".join(dict.fromkeys(ops))


def _spec(template: str, body: Value, dtype: torch.dtype) -> Tuple[object, str]:
    if template == "gemm":
        return gemm_spec(body, dtype)
    if template == "attention":
        return attention_spec(body, dtype), ""
    if template == "weight":
        return None, "weight-only: computed once per call with torch ops"
    return traversal_spec(body), ""


def gemm_spec(body: Value, dtype: torch.dtype):
    if body.op == Op.WGRAD:
        x, dy = body.args
        seg = body.per or "one segment"
        return None, f"weight gradient dW = sum x^T dy over {x.kind} rows, segments by {seg}"
    x, w = body.args
    transpose = w.op == Op.WT
    wshape = w.args[0].shape if transpose else w.shape
    per_head = len(wshape) == 3
    K = x.dim if per_head else x.heads * x.dim
    N = body.dim if per_head else body.heads * body.dim
    gathered = x.op == Op.GATHER
    rows = RowSegments(rows=x.kind, segments=w.per, per_head=per_head, transpose_weight=transpose,
                       gather=(x.args[0].kind, x.attr("end")) if gathered else None)
    gs = GemmSpec(has_gather=w.per == "node_type" or gathered, has_scatter=w.per == "node_type",
                  transpose_weight=transpose, dtype=dtype, K=K, N=N)
    seg = {"relation": f"{x.kind} rel_ptr", "node_type": "node_type_ptr (+node_perm)",
           None: "one segment"}[w.per] + (f"; rows gathered from {x.args[0].kind} by "
                                          f"{x.attr('end')}" if gathered else "")
    return (gs, rows), f"segments: {seg}{', head-major (per-head weights)' if per_head else ''}"


def attention_spec(body: Value, dtype: torch.dtype) -> AttentionSpec:
    roles = attention_roles(body)
    v = roles["v"]
    return AttentionSpec(heads=v.heads, dim_qk=roles["q"].dim if "q" in roles else 0,
                         dim_v=v.dim, has_qk="q" in roles, has_src="a_src" in roles,
                         has_dst="a_dst" in roles, negative_slope=body.attr("slope"),
                         has_dropout=False, dtype=dtype)


def _describe(v: Value, names) -> str:
    attrs = ", ".join(f"{k}={x}" for k, x in v.attrs if k not in ("per", "body", "index")
                      and x is not None)
    args = ", ".join(names[a] for a in v.args)
    return f"{names[v]} = {v.op}({args}{', ' if args and attrs else ''}{attrs})"


def traversal_spec(body: Value) -> TraversalSpec:
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
    sched = "node-parallel" if body.op == Op.SCATTER and body.kind in (NODE, CDST, CSRC) \
        else "edge-parallel" if space == EDGE else "row-parallel"
    return TraversalSpec(space=space, statements=tuple(statements),
                         reductions=tuple(reductions), schedule=sched)


def _space(body: Value) -> str:
    """The largest row kind a traversal touches: it iterates over that."""
    order = {EDGE: 3, CSRC: 2, CDST: 2, NODE: 1, WEIGHT: 0}
    kinds = [b.kind for b in toposort([body]) if b.op != Op.ARG or True]
    return max(kinds, key=lambda k: order.get(k, 0))
