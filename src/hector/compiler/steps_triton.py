"""The Triton backend's kernel templates as the compiler calls them.

* ``traversal`` steps whose spec has a :class:`~hector.compiler.plan.LinearTraversal` ->
  :func:`hector.kernels.traversal.op.traverse` on the movement chain's weighted CSR, composed
  once per graph (:func:`movement_csr`);
* ``gemm`` steps -> :func:`hector.kernels.segment_mm.op.segment_mm` (segment GEMM with
  gather/scatter);
* ``attention`` steps -> :func:`hector.kernels.attention.op.edge_attention`.  That op takes
  per-*node* terms, but relational attention reads compact (src, relation) rows (HGT's ``k
  W_att_r``, the messages ``m W_msg_r``) or even (dst, relation) rows (RGAT's ``z_v^r q``).  We
  lower it onto a *derived bipartite graph*: sources are the rows the source-side terms live on
  (nodes, compact (src, relation) rows, or edges), destinations the real nodes, one derived edge
  per edge.  Terms are padded to ``S + N`` rows (zeros where a side does not apply).  HGT's
  per-relation prior ``p_r`` multiplies the q.k term, so it is folded into the keys of each
  compact row (rows carry their relation).  A destination-side term that depends on the relation
  (RGAT) cannot be a per-node query, so then sources are the edges themselves and the whole
  pre-activation score is an edge term ``a_src`` (cost: ``E x H x D`` messages). RGAT's case (no
  q.k term; ``a_dst`` per (dst, relation)) avoids that: see :func:`_attention_by_dst_relation`.
Which of these an attention step takes is lowering's choice (``step.spec``'s
:class:`~hector.compiler.plan.AttentionRows`); the op is called with lowering's spec and the
schedules :func:`attention_launch` memoises per graph.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from ..graph import Graph
from ..kernels.attention.launch import AttentionPlan, make_plan
from ..kernels.attention.op import edge_attention
from ..kernels.attention.spec import AttentionSpec
from ..kernels.segment_mm.launch import segment_mm_wgrad_op
from ..kernels.segment_mm.op import segment_mm
from ..kernels.segment_mm.spec import GemmSpec, default_schedule
from ..kernels.traversal.csr import WeightedCSR, compose, from_coo, scaled
from ..kernels.traversal.op import edge_softmax as edge_softmax_kernel, traverse
from .ir import CDST, CSRC, EDGE, NODE, Op, Value, attention_roles, toposort
from .plan import AttentionRows, RowSegments
from .steps_torch import GraphIndex, _operand, attention_score, edge_side, edge_softmax


def _host_bounds(ix: GraphIndex, rs, rows: int) -> List[int]:
    """The segment bounds of a GEMM step's rows, as Python ints (read from the graph once)."""
    if rs.segments == "relation":
        return ix.ptr[rs.rows if rs.rows in (EDGE, CSRC) else CDST]
    if rs.segments == "node_type":
        return ix.ptr[NODE]
    return [0, rows]


def _gemm_layout(ix: GraphIndex, rs, rows: int, heads: int):
    """(seg_ptr as a tuple of Python ints, node permutation on the device or None) of a GEMM
    step, memoised on the graph's index.  Python ints, not a tensor: ``segment_mm`` would read
    a tensor on the host every call (a device sync for a device tensor; a data-dependent
    value that ends a ``torch.compile`` graph for any tensor).  Head-major rows
    (``heads`` > 0) make each (head, slice) its own segment."""
    key = ("gemm_layout", rs.rows, rs.segments, rows, heads)
    if key not in ix.memo:
        bounds = _host_bounds(ix, rs, rows)
        perm = ix.node_perm if rs.segments == "node_type" else None
        if heads:
            bounds = [h * rows + b for h in range(heads) for b in bounds[:-1]] + [heads * rows]
            if perm is not None:
                offs = torch.arange(heads, device=perm.device).view(-1, 1) * rows
                perm = (offs + perm.view(1, -1)).reshape(-1)
        ix.memo[key] = (tuple(bounds), perm)
    return ix.memo[key]


def run_gemm(step, x: torch.Tensor, w: torch.Tensor, ix: GraphIndex, backend: str):
    """A typed-linear step on the segment GEMM template."""
    _, rs = step.spec
    gather = None
    if rs.gather is not None:   # x holds the source rows; the GEMM reads them by index
        gather = ix.move(rs.gather[0], rs.rows, rs.gather[1])
    rows = x.shape[0] if gather is None else gather.shape[0]
    weight = w if rs.segments is not None else w.unsqueeze(0)
    if rs.per_head:
        if gather is not None:
            x, gather = x.index_select(0, gather), None
        H = x.shape[1]
        ptr, perm = _gemm_layout(ix, rs, rows, H)
        xin = x.transpose(0, 1).reshape(H * rows, x.shape[-1])
        S = weight.shape[0]
        weight = weight.transpose(0, 1).reshape((H * S,) + tuple(weight.shape[2:]))
        n_rows = H * rows
    else:
        ptr, perm = _gemm_layout(ix, rs, rows, 0)
        xin, n_rows = x.flatten(1), rows   # (flatten: fine with 0 rows)
    out = segment_mm(xin.contiguous(), weight.contiguous(), ptr,
                     gather=perm if gather is None else gather, scatter=perm,
                     num_out_rows=n_rows if perm is not None else None,
                     transpose_weight=rs.transpose_weight, backend=backend)
    if rs.per_head:
        out = out.view(H, rows, -1).transpose(0, 1)
    return out.reshape((rows,) + tuple(step.output.shape))


def _wgrad_layout(ix: GraphIndex, kind: str, per, rows: int, heads: int):
    """(segment bounds as a tuple of ints, row permutation on the device or None) of a weight
    gradient over ``rows`` rows of ``kind``, head-major when ``heads`` > 0; memoised."""
    key = ("wgrad_layout", kind, per, rows, heads)
    if key not in ix.memo:
        seg = "relation" if per == "relation" else "node_type" if per == "node_type" else None
        rs = RowSegments(rows=kind, segments=seg, per_head=bool(heads), transpose_weight=False)
        ptr, perm = _gemm_layout(ix, rs, rows, heads)
        ix.memo[key] = (ptr, perm)
    return ix.memo[key]


def run_wgrad(step, x: torch.Tensor, dy: torch.Tensor, ix: GraphIndex) -> torch.Tensor:
    """A weight-gradient step ``dW[s] = sum_{r in s} x_r^T dy_r`` on the segment GEMM's
    ``segment_mm_wgrad`` kernel: one launch for all slices (the torch backend loops over
    them in Python, one small matmul per relation).  Same segments as the forward GEMM:
    relation pointers of the rows' kind, node-type pointers with ``node_perm`` as gather and
    scatter, or one segment; per-head weights make each (head, slice) a segment."""
    v = step.body
    headwise = len(v.shape) == 3
    rows = x.shape[0]
    H = x.shape[1] if headwise else 0
    bounds, perm = _wgrad_layout(ix, v.args[0].kind, v.per, rows, H)
    if headwise:
        xin = x.transpose(0, 1).reshape(H * rows, x.shape[-1])
        dyin = dy.transpose(0, 1).reshape(H * rows, dy.shape[-1])
    else:
        xin, dyin = x.flatten(1), dy.flatten(1)   # (flatten: fine with 0 rows)
    K, N = xin.shape[1], dyin.shape[1]
    S = len(bounds) - 1
    # A custom op (hector::segment_mm_wgrad), so that torch.compile does not trace the launch.
    dw = segment_mm_wgrad_op(xin.contiguous(), dyin.contiguous(), perm, perm, list(bounds))
    if headwise:   # [(head, slice), K, N] -> [slice, head, K, N]
        dw = dw.view(H, S // H, K, N).transpose(0, 1).contiguous()
    return dw[0] if v.per is None else dw


def _movement_factor(ix: GraphIndex, move: tuple) -> WeightedCSR:
    """One gather (``[many, one]``, an entry per ``many`` row) or scatter (``[one, many]``) as
    a weighted CSR; a mean weighs each entry by ``1 / count`` of its ``one`` row."""
    op, one, many, end, how = move
    idx = ix.move(one, many, end)
    val = ix.counts(one, many, end).index_select(0, idx).reciprocal() if how == "mean" else None
    rows = torch.arange(ix.rows[many], device=idx.device)
    if op == "gather":
        return from_coo(rows, idx, val, ix.rows[many], ix.rows[one])
    return from_coo(idx, rows, val, ix.rows[one], ix.rows[many])


def movement_csr(ix: GraphIndex, movements: tuple, coef: float = 1.0) -> WeightedCSR:
    """``coef`` times the product of a traversal's movements (innermost first) as one
    weighted CSR: built from the graph's index arrays on the first call, memoised on the
    graph's index."""
    key = ("traversal_csr", movements, coef)
    if key not in ix.memo:
        m = None
        for move in movements:
            f = _movement_factor(ix, move)
            m = f if m is None else compose(f, m)
        ix.memo[key] = scaled(m, coef) if coef != 1.0 else m
    return ix.memo[key]


def run_traversal(step, inputs: List[torch.Tensor], ix: GraphIndex) -> torch.Tensor:
    """A movement-and-addition traversal on the ``traversal_csr`` kernel: rows read in place
    through each source's composed CSR; the addends and the bias are fused into the first
    launch, and each further source adds onto the previous launch's output."""
    if step.spec.softmax is not None:
        index, slope = step.spec.softmax
        s = inputs[index]
        # The kernel has no autograd; torch autodiff (recording) takes the torch ops.
        recording = torch.is_grad_enabled() and s.requires_grad
        return edge_softmax_kernel(ix.graph, s, slope, backend="torch" if recording else "triton")
    lt = step.spec.linear
    bias = None if lt.bias is None else _bias_row(step, inputs[lt.bias], lt.bias, ix)
    shape = tuple(step.body.shape)

    def rows(t):   # a reshape in the body is a view of the same row
        return t.reshape((t.shape[0],) + shape)

    out = None
    for index, movements, coef in lt.sources:
        m = movement_csr(ix, movements, coef)
        if out is None:
            out = traverse(m, rows(inputs[index]), [rows(inputs[i]) for i, _ in lt.addends],
                           [c for _, c in lt.addends], bias, backend="triton")
        else:
            out = traverse(m, rows(inputs[index]), [out], [1.0], backend="triton")
    return out


def _bias_row(step, t: torch.Tensor, index: int, ix: GraphIndex) -> torch.Tensor:
    """The bias weight as one output row, broadcast the way the torch backend's ``add`` does."""
    arg = next(b for b in toposort([step.body]) if b.op == Op.ARG and b.attr("index") == index)
    return _operand(t, arg, step.body.kind, ix).expand((1,) + tuple(step.body.shape)).reshape(-1)


def _derived_graph(ix: GraphIndex, src_kind: str):
    """The bipartite graph (source rows of ``src_kind``) -> (nodes, offset by S), memoised."""
    g = ix.graph
    memo = g.__dict__.setdefault("_derived", {})
    key = "attention_sources_" + src_kind
    if key not in memo:
        S = ix.rows[src_kind]
        if src_kind == EDGE:
            rows = torch.arange(g.num_edges, device=g.device)
        else:
            rows = ix.move(src_kind, EDGE, "src")
        ei = torch.stack([rows, g.dst.long() + S])
        memo[key] = Graph(ei, num_nodes=S + g.num_nodes)
    return memo[key]


def _pad(t: Optional[torch.Tensor], before: int, after: int) -> Optional[torch.Tensor]:
    if t is None:
        return None
    parts = [t.new_zeros((before,) + t.shape[1:]), t, t.new_zeros((after,) + t.shape[1:])]
    return torch.cat([p for p in parts if p.shape[0]], 0)


def _source_rows(ix: GraphIndex, src_kind: str) -> torch.Tensor:
    """Each edge's source row of ``src_kind`` (an edge is its own row)."""
    if src_kind == EDGE:
        return torch.arange(ix.graph.num_edges, device=ix.graph.device)
    return ix.move(src_kind, EDGE, "src")


def _group_graph(ix: GraphIndex, src_kind: str):
    """Derived graph (source rows of ``src_kind``) -> (compact (dst, relation) rows), one
    derived edge per edge; sources and destinations share the id range ``[0, max(S, Sd))``
    (the kernels read each operand only in its own role).  Memoised on the graph."""
    g = ix.graph
    memo = g.__dict__.setdefault("_derived", {})
    key = "attention_groups_" + src_kind
    if key not in memo:
        rows = max(ix.rows[src_kind], ix.rows[CDST])
        ei = torch.stack([_source_rows(ix, src_kind), ix.move(CDST, EDGE, "dst")])
        memo[key] = Graph(ei, num_nodes=rows)
    return memo[key]


def _fit(t: Optional[torch.Tensor], rows: int) -> Optional[torch.Tensor]:
    """``t`` with zero rows appended up to ``rows`` (a copy only when it is short)."""
    if t is None or t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0],) + t.shape[1:])], 0)


def attention_graph(rows: AttentionRows, ix: GraphIndex) -> Graph:
    """The graph an attention step's op call traverses (see :class:`AttentionRows`)."""
    if rows.graph == "groups":
        return _group_graph(ix, rows.source)
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
        ix.memo[key] = make_plan(attention_graph(rows, ix), spec)
    return spec, ix.memo[key]


def _attention_by_dst_relation(step, roles, ix: GraphIndex, backend: str):
    """Attention whose destination term depends on the relation, without per-edge messages.

    The fused kernel runs on the derived graph of :func:`_group_graph`: each (dst, relation)
    row ``g`` is a destination whose ``a_dst`` is its own, and messages stay compact rows read
    through the derived edges' source ids.  It returns ``o_g``, softmax-weighted over the
    edges of ``g`` only.  The softmax over all of ``N(v)`` is then
    ``o_v = sum_g w_g o_g`` with ``w_g = sum_{e in g} alpha_e`` (``alpha``: the softmax over
    ``N(v)``), computed per edge on ``[E, H]`` scores (no feature axis).  Cost next to the
    per-edge path: ``[Sd, H, D]`` group outputs instead of two ``[E, H, D]`` copies and an
    ``[E + N, H, D]`` output."""
    body: Value = step.body
    g = ix.graph
    src_kind = step.spec[1].source

    def at_source(role):
        return _at_source(roles[role], src_kind, ix)

    v = at_source("v")
    a_src = at_source("a_src")[..., 0] if "a_src" in roles else None
    a_dst = roles["a_dst"][1][..., 0]
    if g.num_edges == 0:
        return v.new_zeros((g.num_nodes,) + tuple(v.shape[1:]))
    scale, slope = body.attr("scale"), body.attr("slope")
    grp = ix.move(CDST, EDGE, "dst")
    score = a_dst.index_select(0, grp)
    if a_src is not None:
        score = score + (a_src if src_kind == EDGE else
                         a_src.index_select(0, ix.move(src_kind, EDGE, "src")))
    if backend == "triton" and not (torch.is_grad_enabled() and score.requires_grad) \
            and not torch.compiler.is_compiling():
        # (the kernel has no autograd: the IR-autodiff forward runs without recording; it is
        # no custom op yet, so torch.compile traces the torch ops instead)
        alpha = edge_softmax_kernel(g, score.unsqueeze(-1), slope, backend=backend)
    else:
        if slope is not None:
            score = F.leaky_relu(score, slope)
        alpha = edge_softmax(score.unsqueeze(-1), ix.move(NODE, EDGE, "dst"), g.num_nodes)
    w = alpha.new_zeros((ix.rows[CDST],) + alpha.shape[1:]).index_add(0, grp, alpha)
    spec, plan = attention_launch(step, ix)
    dg = attention_graph(step.spec[1], ix)
    rows = dg.num_nodes
    o = edge_attention(dg, _fit(v, rows), a_src=_fit(a_src, rows), a_dst=_fit(a_dst, rows),
                       scale=scale, negative_slope=slope, backend=backend,
                       spec=spec, plan=plan)[:ix.rows[CDST]]
    node = ix.move(NODE, CDST, "dst")
    return o.new_zeros((g.num_nodes,) + tuple(o.shape[1:])).index_add(0, node, o * w)


def _at_source(role_value, src_kind, ix):
    """An attention operand on the source side the step runs on: as it is, per edge, or
    gathered from node rows onto compact (src, relation) rows."""
    val, t = role_value
    if val.kind == src_kind:
        return t
    if src_kind == EDGE:
        return edge_side(t, val, "src", ix)
    return t.index_select(0, ix.move(NODE, CSRC, "src"))


def run_attention(step, inputs: List[torch.Tensor], ix: GraphIndex, backend: str):
    """An attention step: the op called on the graph lowering chose (``step.spec``), with the
    spec and schedules of :func:`attention_launch`."""
    body: Value = step.body
    rows: AttentionRows = step.spec[1]
    roles = attention_roles(body, tuple(zip(body.args, inputs)))
    if rows.graph == "groups":
        return _attention_by_dst_relation(step, roles, ix, backend)
    scale, slope = body.attr("scale"), body.attr("slope")
    src_kind, p = rows.source, roles.get("p")

    def at_source(role):
        return _at_source(roles[role], src_kind, ix)

    v = at_source("v")
    if rows.score_on_edges:
        # The whole score is per edge; fold it into one source-side term.
        a_src = attention_score(body, inputs, ix)[..., 0]
        q = k = a_dst = None
    else:
        q = roles["q"][1] if "q" in roles else None
        k = at_source("k") if "k" in roles else None
        if k is not None and p is not None:   # p_r scales q.k: fold it into the keys
            k = k * _operand(p[1], p[0], src_kind, ix)
        a_src = at_source("a_src")[..., 0] if "a_src" in roles else None
        a_dst = roles["a_dst"][1][..., 0] if "a_dst" in roles else None
    spec, plan = attention_launch(step, ix)
    g = attention_graph(rows, ix)
    if rows.graph == "graph":
        return edge_attention(g, v, q, k, a_src, a_dst, scale=scale, negative_slope=slope,
                              backend=backend, spec=spec, plan=plan)
    S, N = v.shape[0], ix.graph.num_nodes
    out = edge_attention(g, _pad(v, 0, N), _pad(q, S, 0), _pad(k, 0, N), _pad(a_src, 0, N),
                         _pad(a_dst, S, 0), scale=scale, negative_slope=slope, backend=backend,
                         spec=spec, plan=plan)
    return out[S:]
