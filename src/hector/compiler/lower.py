"""Lowering: inter-operator IR -> :class:`~hector.compiler.plan.Plan` of kernel steps.

After fusion the IR's non-leaf values are ``kernel`` nodes, each becoming one step.  Without
fusion every operator is wrapped as a kernel of its own (the unfused baseline the passes are
measured against).  Each step gets the spec of its template: a ``GemmSpec`` with the row
segmentation for a typed linear, an ``AttentionSpec`` for a fused attention, a
``TraversalSpec`` listing the fused statements for everything else.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..kernels.attention.spec import AttentionSpec
from ..kernels.edgewise.spec import EdgewiseSpec, node
from ..kernels.segment_mm.spec import GemmSpec, fp32_dot
from .ir import (CDST, CSRC, EDGE, LEAVES, NODE, Op, Value, WEIGHT, arg, attention_lse,
                 attention_of_bwd, attention_roles, kernel, toposort)
from ..kernels.traversal.spec import MAX_ADDENDS
from .plan import (AttentionRows, EdgewiseLowering, LinearTraversal, Plan, RowSegments, Step,
                   TraversalSpec)

#: IR ops a segment GEMM applies to its input tiles (``fuse``'s prologue), spelled as the
#: kernels name them (``segment_mm.spec.PROLOGUES``; a test checks they agree).
PROLOGUE_OPS = (Op.GELU, Op.RELU, Op.SIGMOID, Op.TANH)


def gemm_input(x: Value) -> Tuple[Value, Optional[str]]:
    """(a GEMM step's input rows, the prologue its kernel applies to them or None)."""
    if x.op in PROLOGUE_OPS:
        return x.args[0], x.op
    return x, None


def template_of(v: Value) -> str:
    if v.op == Op.WGRAD:   # segment-grouped outer products: the GEMM template's weight gradient
        return "gemm"
    if v.op == Op.WSUM and v.per in ("node_type", "relation"):
        # A bias gradient per node type or relation: the weight-gradient kernel with x a
        # column of ones, reading dy once over the whole GPU (torch: a one-hot product, an
        # [N, T] matrix and a GEMM of M = T rows, 0.33 ms where the read takes 0.12 on mag's
        # 1.9M rows), or, paired with the weight gradient of the same dy, that kernel's
        # second output (``_bias_sums_with_wgrads``).
        return "gemm"
    if v.kind == WEIGHT:
        return "weight"
    if v.op == Op.LINEAR:
        return "gemm"
    if v.op in (Op.ATTENTION, Op.ATTENTION_BWD):
        return "attention"
    if v.op == Op.PICK:
        return "select"
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
        # A forward attention also writes its log-sum-exp (a fused backward may read it).
        extra = attention_lse(v) if body.op == Op.ATTENTION else None
        steps.append(Step(name=_name(template, body), template=template, body=body,
                          inputs=v.args, output=v, spec=spec, note=note, extra=extra))
    steps = _bias_sums_with_wgrads(_extra_products(steps))
    return Plan(tuple(steps), tuple(outputs), tuple(leaves))


def _dy_of(step: Step) -> Tuple[Value, str, str]:
    """(the value whose rows a weight-gradient or bias-gradient step sums, its row kind, the
    slicing): equal for a typed linear's two gradients."""
    dy = step.body.args[1] if step.body.op == Op.WGRAD else step.body.args[0]
    return step.inputs[dy.attr("index")], dy.kind, step.body.per


def _bias_sums_with_wgrads(steps: List[Step]) -> List[Step]:
    """A bias gradient (``wsum`` on the weight-gradient kernel) summing the rows of a weight
    gradient's ``dy`` over the same slices is written by that step's kernel, from the dy
    tiles it loads anyway (its ``extra`` output): one read of dy, one launch fewer (HGT on
    mag: four bias gradients of 0.23-0.35 ms each).  Only when no step between the two reads
    either's output (the merged step runs where the later one was)."""
    def kernel_of(s: Step) -> bool:
        return (s.template == "gemm" and s.extra is None and s.body.op in (Op.WGRAD, Op.WSUM)
                and s.body.args[-1 if s.body.op == Op.WGRAD else 0].op == Op.ARG)
    wgrads = {}
    for i, s in enumerate(steps):
        if kernel_of(s) and s.body.op == Op.WGRAD and len(s.body.shape) == 2:
            wgrads.setdefault(_dy_of(s), i)
    merged: Dict[int, Step] = {}
    gone = set()
    for j, s in enumerate(steps):
        if not (kernel_of(s) and s.body.op == Op.WSUM) or _dy_of(s) not in wgrads:
            continue
        i = wgrads.pop(_dy_of(s))
        lo, hi = sorted((i, j))
        outs = {steps[i].output, s.output}
        if any(outs & set(t.inputs) for t in steps[lo + 1:hi]):
            continue
        w = steps[i]
        merged[hi] = Step(name=w.name + "_bias_sums", template=w.template, body=w.body,
                          inputs=w.inputs, output=w.output, spec=w.spec,
                          note=w.note + "; and the bias gradient from the same dy tiles",
                          extra=s.output)
        gone.add(lo)
    return [merged.get(k, t) for k, t in enumerate(steps) if k not in gone]


#: Widest output whose rows a GEMM's epilogue multiplies by a second weight (its tile then
#: spans the whole row: ``GemmSpec.extra_cols``).
EXTRA_MAX_N = 128
#: Most extra columns an epilogue forms (one row sum each).  H200, 12.9M gathered rows, 535
#: segments, ms for the two GEMMs -> one with the extra product (``scripts/gemm_extra.py``;
#: docs/perf-notes.md, "Session 24"): fp32 K = N = 64, E = 1 / 2 / 4: 4.22 -> 3.05, 4.53 ->
#: 3.21, 4.55 -> 3.68; K = N = 128, E = 1 / 2 / 4 / 8: 12.9 -> 10.8, 13.6 -> 11.2, 13.6 ->
#: 11.9, 13.6 -> 13.2; bf16 K = N = 128, E = 1 / 2 / 4 / 8: 3.13 -> 2.61, 3.20 -> 2.97, 3.23 -> 3.27, 3.28 -> 3.89.  Through
#: RGAT 128x8 on wikikg2 (E = 8, fp32) inference went 20.5 -> 22.5 ms on the tuner's list of
#: then (15.4 ms merged; 13.2 on the 4-warp tiles it has now).  The epilogue's row sums cost
#: the same in any dtype; the score GEMM they replace is ~3x cheaper in bf16: so fp32 takes
#: up to 8 columns, half types 2.
EXTRA_MAX_COLS = {torch.float32: 8}
EXTRA_MAX_COLS_HALF = 2


def extra_max_cols(dtype: torch.dtype) -> int:
    """Most extra columns an epilogue forms for a GEMM of ``dtype`` (:data:`EXTRA_MAX_COLS`)."""
    return EXTRA_MAX_COLS.get(dtype, EXTRA_MAX_COLS_HALF)


def _plain_gemm(s: Step) -> bool:
    """A typed linear stored row by row: no bias, addend, scatter, CSR, prologue, heads."""
    if s.template != "gemm" or s.extra is not None or s.body.op != Op.LINEAR:
        return False
    gs, rs = s.spec
    return not (gs.has_scatter or gs.has_bias or gs.has_addend or gs.has_csr or gs.prologue
                or gs.transpose_weight or gs.extra_cols or rs.per_head or rs.scatter
                or rs.csr_out)


def extra_cols(step: Step) -> int:
    """Columns of a GEMM step's extra product (its ``extra`` output; 0: none)."""
    return step.spec[0].extra_cols if (step.template == "gemm" and step.body.op == Op.LINEAR
                                       and step.spec is not None) else 0


def _extra_products(steps: List[Step]) -> List[Step]:
    """``x (W V)`` (a GEMM whose weight is a weight step ``wmul(W, V)``, ``V`` shared) beside
    ``x W`` over the same rows becomes the second output of ``x W``'s GEMM, whose epilogue
    multiplies each whole fp32 row by ``V`` (``GemmSpec.extra_cols``): RGAT's source score
    ``x (W_r a)`` after ``reorder``, which re-read every gathered row of ``x`` for one column
    per head (one head of 64 on wikikg2's 12.9M compact rows: 1.3 ms on the H200 beside the
    message GEMM's 2.9; the epilogue adds 0.1).  At most :func:`extra_max_cols` columns (one
    row sum each: wider, the epilogue costs more than the second GEMM did).  ``W V`` stays a
    weight step (a backward may read it).  Only when no step between the two reads either's
    output (the merged step runs where the later one was)."""
    made = {s.output: s for s in steps}
    at = {s.output: i for i, s in enumerate(steps)}
    mains = {}
    for i, s in enumerate(steps):
        if _plain_gemm(s) and not s.spec[0].narrow and s.spec[0].N <= EXTRA_MAX_N:
            mains.setdefault((s.inputs[0], s.inputs[1], s.spec[1]), i)
    merged: Dict[int, Step] = {}
    gone = set()
    for j, s in enumerate(steps):
        w = made.get(s.inputs[1]) if _plain_gemm(s) else None
        if (w is None or w.template != "weight" or w.body.op != Op.WMUL
                or any(a.op != Op.ARG for a in w.body.args)):
            continue
        v = w.inputs[1]
        key = (s.inputs[0], w.inputs[0], s.spec[1])
        if (key not in mains or len(v.shape) != 2 or v.per is not None or at.get(v, -1) > j
                or v.shape[1] > extra_max_cols(s.spec[0].dtype)):
            continue
        i = mains[key]
        main = steps[i]
        if i == j or v.shape[0] != main.spec[0].N:
            continue
        lo, hi = sorted((i, j))
        outs = {main.output, s.output}
        if any(outs & set(t.inputs) for t in steps[lo + 1:hi]):
            continue
        del mains[key]
        e = v.shape[1]
        merged[hi] = Step(name=main.name + "_extra", template="gemm", body=main.body,
                          inputs=main.inputs + (v,), output=main.output,
                          spec=(replace(main.spec[0], extra_cols=e), main.spec[1]),
                          note=main.note + f"; + x (W V) ({e} columns: each fp32 row times a "
                          f"shared {main.spec[0].N} x {e} weight in the epilogue; no GEMM of "
                          "its own)", extra=s.output)
        gone.add(lo)
    return [merged.get(k, t) for k, t in enumerate(steps) if k not in gone]


def _name(template: str, body: Value) -> str:
    ops = [b.op for b in toposort([body]) if b.op != Op.ARG]
    return f"{template}_{body.kind}_" + "_".join(dict.fromkeys(ops))


def _spec(template: str, body: Value, dtype: torch.dtype) -> Tuple[object, str]:
    if template == "gemm":
        return gemm_spec(body, dtype)
    if template == "select":
        role = body.attr("role")
        return None, (f"the {role} gradient of the attention backward (no kernel)" if role != "kv"
                      else "the k and v gradients of the attention backward, side by side in "
                      "one buffer (no kernel)")
    if template == "attention" and body.op == Op.ATTENTION_BWD:
        spec, rows = attention_spec(attention_of_bwd(body), dtype)
        joint = "; k and v side by side in one buffer" if body.attr("joint") else ""
        over = [r for r in ("v", "k") if r in body.attr("needs")]
        over = (f"; on Triton, d{' and d'.join(over)} written over the saved "
                f"{' and '.join(over)} when only the backward holds them") if over else ""
        return (spec, rows), (f"backward of the fused attention (op graph: {rows.graph}, "
                              f"sources: {rows.source} rows): gradients of "
                              f"{', '.join(body.attr('needs'))}{joint}{over}")
    if template == "attention":
        spec, rows = attention_spec(body, dtype)
        return (spec, rows), f"op graph: {rows.graph}, sources: {rows.source} rows" + (
            "; score folded into a per-edge source term (an edgewise map program)"
            if rows.score_on_edges else "") + (
            "; destination term per (dst, relation) row, read per edge"
            if rows.dst_edge else "") + (
            "; source terms not stored per edge are read per edge by an edgewise map program"
            if rows.source == EDGE and not rows.score_on_edges else "")
    if template == "weight":
        return None, "weight-only: computed once per call with torch ops"
    return traversal_spec(body), ""


def gemm_addend(body: Value) -> Tuple[Value, Optional[Value]]:
    """(the rest of the body, the addend argument or None) of a GEMM step's body:
    ``add(linear or add(linear, bias), addend)`` when fusion gave the linear a node-row
    addend as its epilogue (``fuse``: RGCN's relation sum added by the root GEMM)."""
    if body.op == Op.ADD and body.args[1].op == Op.ARG and body.args[1].kind != WEIGHT:
        return body.args[0], body.args[1]
    return body, None


def gemm_parts(body: Value) -> Tuple[Value, Value]:
    """(the typed linear, its bias argument or None) of a GEMM step's body: ``linear``, or
    ``[reshape](add(linear, bias))`` when fusion gave the linear its bias add as the
    kernel's epilogue, or ``scatter(linear)`` (its scatter epilogue; ``fuse``); an addend
    (:func:`gemm_addend`) is set aside first."""
    body = gemm_addend(body)[0]
    if body.op == Op.SCATTER and body.args[0].op == Op.GATHER:   # (CSR scatter epilogue)
        return body.args[0].args[0], None
    if body.op == Op.SCATTER:
        return body.args[0], None
    if body.op == Op.RESHAPE:
        body = body.args[0]
    if body.op == Op.ADD:
        return body.args[0], body.args[1]
    return body, None


#: Longest CSR row a segment GEMM's CSR prologue or epilogue walks where rows may be cut
#: (a scatter epilogue or a CSR epilogue sums them afterwards, a weight gradient over
#: them): longer rows become pieces of this many entries (``steps_triton.gemm``), so a tile
#: never walks a hub alone.
CSR_PIECE = 16


def csr_epilogue(body: Value) -> Optional[Tuple[Tuple[tuple, ...], float]]:
    """(movements, coefficient) of ``scatter(gather(rows))`` as a CSR scatter epilogue of
    the GEMM computing ``rows`` (``fuse`` asks it of a traversal, lowering of the GEMM's
    body): the chain must be a one-source linear traversal, nothing added; else None."""
    if not (body.op == Op.SCATTER and body.args[0].op == Op.GATHER):
        return None
    g = body.args[0]
    stand_in = Value(body.op, (Value(g.op, (arg(0, g.args[0]),), g.kind, g.shape, g.attrs),),
                     body.kind, body.shape, body.attrs)
    lt = linear_traversal(stand_in)[0]
    if lt is None or len(lt.sources) != 1 or lt.addends or lt.bias is not None:
        return None
    _, movements, coef = lt.sources[0]
    return movements, coef


def gemm_spec(body: Value, dtype: torch.dtype):
    if body.op == Op.WSUM:
        return None, (f"bias gradient db = sum dy over {body.args[0].kind} rows, segments by "
                      f"{body.per}: the weight-gradient kernel with x a column of ones")
    if body.op == Op.WGRAD:
        x, prologue = gemm_input(body.args[0])
        seg = body.per or "one segment"
        how = (f"; x read in place from {x.args[0].kind} rows by {x.attr('end')}"
               if x.op == Op.GATHER else "")
        how += f"; {prologue}(x) applied to each loaded tile" if prologue else ""
        if x.op == Op.SCATTER:
            how += ("; x rows summed through the CSR of " + linear_traversal(x)[0].describe()
                    .split("; ", 1)[1] + " as they are loaded (CSR prologue; rows cut into "
                    f"pieces of at most {CSR_PIECE} entries)")
        dy = body.args[1]
        how += (f"; dy read in place from {dy.args[0].kind} rows by {dy.attr('end')}"
                if dy.op == Op.GATHER else "")
        return None, (f"weight gradient dW = sum x^T dy over {x.kind} rows, segments by "
                      f"{seg}{how}")
    csr_out = csr_epilogue(body)
    out_scatter = ((body.kind, body.attr("end")) if body.op == Op.SCATTER and csr_out is None
                   else None)
    body, addend = gemm_addend(body)
    body, bias = gemm_parts(body)
    x, prologue = gemm_input(body.args[0])
    w = body.args[1]
    transpose = w.op == Op.WT
    wshape = w.args[0].shape if transpose else w.shape
    per_head = len(wshape) == 3
    K = x.dim if per_head else x.heads * x.dim
    N = body.dim if per_head else body.heads * body.dim
    gathered = x.op == Op.GATHER
    csr = None
    if x.op == Op.SCATTER:     # fuse's CSR prologue: one moved source, nothing added
        (csr,) = linear_traversal(x)[0].sources
    # CSR rows cut into pieces where their sums meet linearly afterwards: an epilogue that
    # adds the output rows (no bias, which each piece would add again)
    pieces = csr_out is not None or (csr is not None and out_scatter is not None
                                     and bias is None)
    rows = RowSegments(rows=x.kind, segments=w.per, per_head=per_head, transpose_weight=transpose,
                       gather=(x.args[0].kind, x.attr("end")) if gathered else None, csr=csr,
                       scatter=out_scatter, csr_out=csr_out, pieces=pieces)
    # (steps_triton.gemm.run_gemm: node_perm or the head-major order, permutations both; a CSR
    # prologue's rows in order of length within each segment, a permutation too)
    # (a CSR epilogue's rows: its pieces by length within each segment, ``scatter`` their
    # CSR rows, ``gather`` the input rows they read)
    permuted = w.per == "node_type" or per_head or csr is not None or csr_out is not None
    gs = GemmSpec(has_gather=permuted or gathered,
                  has_scatter=permuted or bool(out_scatter) or csr_out is not None,
                  transpose_weight=transpose, dtype=dtype, K=K, N=N,
                  input_precision=fp32_dot() if dtype == torch.float32 else "ieee",
                  gather_unique=permuted and not gathered and csr_out is None,
                  scatter_unique=permuted and not out_scatter and csr_out is None,
                  has_bias=bias is not None, prologue=prologue, has_csr=csr is not None,
                  has_addend=addend is not None, has_csr_out=csr_out is not None)
    seg = {"relation": f"{x.kind} rel_ptr", "node_type": "node_type_ptr (+node_perm)",
           None: "one segment"}[w.per] + (f"; rows gathered from {x.args[0].kind} by "
                                          f"{x.attr('end')}" if gathered else "")
    if out_scatter is not None:
        seg += (f"; output rows summed into their {out_scatter[0]} rows by {out_scatter[1]} "
                "(scatter epilogue, fp32 atomics)")
    if csr_out is not None:
        seg += ("; output rows added through the CSR of " + LinearTraversal(
            sources=((0,) + csr_out,)).describe().split("; ", 1)[1] + " as they are finished "
                "(CSR scatter epilogue, fp32 atomics; rows cut into pieces of at most "
                f"{CSR_PIECE} entries, ordered by length within each segment)")
    if csr is not None:
        cut = f"rows cut into pieces of at most {CSR_PIECE} entries, " if pieces else ""
        seg += ("; input rows summed through the CSR of " + LinearTraversal(
            sources=(csr,)).describe().split("; ", 1)[1] + " as they are loaded (CSR prologue; "
                f"{cut}rows ordered by length within each segment)")
    return (gs, rows), (f"segments: {seg}{', head-major (per-head weights)' if per_head else ''}"
                        f"{'; + bias per ' + (w.per or 'row') + ' (epilogue)' if bias else ''}"
                        f"{'; ' + prologue + ' of the input rows (prologue)' if prologue else ''}"
                        f"{'; + a ' + addend.kind + ' row per output row (addend epilogue)' if addend is not None else ''}")


def attention_spec(body: Value, dtype: torch.dtype) -> Tuple[AttentionSpec, AttentionRows]:
    """The spec of the op call an attention step makes, and the graph it makes it on.

    The op reads per-node terms; relational terms live on compact or edge rows, so the call
    may run on a derived graph whose sources are those rows (``steps_triton.attention``).  A
    destination term per (dst, relation) row without q.k (RGAT) is read per edge through
    the edge's compact row (``dst_edge``); with a relation-dependent destination otherwise,
    the score becomes one per-edge source term.  The spec describes the call as launched,
    so it is what the kernels run."""
    roles = attention_roles(body)
    v, q, p = roles["v"], roles.get("q"), roles.get("p")
    source_terms = [roles[r].kind for r in ("v", "k", "a_src") if r in roles]
    source = EDGE if EDGE in source_terms else CSRC if CSRC in source_terms else NODE
    if q is None and "a_dst" in roles and roles["a_dst"].kind == CDST \
            and all(k in (NODE, CSRC, EDGE) for k in source_terms):
        rows = AttentionRows("graph" if source == NODE else "derived", source, dst_edge=True)
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
                         has_dropout=False, dtype=dtype, dst_edge=rows.dst_edge)
    return spec, rows


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
