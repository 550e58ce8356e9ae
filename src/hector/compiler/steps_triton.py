"""The Triton backend's kernel templates as the compiler calls them.

* ``traversal`` steps whose spec has a :class:`~hector.compiler.plan.LinearTraversal` ->
  :func:`hector.kernels.traversal.op.traverse` on the movement chain's weighted CSR, composed
  once per graph (:func:`movement_csr`);
* ``gemm`` steps -> :func:`hector.kernels.segment_mm.op.segment_mm` (segment GEMM with
  gather/scatter);
* ``attention`` steps -> the ``hector::edge_attention`` op (:func:`edge_attention_triton`) and,
  differentiated as one operator, ``hector::edge_attention_backward``.  That op takes
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
schedules :func:`attention_launch` memoises per graph.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..graph import Graph
from ..graph.derived import AttentionGraph
from ..kernels.attention.custom_ops import edge_attention_grads_triton, edge_attention_triton
from ..kernels.attention.launch import overlap, rows_dense
from ..kernels.attention.plan import AttentionPlan, make_plan
from ..kernels.attention.spec import AttentionSpec
from ..kernels.eager import call
from ..kernels.edgewise.op import edgewise
from ..kernels.ptr import split_rows
from ..kernels.segment_mm.launch import (segment_mm_wgrad_csr_op, segment_mm_wgrad_op,
                                         segment_mm_wgrad_sums_op, segment_sums)
from ..kernels.segment_mm.op import segment_mm, segment_mm_csr, segment_mm_csr_scatter
from ..kernels.traversal.csr import (WeightedCSR, compose, from_groups, narrow_cols,
                                      one_per_row, resolve_layouts, scaled)
from ..kernels.traversal.op import edge_softmax as edge_softmax_kernel, traverse
from . import ir
from .ir import (CDST, CSRC, EDGE, NODE, WEIGHT, Op, Value, attention_of_bwd, attention_roles,
                 toposort)
from .lower import CSR_PIECE, edgewise_lowering, gemm_input, linear_traversal
from .plan import AttentionRows, RowSegments
from .steps_torch import (GraphIndex, _operand, attention_bwd_torch, eval_body,
                          fold_slice_sums)


def _host_bounds(ix: GraphIndex, rs, rows: int) -> List[int]:
    """The segment bounds of a GEMM step's rows, as Python ints (read from the graph once)."""
    if rs.segments == "relation":
        return ix.ptr[rs.rows if rs.rows in (EDGE, CSRC) else CDST]
    if rs.segments == "node_type":
        return ix.ptr[NODE]
    return [0, rows]


def _gemm_layout(ix: GraphIndex, rs, rows: int):
    """(seg_ptr as a tuple of Python ints, node permutation on the device or None) of a GEMM
    step, memoised on the graph's index.  Python ints, not a tensor: ``segment_mm`` would read
    a tensor on the host every call (a device sync for a device tensor; a data-dependent
    value that ends a ``torch.compile`` graph for any tensor)."""
    key = ("gemm_layout", rs.rows, rs.segments, rows)
    if key not in ix.memo:
        perm = ix.node_perm if rs.segments == "node_type" else None
        ix.memo[key] = (tuple(_host_bounds(ix, rs, rows)), perm)
    return ix.memo[key]


def _csr_order(ix: GraphIndex, rs, m: WeightedCSR) -> torch.Tensor:
    """The CSR prologue's row order: within each weight segment, rows by length (stable), so
    a tile's rows walk about as many entries each (the kernel runs a tile for its longest
    row).  One device sort per graph, memoised; nothing read on the host."""
    key = ("csr_prologue_order", rs.rows, rs.segments, rs.csr)
    if key not in ix.memo:
        # (rows of a kind are stored by relation: its relation is its segment)
        seg = (ix.relation(rs.rows) if rs.segments == "relation"
               else torch.zeros(m.rows, dtype=torch.int64, device=m.ptr.device))
        order = torch.argsort(seg * (m.nnz + 1) + (m.ptr[1:] - m.ptr[:-1]), stable=True)
        ix.memo[key] = order.to(torch.int32 if m.rows < 2 ** 31 else torch.int64)
    return ix.memo[key]


def _pieces(ix: GraphIndex, kind: str, segments: Optional[str], m: WeightedCSR, key):
    """(piece_ptr, piece of each GEMM row, original CSR row of each GEMM row, segment
    bounds as ints) of ``m`` (rows of ``kind``, stored by relation) cut into pieces of at
    most :data:`~hector.compiler.lower.CSR_PIECE` entries (:func:`split_rows`), the pieces
    ordered by length within each segment: what a CSR prologue or epilogue walks where the
    rows' sums meet linearly afterwards (no tile walks a hub alone).  Memoised per graph;
    two host reads once (the piece count, the segment bounds)."""
    key = ("csr_pieces", kind, segments, key)
    if key not in ix.memo:
        piece_ptr, row_of = split_rows(m.ptr, CSR_PIECE)
        if segments == "relation":
            seg = ix.relation(kind).index_select(0, row_of)
            count = len(ix.ptr[kind if kind in (EDGE, CSRC) else CDST]) - 1
        else:
            seg, count = torch.zeros_like(row_of), 1
        order = torch.argsort(seg * (CSR_PIECE + 1) + (piece_ptr[1:] - piece_ptr[:-1]),
                              stable=True)
        bounds = torch.cumsum(torch.bincount(seg, minlength=count), 0).tolist()
        small = torch.int32 if row_of.numel() < 2 ** 31 else torch.int64
        ix.memo[key] = (piece_ptr, order.to(small), row_of.index_select(0, order),
                        (0,) + tuple(bounds))
    return ix.memo[key]


def run_gemm(step, x: torch.Tensor, w: torch.Tensor, ix: GraphIndex, backend: str,
             bias: Optional[torch.Tensor] = None, addend: Optional[torch.Tensor] = None,
             extra_weight: Optional[torch.Tensor] = None):
    """A typed-linear step on the segment GEMM template; ``bias``: the weight row ``fuse``
    made its epilogue (sliced as ``w`` is); ``addend``: the node rows it adds to each output
    row (its addend epilogue); ``extra_weight``: the shared ``V`` of its extra product
    (``GemmSpec.extra_cols``: returns ``(y, y V)``).  A CSR prologue (``rs.csr``) sums the
    input rows in the kernel; on a CSR with hub rows (longer than the traversal's chunk: a
    tile would walk a hub's entries alone) the traversal kernel sums them first instead."""
    gs, rs = step.spec     # (gs.prologue: the kernel applies it to the x tiles it loads)
    if addend is not None and (rs.csr is not None or rs.per_head or rs.scatter is not None):
        raise ValueError("an addend epilogue needs a GEMM whose rows are stored once, without "
                         "a CSR prologue and not per head: fuse gives it to no other")
    if rs.csr_out is not None:
        return _run_csr_epilogue(step, rs, x, w, ix, backend)
    if rs.csr is not None:
        _, movements, coef = rs.csr
        m = movement_csr(ix, movements, coef)
        rows_in = x.reshape(x.shape[0], -1)
        if rs.pieces:
            return _run_csr_pieces(step, rs, rows_in, w, ix, backend, m, (movements, coef))
        if m.layout.num_chunks:
            return _run_gemm(step, rs, traverse(m, rows_in, backend="triton"), w, ix,
                             backend, bias)
        weight = w if rs.segments is not None else w.unsqueeze(0)
        ptr, _ = _gemm_layout(ix, rs, m.rows)
        order = _csr_order(ix, rs, m)
        scatter, num_out = _out_rows(ix, rs, m.rows, order)
        out = segment_mm_csr(rows_in.contiguous(), weight.contiguous(), ptr, m.ptr, m.col,
                             m.val, gather=order, scatter=scatter, num_out_rows=num_out,
                             transpose_weight=rs.transpose_weight, backend=backend,
                             gather_unique=True, scatter_unique=rs.scatter is None,
                             bias=None if bias is None else bias.reshape(weight.shape[0], -1))
        return out.reshape((num_out,) + tuple(step.output.shape))
    return _run_gemm(step, rs, x, w, ix, backend, bias, addend, extra_weight)


def _piece_index(ix: GraphIndex, kind: str, segments: Optional[str], m: WeightedCSR, key,
                 one: str, end: str) -> torch.Tensor:
    """The ``one`` row (by ``end``) of each GEMM row of :func:`_pieces` (same arguments):
    ``ix.move(one, kind, end)`` read through the pieces' rows, memoised per graph (a
    pieces-long gather per call otherwise: 89 us of wikikg2's 5.8 ms RGCN forward)."""
    memo_key = ("csr_piece_index", kind, segments, key, one, end)
    if memo_key not in ix.memo:
        row_of = _pieces(ix, kind, segments, m, key)[2]
        ix.memo[memo_key] = ix.move(one, kind, end).index_select(0, row_of)
    return ix.memo[memo_key]


def _run_csr_pieces(step, rs, x: torch.Tensor, w: torch.Tensor, ix: GraphIndex, backend: str,
                    m: WeightedCSR, key) -> torch.Tensor:
    """A CSR-prologue GEMM whose output rows its scatter epilogue sums (and no bias): its
    rows are cut into short pieces (:func:`_pieces`), each summed, multiplied and added
    into the node row of its row -- the same sum, as the product is linear."""
    piece_ptr, order, _, bounds = _pieces(ix, rs.rows, rs.segments, m, key)
    weight = w if rs.segments is not None else w.unsqueeze(0)
    node = _piece_index(ix, rs.rows, rs.segments, m, key, NODE, rs.scatter[1])
    out = segment_mm_csr(x.contiguous(), weight.contiguous(), bounds, piece_ptr, m.col, m.val,
                         gather=order, scatter=node, num_out_rows=ix.rows[NODE],
                         transpose_weight=rs.transpose_weight, backend=backend,
                         gather_unique=True)
    return out.reshape((ix.rows[NODE],) + tuple(step.output.shape))


def _run_csr_epilogue(step, rs, x: torch.Tensor, w: torch.Tensor, ix: GraphIndex,
                      backend: str) -> torch.Tensor:
    """A GEMM with a CSR scatter epilogue (``rs.csr_out``): its logical rows (``rs.rows``,
    read through ``rs.gather`` from ``x``'s rows) multiplied and added into the node rows
    of the chain's CSR, transposed so that its rows are the GEMM's (the forward's CSR when
    the chain is a forward's reversed: one build per graph), rows cut into pieces."""
    movements, coef = rs.csr_out
    key = (_reversed_chain(movements), coef)
    m = movement_csr(ix, *key)     # rows: the GEMM's
    piece_ptr, order, row_of, bounds = _pieces(ix, rs.rows, rs.segments, m, key)
    weight = w if rs.segments is not None else w.unsqueeze(0)
    rows_in = x.flatten(1)
    gather = (row_of if rs.gather is None
              else _piece_index(ix, rs.rows, rs.segments, m, key, *rs.gather))
    out = segment_mm_csr_scatter(rows_in.contiguous(), weight.contiguous(), bounds, piece_ptr,
                                 m.col, m.val, rows=order, num_out_rows=m.cols, gather=gather,
                                 transpose_weight=rs.transpose_weight, backend=backend)
    return out.reshape((m.cols,) + tuple(step.output.shape))


def _out_rows(ix: GraphIndex, rs, rows: int, perm: Optional[torch.Tensor]):
    """(scatter index, output rows) of a GEMM step's ``rows`` logical rows: ``perm`` (a
    permutation, or None) stores them; a scatter epilogue (``rs.scatter``) sums them into
    their node rows (through ``perm`` when the rows are read permuted)."""
    if rs.scatter is None:
        return perm, rows
    node = ix.move(NODE, rs.rows, rs.scatter[1])
    return (node if perm is None else node.index_select(0, perm.long())), ix.rows[NODE]


def _run_gemm(step, rs, x: torch.Tensor, w: torch.Tensor, ix: GraphIndex, backend: str,
              bias: Optional[torch.Tensor] = None, addend: Optional[torch.Tensor] = None,
              extra_weight: Optional[torch.Tensor] = None):
    gs = step.spec[0]
    gather = None
    if rs.gather is not None:   # x holds the source rows; the GEMM reads them by index
        gather = ix.move(rs.gather[0], rs.rows, rs.gather[1])
    rows = x.shape[0] if gather is None else gather.shape[0]
    weight = w if rs.segments is not None else w.unsqueeze(0)
    # Every scatter here is a permutation (the head-major order, node_perm), and so is every
    # read index but a row gather: rows are stored once, never summed into zeros.
    if rs.per_head:
        H = x.shape[1]
        ptr, read, write = _head_major_layout(ix, rs, rows, H, gather)
        S = weight.shape[0]
        weight = weight.transpose(0, 1).reshape((H * S,) + tuple(weight.shape[2:]))
        out = segment_mm(x.reshape(-1, x.shape[-1]).contiguous(), weight.contiguous(), ptr,
                         gather=read, scatter=write, num_out_rows=H * rows,
                         transpose_weight=rs.transpose_weight, backend=backend,
                         gather_unique=gather is None, scatter_unique=True,
                         prologue=gs.prologue)
        return out.reshape((rows,) + tuple(step.output.shape))
    ptr, perm = _gemm_layout(ix, rs, rows)
    if bias is not None:
        bias = bias.reshape(weight.shape[0], -1)
    # (a scatter epilogue comes only with relation or no segments: perm is None then)
    scatter, num_out = _out_rows(ix, rs, rows, perm)
    out = segment_mm(x.flatten(1).contiguous(), weight.contiguous(), ptr,   # (flatten: 0 rows ok)
                     gather=perm if gather is None else gather, scatter=scatter,
                     num_out_rows=num_out if scatter is not None else None,
                     transpose_weight=rs.transpose_weight, backend=backend,
                     gather_unique=gather is None, scatter_unique=rs.scatter is None, bias=bias,
                     prologue=gs.prologue,
                     addend=None if addend is None else addend.reshape(num_out, -1),
                     extra_weight=extra_weight)
    if extra_weight is not None:
        out, more = out
        return (out.reshape((num_out,) + tuple(step.output.shape)),
                more.reshape((num_out,) + tuple(step.extra.shape)))
    return out.reshape((num_out,) + tuple(step.output.shape))


def _head_major_layout(ix: GraphIndex, rs, rows: int, heads: int, gather):
    """(segment bounds, read index, write index) of a per-head GEMM, memoised: the GEMM's
    logical rows are head-major ``(h, j)`` (one segment per (head, slice)), and it reads row
    ``g(r) * H + h`` of the ``[X * H, K]`` input and writes row ``r * H + h`` of the
    ``[rows * H, N]`` output (``r`` the j-th row in segment order, ``g`` the step's gather):
    no gathered copy of the input and no transposes, in or out."""
    key = ("head_major", rs.rows, rs.segments, rs.gather, rows, heads)
    if key not in ix.memo:
        ptr, perm = _gemm_layout(ix, rs, rows)
        bounds = [h * rows + b for h in range(heads) for b in ptr[:-1]] + [heads * rows]
        device = ix.graph.device
        r = perm.long() if perm is not None else torch.arange(rows, device=device)
        src = gather.long().index_select(0, r) if gather is not None else r
        h = torch.arange(heads, device=device).view(-1, 1)
        ix.memo[key] = (tuple(bounds), (src.view(1, -1) * heads + h).reshape(-1),
                        (r.view(1, -1) * heads + h).reshape(-1))
    return ix.memo[key]


def _wgrad_layout(ix: GraphIndex, kind: str, per, rows: int, heads: int, gather=None):
    """(segment bounds as a tuple of ints, read index of x's rows, read index of dy's rows;
    indices on the device or None) of a weight gradient over ``rows`` rows of ``kind``.
    ``gather``: (x's row kind, endpoint) when x holds the rows the gradient's rows are
    gathered from (read in place).  With ``heads`` > 0 the rows are head-major ``(h, j)``,
    read from ``[rows * H, .]`` views (see :func:`_head_major_layout`)."""
    seg = "relation" if per == "relation" else "node_type" if per == "node_type" else None
    rs = RowSegments(rows=kind, segments=seg, per_head=bool(heads), transpose_weight=False,
                     gather=gather)
    index = None if gather is None else ix.move(gather[0], kind, gather[1])
    if heads:
        return _head_major_layout(ix, rs, rows, heads, index)
    bounds, perm = _gemm_layout(ix, rs, rows)
    # (A gather comes only with relation or no segments: then there is no node permutation.)
    return bounds, perm if index is None else index, perm


def run_wgrad(step, x: torch.Tensor, dy: torch.Tensor, ix: GraphIndex) -> torch.Tensor:
    """A weight-gradient step ``dW[s] = sum_{r in s} x_r^T dy_r`` on the segment GEMM's
    ``segment_mm_wgrad`` kernel: one launch for all slices (the torch backend loops over
    them in Python, one small matmul per relation).  Same segments as the forward GEMM:
    relation pointers of the rows' kind, node-type pointers with ``node_perm`` as gather and
    scatter, or one segment; per-head weights make each (head, slice) a segment.  When the
    step's x is a gather of node rows (fusion folded it), ``x`` holds the node rows and the
    kernel reads them by index: no gathered copy; the same for dy."""
    v = step.body
    if v.args[0].op == Op.SCATTER:     # a CSR prologue (fuse): the summed rows rebuilt
        return _run_wgrad_csr(step, x, dy, ix)
    headwise = len(v.shape) == 3
    xv, prologue = gemm_input(v.args[0])     # (a prologue: the kernel applies it to x tiles)
    prologue = prologue or ""
    gather = (xv.args[0].kind, xv.attr("end")) if xv.op == Op.GATHER else None
    dv = v.args[1]                           # (a gather of node rows: read in place too)
    dy_index = ix.move(dv.args[0].kind, dv.kind, dv.attr("end")) if dv.op == Op.GATHER else None
    rows = dy.shape[0] if dy_index is None else dy_index.shape[0]
    H = x.shape[1] if headwise else 0
    bounds, read_x, read_dy = _wgrad_layout(ix, xv.kind, v.per, rows, H, gather)
    if dy_index is not None:   # (fuse: relation or no segments, so no node permutation)
        read_dy = dy_index
    if headwise:   # rows (r, h) in place; the head-major order is in the index
        xin, dyin = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    else:
        xin, dyin = x.flatten(1), dy.flatten(1)   # (flatten: fine with 0 rows)
    K, N = xin.shape[1], dyin.shape[1]
    S = len(bounds) - 1
    # A custom op (hector::segment_mm_wgrad), so that torch.compile does not trace the launch.
    if step.extra is not None:      # and the bias gradient of the same dy (lower pairs them)
        dw, db = call(segment_mm_wgrad_sums_op, xin.contiguous(), dyin.contiguous(), read_x,
                      read_dy, list(bounds), prologue)
        db = fold_slice_sums(step.extra.attr("body"), db.view((S,) + tuple(dy.shape[1:])))
        return (dw[0] if v.per is None else dw), (db[0] if v.per is None else db)
    dw = call(segment_mm_wgrad_op, xin.contiguous(), dyin.contiguous(), read_x, read_dy,
              list(bounds), prologue)
    if headwise:   # [(head, slice), K, N] -> [slice, head, K, N]
        dw = dw.view(H, S // H, K, N).transpose(0, 1).contiguous()
    return dw[0] if v.per is None else dw


def _run_wgrad_csr(step, x: torch.Tensor, dy: torch.Tensor, ix: GraphIndex):
    """A weight gradient whose x rows are CSR sums of ``x`` (fuse's CSR prologue, RGCN's
    mean per (destination, relation) in the backward): ``hector::segment_mm_wgrad_csr``
    sums each row as it loads it, over the rows cut into pieces (the gradient is linear
    in them), so the rows are neither saved by the forward nor rebuilt in memory."""
    v = step.body
    (_, movements, coef), = linear_traversal(v.args[0])[0].sources
    kind = v.args[0].kind
    m = movement_csr(ix, movements, coef)
    piece_ptr, order, row_of, bounds = _pieces(ix, kind, v.per, m, (movements, coef))
    dv = v.args[1]
    dy_index = ix.move(dv.args[0].kind, dv.kind, dv.attr("end")) if dv.op == Op.GATHER else None
    dyin = dy.flatten(1).contiguous()
    read_dy = (row_of if dy_index is None else _piece_index(
        ix, kind, v.per, m, (movements, coef), dv.args[0].kind, dv.attr("end")))
    dw = call(segment_mm_wgrad_csr_op, x.flatten(1).contiguous(), dyin, piece_ptr, m.col,
              m.val, order, read_dy, list(bounds))
    dw = dw[0] if v.per is None else dw
    if step.extra is None:
        return dw
    # The bias gradient sums each row's dy once: over the rows, not their pieces.
    rows = dyin.shape[0] if dy_index is None else dy_index.shape[0]
    orig, _, _ = _wgrad_layout(ix, kind, v.per, rows, 0)
    db = segment_sums(dyin, orig, dy_index)
    db = fold_slice_sums(step.extra.attr("body"), db.view((len(orig) - 1,) + tuple(dy.shape[1:])))
    return dw, (db[0] if v.per is None else db)


def run_wsum(step, dy: torch.Tensor, ix: GraphIndex) -> torch.Tensor:
    """A bias gradient per node type or relation, ``db[t] = sum of dy's rows of slice t``
    (:func:`~hector.kernels.segment_mm.launch.segment_sums`: one launch, through
    ``node_perm`` when node types are not contiguous; relation rows are sorted by
    relation)."""
    rows = step.body.args[0]
    bounds, _, read_dy = _wgrad_layout(ix, rows.kind, step.body.per, dy.shape[0], 0)
    s = segment_sums(dy.flatten(1), bounds, read_dy)
    return fold_slice_sums(step.body, s.view((len(bounds) - 1,) + tuple(dy.shape[1:])))


def _movement_weight(ix: GraphIndex, move: tuple) -> Optional[torch.Tensor]:
    """``[many]`` weight of each moved row: ``1 / count`` of its ``one`` row for a mean,
    None (1) otherwise."""
    _, one, many, end, how = move
    if how != "mean":
        return None
    return ix.counts(one, many, end).index_select(0, ix.move(one, many, end)).reciprocal()


def _movement_factor(ix: GraphIndex, move: tuple) -> WeightedCSR:
    """One gather (``[many, one]``, an entry per ``many`` row) or scatter (``[one, many]``) as
    a weighted CSR; a mean weighs each entry by ``1 / count`` of its ``one`` row."""
    op, one, many, end, how = move
    idx, val = ix.move(one, many, end), _movement_weight(ix, move)
    if op == "gather":
        return one_per_row(idx, val, ix.rows[one])
    ptr, perm = ix.grouped(one, many, end)
    return from_groups(ptr, perm, val, ix.rows[one], ix.rows[many])


def _through_rows(ix: GraphIndex, movements: tuple) -> Optional[WeightedCSR]:
    """A gather onto ``many`` rows then a scatter off them (RGCN's source rows onto edges,
    then a mean per (destination, relation); its backward's reverse): one entry per ``many``
    row, in the scatter's grouping, which the graph holds (by destination: its CSR; by
    compact destination row: canonical order) or sorts once.  No composition: that sorted
    every entry by (row, column) and merged repeats (a parallel edge's entry stays apart here
    and adds the same term), four times the index work of a new mini-batch's plan.  None for
    another chain."""
    if len(movements) != 2:
        return None
    (op1, one1, many1, end1, _), (op2, one2, many2, end2, _) = movements
    if (op1, op2) != ("gather", "scatter") or many1 != many2:
        return None
    ptr, perm = ix.grouped(one2, many2, end2)
    col = ix.move(one1, many1, end1).index_select(0, perm)
    w1, w2 = (_movement_weight(ix, m) for m in movements)
    val = w1 if w2 is None else w2 if w1 is None else w1 * w2
    val = (torch.ones(perm.numel(), dtype=torch.float32, device=perm.device) if val is None
           else val.index_select(0, perm))
    return WeightedCSR(ptr, narrow_cols(col, ix.rows[one1]), val.contiguous(), ix.rows[one2],
                       ix.rows[one1])


def movement_csr(ix: GraphIndex, movements: tuple, coef: float = 1.0) -> WeightedCSR:
    """``coef`` times the product of a traversal's movements (innermost first) as one
    weighted CSR: built from the graph's index arrays on the first call, memoised on the
    graph's index."""
    key = ("traversal_csr", movements, coef)
    if key not in ix.memo:
        # A backward's chain is often a forward's reversed: its CSR is that one transposed,
        # bit for bit when there are two movements (each entry sums the same products over
        # the one middle row, in the same order), for one sort instead of a composition.
        mirror = (ix.memo.get(("traversal_csr", _reversed_chain(movements), coef))
                  if len(movements) == 2 else None)
        if mirror is not None:
            ix.memo[key] = mirror.transpose()
        else:
            m = _through_rows(ix, movements)
            for move in movements if m is None else ():
                f = _movement_factor(ix, move)
                m = f if m is None else compose(f, m)
            ix.memo[key] = scaled(m, coef) if coef != 1.0 else m
    return ix.memo[key]


def _reversed_chain(movements: tuple) -> tuple:
    """The chain whose weighted CSR is the transpose of ``movements``' one: reversed, each
    gather a scatter and back (a mean keeps its ``1 / count`` weights)."""
    flip = {("gather", None): ("scatter", "sum"), ("scatter", "sum"): ("gather", None),
            ("gather", "mean"): ("scatter", "mean"), ("scatter", "mean"): ("gather", "mean")}
    return tuple(flip[(op, how)][:1] + (one, many, end) + flip[(op, how)][1:]
                 for op, one, many, end, how in reversed(movements))


def prepare_traversals(plans, ix: GraphIndex) -> None:
    """Build the weighted CSRs of every movement-and-addition traversal among ``plans``'
    steps (each a plan's step list) and find all their row bins with one host read, before
    any runs: each CSR read its own on its first launch, a device sync each on CUDA (RGCN's
    forward launches two per layer, the mean per (destination, relation) and the sum over
    relations).  Once per (plan, graph): a later call finds the CSRs memoised and their bins
    set.  A forward that records for its backward passes both plans, so the backward reads
    nothing: with several GPUs a read there would wait for the gradient all-reduces DDP has
    started, and so for the slowest rank, in the middle of every step."""
    csrs = []
    for steps in plans:
        key = ("traversals_prepared", id(steps))
        if key in ix.memo:
            continue
        ix.memo[key] = True
        for step in steps:
            spec = step.spec
            if step.template != "traversal" or spec.kernel is None \
                    or spec.edgewise is not None or spec.softmax is not None:
                continue
            csrs += [movement_csr(ix, movements, coef)
                     for _, movements, coef in spec.linear.sources]
    resolve_layouts(csrs)


def run_traversal(step, inputs: List[torch.Tensor], ix: GraphIndex) -> torch.Tensor:
    """A movement-and-addition traversal on the ``traversal_csr`` kernel: rows read in place
    through each source's composed CSR; the addends and the bias are fused into the first
    launch, and each further source adds onto the previous launch's output."""
    if step.spec.edgewise is not None:
        return run_edgewise(step, inputs, ix)
    if step.spec.softmax is not None:
        index, slope = step.spec.softmax
        # (the op is differentiable: torch autodiff may record it too)
        return edge_softmax_kernel(ix.graph, inputs[index], slope, backend="triton")
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


def edgewise_array(ix: GraphIndex, key: tuple) -> torch.Tensor:
    """An index array an ``edgewise`` program reads (see
    :class:`~hector.compiler.plan.EdgewiseLowering`), built once per graph: the CSR grouping
    ``many`` rows by their ``one`` row is a stable sort of the movement index."""
    if key[0] == "move":
        return ix.move(*key[1:])
    if key[0] == "relation":
        return ix.relation(key[1])
    if key[0] == "node_type":
        return ix.node_type()
    memo = ("edgewise_csr",) + key[1:]
    if memo not in ix.memo:
        ix.memo[memo] = ix.grouped(*key[1:])
    return ix.memo[memo][0 if key[0] == "csr_ptr" else 1]


def _edgewise_input(ix: GraphIndex, inputs: List[torch.Tensor], x) -> torch.Tensor:
    if isinstance(x, int):
        return inputs[x]
    return ix.counts(*x[1:])      # ("counts", one, many, end): a mean's divisor per row


def _promoted(tensors: List[torch.Tensor]) -> torch.dtype:
    """The dtype torch ops would give the statements' result (bf16 rows times an fp32
    operand is fp32), so both backends store the same precision."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def run_edgewise(step, inputs: List[torch.Tensor], ix: GraphIndex) -> torch.Tensor:
    """A traversal step on the generated ``edgewise`` kernel: its statements fused, every
    operand read through its access scheme inside the kernel.  The kernel has no autograd:
    when torch autograd records (``autodiff='torch'``), the step runs as torch ops."""
    ew = step.spec.edgewise
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return eval_body(step.body, inputs, ix)
    ins = [_edgewise_input(ix, inputs, x) for x in ew.inputs]
    out = edgewise(ew.program, ins, [edgewise_array(ix, k) for k in ew.arrays],
                   ix.rows[ew.rows], _promoted(ins), backend="triton")
    return out.reshape((out.shape[0],) + tuple(step.output.shape))


def _bias_row(step, t: torch.Tensor, index: int, ix: GraphIndex) -> torch.Tensor:
    """The bias weight as one output row, broadcast the way the torch backend's ``add`` does."""
    arg = next(b for b in toposort([step.body]) if b.op == Op.ARG and b.attr("index") == index)
    return _operand(t, arg, step.body.kind, ix).expand((1,) + tuple(step.body.shape)).reshape(-1)


def _derived_graph(ix: GraphIndex, src_kind: str):
    """The bipartite graph (source rows of ``src_kind``) -> (nodes), memoised.  Sources and
    destinations share the id range ``[0, max(S, N))`` (the kernels read each operand only
    in its own role), and the graph says each side's rows
    (``num_src``, ``num_dst``): operands, outputs and gradients have exactly their side's
    rows, no padding and no copy-out (offset destination ids needed a copy of every operand:
    on synthetic mag, HGT's ``[S, H, D]`` keys and values, 9 ms of ``cat`` per step)."""
    g = ix.graph

    def build():
        rows = max(ix.rows[src_kind], g.num_nodes)
        return AttentionGraph(_source_rows(ix, src_kind), g.dst.long(), rows,
                              dst_order=g.csr_in.eid, num_src=ix.rows[src_kind],
                              num_dst=g.num_nodes)
    return g.derived("attention_sources_" + src_kind, build)


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
        ix.memo[key] = make_plan(attention_graph(rows, ix), spec)
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


def _program(body: Value):
    """(``body``, its edgewise lowering): what :func:`run_edgewise_body` runs."""
    lowered, why = edgewise_lowering(body)
    if lowered is None:
        raise ValueError(f"edgewise: cannot lower {body!r}: {why}")
    return body, lowered


def run_edgewise_body(program, tensors: List[torch.Tensor], ix: GraphIndex) -> torch.Tensor:
    """An IR expression the runtime builds itself (``program``: from :func:`_program`, its
    ``arg`` i bound to ``tensors[i]``) on the edgewise kernel; with torch ops while torch
    autograd records (the kernel has no autograd of its own)."""
    body, ew = program
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return eval_body(body, tensors, ix)
    out = edgewise(ew.program, [_edgewise_input(ix, tensors, x) for x in ew.inputs],
                   [edgewise_array(ix, k) for k in ew.arrays], ix.rows[ew.rows],
                   _promoted(tensors), backend="triton")
    return out.reshape((out.shape[0],) + tuple(body.shape))


def run_attention(step, inputs: List[torch.Tensor], ix: GraphIndex, backend: str):
    """An attention step: the op called on the graph lowering chose (``step.spec``), with the
    spec and schedules of :func:`attention_launch`.  Returns (out, log-sum-exp ``[N, H]``)."""
    body: Value = step.body
    rows: AttentionRows = step.spec[1]
    roles = attention_roles(body, tuple(zip(body.args, inputs)))
    scale, slope = body.attr("scale"), body.attr("slope")
    terms = _attention_terms(step, roles, ix)
    spec, plan = attention_launch(step, ix)
    g = attention_graph(rows, ix)
    return edge_attention_triton(g, *terms, scale=scale, negative_slope=slope, spec=spec,
                                 plan=plan, return_lse=True, dst_index=_dst_index(rows, ix),
                                 bias=_bias(roles, terms[0]))


def _bias(roles, v: torch.Tensor) -> Optional[torch.Tensor]:
    """The epilogue bias ``[H, Dv]`` of an attention step (its ``bias`` role), or None."""
    return roles["bias"][1].reshape(v.shape[1:]) if "bias" in roles else None


def _dst_index(rows: AttentionRows, ix: GraphIndex) -> Optional[torch.Tensor]:
    """Each edge's (dst, relation) row, where the destination term lives on those rows and
    the kernels read it per edge (``rows.dst_edge``); else None.  Indexed by the op graph's
    edge ids (the kernels read it through their CSR's): the graph's canonical edges, or a
    derived graph's, one per canonical edge in its own order (``edge_perm``); memoised."""
    if not rows.dst_edge:
        return None
    g, edge_row = ix.graph, ix.graph.compact_dst.edge_row
    if rows.graph == "graph":
        return edge_row
    return g.derived("attention_dst_rows_" + rows.source, lambda: torch.index_select(
        edge_row, 0, attention_graph(rows, ix).edge_perm.long()))


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
    grads = edge_attention_grads_triton(
        g, spec, plan, flags, grad, *terms, out, lse, att.attr("scale"), att.attr("slope"),
        dst_index=_dst_index(step.spec[1], ix), joint_kv=joint, bias=_bias(roles, terms[0]),
        into_kv=_into_kv(terms, flags, [inputs[i] for i in donated]))
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
