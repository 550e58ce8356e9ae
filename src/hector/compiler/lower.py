"""Lowering: inter-operator IR -> :class:`~hector.compiler.plan.Plan` of kernel steps.

After fusion the IR's non-leaf values are ``kernel`` nodes, each becoming one step.  Without
fusion every operator is wrapped as a kernel of its own (the unfused baseline the passes are
measured against).  Each step gets the spec of its template: a ``GemmSpec`` with the row
segmentation for a typed linear, an ``AttentionSpec`` for a fused attention, a
``TraversalSpec`` listing the fused statements for everything else.

This module holds the entry (:func:`lower`), template classification, the dispatch to each
template's spec, the attention spec and the rewrites over the lowered steps (bias sums and
extra products riding on a GEMM); the GEMM specs are built in :mod:`.lower_gemm`, the
traversal and edgewise specs in :mod:`.lower_traversal`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Sequence, Tuple

import torch

from ..kernels.attention.spec import AttentionSpec
from . import ir as N
from .ir import (CDST, CSRC, EDGE, LEAVES, NODE, Op, Value, WEIGHT, arg, attention_lse,
                 attention_of_bwd, attention_roles, kernel, toposort)
from ..kernels.segment_mm.spec import EXTRA_MAX_N, extra_max_cols
from .lower_gemm import gemm_spec
from .lower_traversal import traversal_spec
from .plan import AttentionRows, Plan, Step


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
    if v.op == Op.PICK:       # (before weights: a cosine_qk_bwd's beta gradient is one)
        return "select"
    if v.kind == WEIGHT:
        return "weight"
    if v.op == Op.LINEAR:
        return "gemm"
    if v.op in (Op.ATTENTION, Op.ATTENTION_BWD):
        return "attention"
    if v.op in (Op.COSINE_QK, Op.COSINE_QK_BWD):
        return "cosine"
    return "traversal"


def single_kernel(v: Value) -> Value:
    """Wrap one operator as a kernel node (what lowering does when fusion is off)."""
    body = Value(v.op, tuple(arg(i, a) for i, a in enumerate(v.args)), v.kind, v.shape, v.attrs)
    return kernel(template_of(v), body, v.args)


def lower(outputs: Sequence[Value], dtype: torch.dtype = torch.float32,
          strategy: str = "auto") -> Plan:
    """The fused IR as a plan of steps with their kernel specs; ``strategy``: the fused
    attentions' schedule ('auto', 'node' or 'edge': :class:`~hector.compiler.plan.AttentionRows`)."""
    steps: List[Step] = []
    leaves: List[Value] = []
    made = set()
    for v in _with_selects(toposort(outputs)):
        if v.op in LEAVES:
            leaves.append(v)
            continue
        if v in made:
            continue
        made.add(v)
        k = v if v.op == Op.KERNEL else single_kernel(v)
        template, body = k.attr("template"), k.attr("body")
        if any(b.op == Op.DROPOUT for b in toposort([body])):
            raise NotImplementedError(
                "dropout: only the weights of an attention that fusion makes one operator "
                "can be dropped (m.dropout(m.edge_softmax(score), p) times source-side "
                "messages, aggregated by sum, with fuse=True); this dropout stayed a "
                f"separate {template} operator")
        spec, note = _spec(template, body, dtype, strategy)
        # A forward attention also writes its log-sum-exp (a fused backward may read it).
        extra = attention_lse(v) if body.op == Op.ATTENTION else None
        steps.append(Step(name=_name(template, body), template=template, body=body,
                          inputs=v.args, output=v, spec=spec, note=note, extra=extra))
    steps = _bias_sums_with_wgrads(_extra_products(steps))
    return Plan(tuple(steps), tuple(outputs), tuple(leaves))


def _with_selects(order):
    """``order`` with each cosine_qk kernel followed by the select kernels of all its outputs
    (``ir.select_kernels``: a backward may keep one the forward does not read)."""
    for v in order:
        yield v
        if v.op == Op.KERNEL and v.attr("body").op == Op.COSINE_QK:
            yield from N.select_kernels(v).values()


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
        # (a bias shared by all rows sums them with torch's one launch alone, but paired
        # adds none: Transformer's query, key, value and root biases, RGCN's)
        shared = s.template == "weight" and s.body.op == Op.WSUM and s.body.per is None
        return ((s.template == "gemm" or shared) and s.extra is None
                and s.body.op in (Op.WGRAD, Op.WSUM)
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


def _plain_gemm(s: Step) -> bool:
    """A typed linear stored row by row: no bias, addend, scatter, CSR, prologue, heads (its
    weight may be read transposed: the kernels read weights through strides)."""
    if s.template != "gemm" or s.extra is not None or s.body.op != Op.LINEAR:
        return False
    gs, rs = s.spec
    return not (gs.has_scatter or gs.has_bias or gs.has_addend or gs.has_csr or gs.prologue
                or gs.extra_cols or rs.per_head or rs.scatter or rs.csr_out)


def extra_cols(step: Step) -> int:
    """Columns of a GEMM step's extra product (its ``extra`` output; 0: none)."""
    return step.spec[0].extra_cols if (step.template == "gemm" and step.body.op == Op.LINEAR
                                       and step.spec is not None) else 0


def _extra_products(steps: List[Step]) -> List[Step]:
    """``x (W V)`` (a GEMM whose weight is a weight step ``wmul(W, V)``, ``V`` shared) beside
    ``x W`` over the same rows, or ``(x W) V`` (a GEMM of ``x W``'s output rows with a shared
    ``V``: GAT's score terms as one block-diagonal product, ``siblings.fuse_scores``),
    becomes the second output of ``x W``'s GEMM, whose epilogue
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
        if not _plain_gemm(s):
            continue
        w = made.get(s.inputs[1])
        z = made.get(s.inputs[0])
        if (w is not None and w.template == "weight" and w.body.op == Op.WMUL
                and all(a.op == Op.ARG for a in w.body.args)):
            v, key = w.inputs[1], (s.inputs[0], w.inputs[0], s.spec[1])   # x (W V)
        elif z is not None and _plain_gemm(z):
            v, key = s.inputs[1], (z.inputs[0], z.inputs[1], z.spec[1])    # (x W) V
            if mains.get(key) != at[z.output]:
                continue
        else:
            continue
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
                          note=main.note + f"; + {'(x W) V' if z is main else 'x (W V)'} "
                          f"({e} columns: each fp32 row times a shared {main.spec[0].N} x {e} "
                          "weight in the epilogue; no GEMM of its own)", extra=s.output)
        gone.add(lo)
    return [merged.get(k, t) for k, t in enumerate(steps) if k not in gone]


def narrowed(plan: Plan, outputs: Tuple[Value, ...]) -> Plan:
    """``plan.pruned(outputs)`` with each attention or cosine backward step computing only
    the gradients its remaining ``select`` steps read (``ir.narrow``), and the steps only
    the others needed left out too: a backward whose inputs need no gradient (a first
    layer's features) launches nothing for them (AGNN's: no source-side attention kernel,
    beta's gradient one dot)."""
    plan = plan.pruned(outputs)
    need, picked, keep = set(plan.outputs), {}, []
    for step in reversed(plan.steps):
        if step.output not in need and (step.extra is None or step.extra not in need):
            continue
        if step.template == "select":
            picked.setdefault(step.inputs[0], set()).add(step.body.attr("role"))
        elif step.body.op in (Op.ATTENTION_BWD, Op.COSINE_QK_BWD):
            step = _narrow_step(step, picked.get(step.output, set()))
        keep.append(step)
        need.update(step.inputs)
    return Plan(tuple(reversed(keep)), plan.outputs, tuple(v for v in plan.leaves if v in need))


def _narrow_step(step: Step, roles) -> Step:
    """``step`` (a tuple-valued backward) computing only ``roles``, its inputs renumbered to
    the ones they read; as it was where it computes nothing more (or a joint k|v buffer)."""
    body = step.body
    if not roles or "kv" in roles or body.attr("joint") or roles >= set(body.attr("needs")):
        return step
    small = N.narrow(body, roles)
    olds = list(dict.fromkeys(a.attr("index") for a in small.args))
    args = tuple(arg(olds.index(a.attr("index")), a) for a in small.args)
    body = Value(small.op, args, small.kind, small.shape, small.attrs)
    dtype, strategy = ((step.spec[0].dtype, step.spec[1].strategy)
                       if step.template == "attention" else (None, "auto"))
    spec, note = _spec(step.template, body, dtype, strategy)
    return replace(step, body=body, inputs=tuple(step.inputs[i] for i in olds), spec=spec,
                   note=note)


def _name(template: str, body: Value) -> str:
    ops = [b.op for b in toposort([body]) if b.op != Op.ARG]
    return f"{template}_{body.kind}_" + "_".join(dict.fromkeys(ops))


def _spec(template: str, body: Value, dtype: torch.dtype,
          strategy: str = "auto") -> Tuple[object, str]:
    if template == "gemm":
        return gemm_spec(body, dtype)
    if template == "select" and body.attr("of"):
        return None, f"the {body.attr('role')} output of the {body.attr('of')} step (no kernel)"
    if template == "select":
        role = body.attr("role")
        return None, (f"the {role} gradient of the attention backward (no kernel)" if role != "kv"
                      else "the k and v gradients of the attention backward, side by side in "
                      "one buffer (no kernel)")
    if template == "attention" and body.op == Op.ATTENTION_BWD:
        spec, rows = attention_spec(attention_of_bwd(body), dtype, strategy)
        joint = "; k and v side by side in one buffer" if body.attr("joint") else ""
        over = [r for r in ("v", "k") if r in body.attr("needs")]
        over = (f"; on Triton, d{' and d'.join(over)} written over the saved "
                f"{' and '.join(over)} when only the backward holds them") if over else ""
        if "k_norm" in body.attr("roles"):     # (the in-place op gathers its keys)
            over = "; keys formed from v's rows and k_norm"
        return (spec, rows), (f"backward of the fused attention (op graph: {rows.graph}, "
                              f"sources: {rows.source} rows): gradients of "
                              f"{', '.join(body.attr('needs'))}{joint}{over}")
    if template == "attention":
        spec, rows = attention_spec(body, dtype, strategy)
        return (spec, rows), f"op graph: {rows.graph}, sources: {rows.source} rows" + (
            "; score folded into a per-edge source term (an edgewise map program)"
            if rows.score_on_edges else "") + (
            "; destination term per (dst, relation) row, read per edge"
            if rows.dst_edge else "") + (
            "; source terms not stored per edge are read per edge by an edgewise map program"
            if rows.source == EDGE and not rows.score_on_edges else "")
    if template == "cosine" and body.op == Op.COSINE_QK:
        return None, ("k = normalize(x), q = beta k and each row's norm in one pass "
                      "(hector::cosine_qk; torch: cosine_qk_torch)")
    if template == "cosine" and "x" not in body.attr("needs"):
        return None, "dbeta of cosine_qk alone (x needs no gradient): <dq, k>, one dot"
    if template == "cosine":
        grads = " and d".join(body.attr("needs"))
        return None, (f"d{grads} of cosine_qk in one pass (hector::cosine_qk_backward; "
                      "torch: cosine_qk_backward_torch)")
    if template == "weight" and body.op == Op.WBLOCKS:
        H = body.args[0].shape[0]
        return None, (f"weight-only, once per call: {len(body.args)} per-head column weights as "
                      f"one {body.shape[0]} x {body.shape[1]} "
                      + ("block-diagonal matrix" if H > 1 else "matrix (side by side)")
                      + " (Triton: one kernel, one for its gradient)")
    if template == "weight":
        return None, "weight-only: computed once per call with torch ops"
    return traversal_spec(body), ""


def attention_spec(body: Value, dtype: torch.dtype,
                   strategy: str = "auto") -> Tuple[AttentionSpec, AttentionRows]:
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
        rows = AttentionRows("graph" if source == NODE else "derived", source, dst_edge=True,
                             strategy=strategy)
        has_qk, has_src, has_dst = False, "a_src" in roles, True
    else:
        dst_per_node = all(roles[r].kind == NODE for r in ("q", "a_dst") if r in roles)
        if not dst_per_node:
            source = EDGE
        elif source == NODE and p is not None and p.per == "relation":
            source = CSRC   # p_r is folded into each compact row's key
        on_edges = source == EDGE and not dst_per_node
        graph = "graph" if source == NODE and p is None else "derived"
        rows = AttentionRows(graph, source, on_edges, strategy=strategy)
        has_qk, has_src = q is not None and not on_edges, "a_src" in roles or on_edges
        has_dst = "a_dst" in roles and not on_edges
    slope = body.attr("slope")
    spec = AttentionSpec(heads=v.heads, dim_qk=q.dim if has_qk else 0, dim_v=v.dim,
                         has_qk=has_qk, has_src=has_src, has_dst=has_dst,
                         negative_slope=None if slope is None else float(slope),
                         has_dropout="seed" in roles, dtype=dtype, dst_edge=rows.dst_edge,
                         normed_k="k_norm" in roles)
    return spec, rows
