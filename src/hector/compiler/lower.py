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
from .plan import AttentionRows, Plan, RowSegments, Step, TraversalSpec

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
        spec, rows = attention_spec(body, dtype)
        return (spec, rows), f"op graph: {rows.graph}, sources: {rows.source} rows" + (
            "; score folded into a per-edge source term" if rows.score_on_edges else "")
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


def attention_spec(body: Value, dtype: torch.dtype) -> Tuple[AttentionSpec, AttentionRows]:
    """The spec of the op call an attention step makes, and the graph it makes it on.

    The op reads per-node terms; relational terms live on compact or edge rows, so the call
    may run on a derived graph whose sources are those rows (``steps_triton``).  A
    destination term per (dst, relation) row without q.k (RGAT) runs on the (dst, relation)
    groups; with a relation-dependent destination otherwise, the score becomes one per-edge
    source term.  The spec describes the call as launched, so it is what the kernels run."""
    roles = attention_roles(body)
    v, q, p = roles["v"], roles.get("q"), roles.get("p")
    source_terms = [roles[r].kind for r in ("v", "k", "a_src") if r in roles]
    source = EDGE if EDGE in source_terms else CSRC if CSRC in source_terms else NODE
    if q is None and "a_dst" in roles and roles["a_dst"].kind == CDST \
            and all(k in (NODE, CSRC, EDGE) for k in source_terms):
        rows = AttentionRows("groups", source)
        has_qk, has_src, has_dst = False, "a_src" in roles, True
    else:
        dst_per_node = all(roles[r].kind == NODE for r in ("q", "a_dst") if r in roles)
        if not dst_per_node:
            source = EDGE
        elif source == NODE and p is not None and p.per == "relation":
            source = CSRC   # p_r is folded into each compact row's key
        on_edges = source == EDGE and not dst_per_node
        graph = "graph" if source == NODE and p is None else "derived"
        rows = AttentionRows(graph, source, on_edges)
        has_qk, has_src = q is not None and not on_edges, "a_src" in roles or on_edges
        has_dst = "a_dst" in roles and not on_edges
    slope = body.attr("slope")
    spec = AttentionSpec(heads=v.heads, dim_qk=q.dim if has_qk else 0, dim_v=v.dim,
                         has_qk=has_qk, has_src=has_src, has_dst=has_dst,
                         negative_slope=None if slope is None else float(slope),
                         has_dropout=False, dtype=dtype)
    return spec, rows


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
