"""``attention`` steps on the Triton backend -> the ``hector::edge_attention`` op
(:func:`edge_attention_triton`) and, differentiated as one operator (``attention_bwd``),
``hector::edge_attention_backward``.  That op takes
per-*node* terms, but relational attention reads compact (src, relation) rows (HGT's ``k
W_att_r``, the messages ``m W_msg_r``) or even (dst, relation) rows (RGAT's ``z_v^r q``).  We
lower it onto a *derived bipartite graph*: sources are the rows the source-side terms live on
(nodes, compact (src, relation) rows, or edges), destinations the real nodes, one derived edge
per edge.  Ids span ``max(S, N)``, but each side's terms, outputs and gradients have exactly
that side's rows (the graph's ``num_src`` / ``num_dst``).  A per-relation prior ``p_r`` on
the q.k term (when ``reorder`` did not fold it into the key weights) is folded into the keys
of each compact row (rows carry their relation).  A destination-side term that depends on
the relation (RGAT) cannot be a per-node query, so then sources are the edges themselves and
the whole pre-activation score is an edge term ``a_src`` (cost: ``E x H x D`` messages).
RGAT's case (no q.k term; ``a_dst`` per (dst, relation)) avoids that: the kernels read
``a_dst`` per edge through its (dst, relation) row (:func:`_dst_index`).
Which of these an attention step takes is lowering's choice (``step.spec``'s
:class:`~hector.compiler.plan.AttentionRows`); the op is called with lowering's spec and the
schedules :func:`attention_launch` memoises per graph.  Per-edge keys times ``p_r`` and
edge-folded scores run on the edgewise kernel (:mod:`.edgewise`).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ...graph import Graph
from ...graph.capacity import with_compact_maps
from ...graph.derived import AttentionGraph
from ...graph.graph import recipe
from ...kernels.attention.custom_ops import edge_attention_grads_triton, edge_attention_triton
from ...kernels.attention.launch import overlap, rows_dense
from ...kernels.attention.plan import AttentionPlan, make_plan
from ...kernels.attention.spec import AttentionSpec
from .. import ir
from ..ir import CSRC, EDGE, NODE, WEIGHT, Op, Value, attention_of_bwd, attention_roles
from ..plan import AttentionRows
from ..steps_torch import GraphIndex, _operand, attention_bwd_torch, per_argument
from .edgewise import _program, run_edgewise_body


def _derived_graph(ix: GraphIndex, src_kind: str):
    """The bipartite graph (source rows of ``src_kind``) -> (nodes), kept on the graph as a
    recipe derivation (an overlapped captured step makes it with the blocks).  Sources and
    destinations share the id range ``[0, max(S, N))`` (the kernels read each operand only
    in its own role), and the graph says each side's rows
    (``num_src``, ``num_dst``): operands, outputs and gradients have exactly their side's
    rows, no padding and no copy-out (offset destination ids needed a copy of every operand:
    on synthetic mag, HGT's ``[S, H, D]`` keys and values, 9 ms of ``cat`` per step)."""
    return ix.graph.derive(("attention_sources", src_kind))


@recipe("attention_sources")
def _attention_sources(g: Graph, src_kind: str) -> AttentionGraph:
    ix = GraphIndex.of(g)
    rows = max(ix.rows[src_kind], g.num_nodes)
    return AttentionGraph(_source_rows(ix, src_kind), g.dst.long(), rows,
                          dst_order=g.csr_in.eid, num_src=ix.rows[src_kind],
                          num_dst=g.num_nodes,
                          capacity=g if getattr(g, "capacity", None) is not None else None)


def _source_rows(ix: GraphIndex, src_kind: str) -> torch.Tensor:
    """Each edge's source row of ``src_kind`` (an edge is its own row)."""
    if src_kind == EDGE:
        return torch.arange(ix.graph.num_edges, device=ix.graph.device)
    return ix.move(src_kind, EDGE, "src")


def attention_graph(rows: AttentionRows, ix: GraphIndex) -> Graph:
    """The graph an attention step's op call traverses (see :class:`AttentionRows`)."""
    if rows.graph == "derived":
        return _derived_graph(ix, rows.source)
    return ix.graph


def attention_launch(step, ix: GraphIndex) -> Tuple[AttentionSpec, AttentionPlan]:
    """(spec, schedules) of an attention step's op call on this graph: the spec lowering
    built, and the schedules chosen for the graph the call traverses, once per (graph, spec)
    and memoised on the graph's index.  :func:`run_attention` launches exactly these, and
    ``hector.explain`` prints them."""
    spec, rows = step.spec
    key = ("attention_plan", spec, rows)
    if key not in ix.memo:
        ix.memo[key] = make_plan(attention_graph(rows, ix), spec, rows.strategy)
    return spec, ix.memo[key]


def _step_ir(step, key: str, build):
    """IR the runtime runs for ``step`` beyond its body (an operand's access, a score, group
    weights) with its edgewise lowering, built once per step from the step's static parts
    and kept on it under a constant ``key``: torch.compile then traces a lookup, not the IR
    construction (which torch 2.11's dynamo cannot trace: it hashes tuples)."""
    memo = getattr(step, "_runtime_ir", None)
    if memo is None:
        memo = {}
        object.__setattr__(step, "_runtime_ir", memo)      # (frozen dataclass: a memo only)
    if key not in memo:
        memo[key] = build()
    return memo[key]


def _at_source(step, role: str, roles, src_kind, ix, p=None):
    """An attention operand on the source side the step runs on: as it is, per edge (read
    through the source's access scheme by the edgewise kernel, times ``p_r`` when ``p`` is
    given), or gathered from node rows onto compact (src, relation) rows."""
    val, t = roles[role]
    if src_kind == EDGE:
        if val.kind == EDGE and p is None:
            return t

        def build():
            x = ir.arg(0, val)
            body = x if val.kind == EDGE else ir.gather(x, EDGE, "src")
            return _program(body if p is None else ir.binary(Op.MUL, body, ir.arg(1, p[0])))
        prog = _step_ir(step, "source " + role + (" times p" if p is not None else ""), build)
        return run_edgewise_body(prog, [t] + ([p[1]] if p is not None else []), ix)
    k = t if val.kind == src_kind else t.index_select(0, ix.move(NODE, CSRC, "src"))
    return k if p is None else k * _operand(p[1], p[0], src_kind, ix)


def _edge_score(step, roles, ix: GraphIndex) -> torch.Tensor:
    """The pre-activation score ``scale <q_v, k_u> p_r + a_src + a_dst`` per edge ``[E, H,
    1]`` as one edgewise program (each term read through its access scheme; the torch
    backend's ``attention_score`` gathers every term per edge first)."""
    def build():
        names: List[str] = []

        def term(role: str, end: str) -> Value:
            val = roles[role][0]
            names.append(role)
            x = ir.arg(len(names) - 1, val)
            return x if val.kind in (EDGE, WEIGHT) else ir.gather(x, EDGE, end)

        terms = []
        if "q" in roles:
            qk = ir.unary(Op.SCALE, ir.dot(term("q", "dst"), term("k", "src")),
                          factor=step.body.attr("scale"))
            terms.append(ir.binary(Op.MUL, qk, term("p", "src")) if "p" in roles else qk)
        terms += [term(r, end) for r, end in (("a_src", "src"), ("a_dst", "dst")) if r in roles]
        score = terms[0]
        for t in terms[1:]:
            score = ir.binary(Op.ADD, score, t)
        return _program(score), tuple(names)
    prog, names = _step_ir(step, "edge score", build)
    return run_edgewise_body(prog, [roles[n][1] for n in names], ix)


def run_attention(step, inputs: List[torch.Tensor], ix: GraphIndex, backend: str):
    """An attention step: the op called on the graph lowering chose (``step.spec``), with the
    spec and schedules of :func:`attention_launch`.  Returns (out, log-sum-exp ``[N, H]``)."""
    body: Value = step.body
    rows: AttentionRows = step.spec[1]
    roles = attention_roles(body, tuple(zip(body.args, per_argument(body, inputs))))
    scale, slope = body.attr("scale"), body.attr("slope")
    terms = _attention_terms(step, roles, ix)
    spec, plan = attention_launch(step, ix)
    g = attention_graph(rows, ix)
    p, seed = _dropout(body, roles)
    return edge_attention_triton(g, *terms, scale=scale, negative_slope=slope, dropout=p,
                                 seed=seed, spec=spec, plan=plan, return_lse=True,
                                 dst_index=_dst_index(rows, ix), bias=_bias(roles, terms[0]),
                                 k_norm=_k_norm(roles))


def _dropout(att: Value, roles) -> Tuple[float, Optional[torch.Tensor]]:
    """(p, the seed tensor) of an attention's dropout; (0.0, None) without one."""
    p = att.attr("dropout", 0.0)
    return p, roles["seed"][1] if p > 0 else None


def _bias(roles, v: torch.Tensor) -> Optional[torch.Tensor]:
    """The epilogue term of an attention step (its ``bias`` role): a weight row as
    ``[H, Dv]``, node rows (an addend, one per output row) as ``[rows, H, Dv]``; or None."""
    if "bias" not in roles:
        return None
    value, t = roles["bias"]
    return t.reshape(v.shape[1:]) if value.kind == WEIGHT else t.view(t.shape[0], *v.shape[1:])


def _k_norm(roles) -> Optional[torch.Tensor]:
    """The ``[N]`` norm that k's rows are v's divided by (the ``k_norm`` role, a cosine_qk
    step's ``[N, 1, 1]`` output: ``AttentionSpec.normed_k``), or None."""
    return roles["k_norm"][1].reshape(-1) if "k_norm" in roles else None


def _dst_index(rows: AttentionRows, ix: GraphIndex) -> Optional[torch.Tensor]:
    """Each edge's (dst, relation) row, where the destination term lives on those rows and
    the kernels read it per edge (``rows.dst_edge``); else None.  Indexed by the op graph's
    edge ids (the kernels read it through their CSR's): the graph's canonical edges, or a
    derived graph's, one per canonical edge in its own order (``edge_perm``); memoised."""
    if not rows.dst_edge:
        return None
    if rows.graph == "graph":
        return with_compact_maps(ix.graph).compact_dst.edge_row
    return ix.graph.derive(("attention_dst_rows", rows.source))


@recipe("attention_dst_rows")
def _attention_dst_rows(g: Graph, source: str) -> torch.Tensor:
    """Each derived-graph edge's (dst, relation) row (:func:`_dst_index`)."""
    edge_row = with_compact_maps(g).compact_dst.edge_row
    return torch.index_select(edge_row, 0, _derived_graph(GraphIndex.of(g), source)
                              .edge_perm.long())


def _attention_terms(step, roles, ix: GraphIndex):
    """(v, q, k, a_src, a_dst) as the op takes them on the step's graph (None where absent):
    source terms on the source rows, ``p_r`` folded into the keys."""
    rows: AttentionRows = step.spec[1]
    src_kind = rows.source
    v = _at_source(step, "v", roles, src_kind, ix)
    if rows.score_on_edges:
        # The whole score is per edge; fold it into one source-side term.
        return v, None, None, _edge_score(step, roles, ix)[..., 0], None
    q = roles["q"][1] if "q" in roles else None
    k = _at_source(step, "k", roles, src_kind, ix, roles.get("p")) if "k" in roles else None
    a_src = _at_source(step, "a_src", roles, src_kind, ix)[..., 0] if "a_src" in roles else None
    a_dst = roles["a_dst"][1][..., 0] if "a_dst" in roles else None
    return v, q, k, a_src, a_dst


_OP_ROLES = ("v", "q", "k", "a_src", "a_dst")   # the op's gradient order


def _into_kv(terms, flags, donated: List[torch.Tensor]) -> bool:
    """Whether the source-row operands whose gradients the step needs (v, and k where
    asked) can take those gradients in their own rows: each is a donated input or a view
    of one (so nothing reads it after this step), the kernels read it in place, and the
    two do not overlap."""
    need = [t for t, f in ((terms[0], flags[0]), (terms[2], flags[2])) if f]
    if not need or not donated or any(t is None or t.numel() == 0 for t in need):
        return False
    owned = {d.untyped_storage().data_ptr() for d in donated if d.numel()}
    if not all(t.untyped_storage().data_ptr() in owned and rows_dense(t) is t for t in need):
        return False
    others = [t for t in terms if t is not None and all(t is not n for n in need)]
    return not any(overlap(a, b) for i, a in enumerate(need) for b in need[i + 1:] + others)


def run_attention_bwd(step, inputs: List[torch.Tensor], ix: GraphIndex, backend: str,
                      donated: frozenset = frozenset()):
    """An attention backward step (``attention_bwd``): role -> gradient on the role's rows.
    Triton: the fused backward kernels on the forward's graph, spec and schedules, reading
    the forward's output and log-sum-exp; torch: :func:`attention_bwd_torch`.  ``donated``:
    positions of inputs read for the last time here that nothing else holds (the plan
    runner's call): when the k and v the kernels take are such inputs, their gradients are
    written over them (:func:`_into_kv`)."""
    body: Value = step.body
    att = _step_ir(step, "forward attention", lambda: attention_of_bwd(body))
    owned = [inputs[i] for i in donated]
    inputs = per_argument(body, inputs)
    if backend != "triton":
        return attention_bwd_torch(body, att, inputs, ix)
    n_roles = len(att.args)
    roles = attention_roles(att, tuple(zip(att.args, inputs[:n_roles])))
    grad, out, lse = inputs[n_roles:n_roles + 3]
    terms = _attention_terms(step, roles, ix)
    spec, plan = attention_launch(step, ix)
    g = attention_graph(step.spec[1], ix)
    needs = body.attr("needs")
    joint = body.attr("joint", False)
    flags = [r in needs for r in _OP_ROLES]
    p, seed = _dropout(att, roles)
    k_norm = _k_norm(roles)
    grads = edge_attention_grads_triton(
        g, spec, plan, flags, grad, *terms, out, lse, att.attr("scale"), att.attr("slope"),
        dst_index=_dst_index(step.spec[1], ix), joint_kv=joint, bias=_bias(roles, terms[0]),
        # (the in-place op takes no k_norm: its keys are gathered)
        into_kv=p == 0 and k_norm is None and _into_kv(terms, flags, owned),
        dropout=p, seed=seed, k_norm=k_norm)
    result = {}
    if joint:   # one [rows, H * (Dk + Dv)] buffer in k's slot; k and v are views of it
        kv = grads[2]
        k, v = (roles[r][0] for r in ("k", "v"))
        split = k.heads * k.dim
        result["kv"] = kv.unsqueeze(1)
        result["k"] = kv[:, :split].unflatten(1, k.shape)
        result["v"] = kv[:, split:].unflatten(1, v.shape)
    for role, d in zip(_OP_ROLES, grads):
        if role in needs and role not in result:
            result[role] = d[..., None] if role in ("a_src", "a_dst") else d
    return result
