"""``gemm`` steps on the Triton backend -> :func:`hector.kernels.segment_mm.op.segment_mm`
(segment GEMM with gather/scatter), and its variants: a CSR prologue summing the input rows
through a movement chain's weighted CSR (:func:`~.traversal.movement_csr`), rows cut into
pieces where the sums meet linearly afterwards (:func:`_pieces`); a CSR scatter epilogue
(:func:`_run_csr_epilogue`); per-head GEMMs that read and write ``[rows, H, D]`` in place
through head-major gather/scatter indices (:func:`_head_major_layout`).  Weight gradients
(:func:`run_wgrad`, the ``hector::segment_mm_wgrad*`` ops, with a CSR prologue too) and bias
gradients per node type or relation (:func:`run_wsum`).  Segment bounds are Python ints
(a capacity block's: :class:`~hector.kernels.sizes.DeviceBounds`, which the kernels read on
the device) and row orders device tensors, memoised on the graph's index.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...kernels.eager import call
from ...kernels.ptr import split_rows
from ...kernels.segment_mm.bounds import as_bounds, num_segments, op_args
from ...kernels.segment_mm.head_blocks import MAX_PARTS, head_blocks
from ...kernels.segment_mm.custom_ops import (segment_mm_wgrad_csr_op, segment_mm_wgrad_op,
                                              segment_mm_wgrad_sums_op, segment_sums)
from ...kernels.segment_mm.op import segment_mm, segment_mm_csr, segment_mm_csr_scatter
from ...kernels.sizes import DeviceBounds
from ...kernels.traversal.csr import WeightedCSR
from ...kernels.traversal.op import traverse
from ..ir import CDST, CSRC, EDGE, NODE, Op, Value
from ..lower_gemm import CSR_PIECE, gemm_input
from ..lower_traversal import linear_traversal
from ..plan import RowSegments
from ..steps_torch import GraphIndex, fold_slice_sums
from .traversal import _reversed_chain, movement_csr


def _host_bounds(ix: GraphIndex, rs, rows: int):
    """The segment bounds of a GEMM step's rows, as Python ints (read from the graph once),
    or a capacity block's device bounds."""
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
        ix.memo[key] = (as_bounds(_host_bounds(ix, rs, rows)), perm)
    return ix.memo[key]


def _seg(bounds):
    """(``seg_ptr``, keyword arguments) of ``segment_mm`` for a step's bounds: device
    bounds go as the device pointers and their capacity."""
    if isinstance(bounds, DeviceBounds):
        return bounds.ptr, {"capacity": bounds.capacity}
    return bounds, {}


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
    most :data:`~hector.compiler.lower_gemm.CSR_PIECE` entries (:func:`split_rows`), the pieces
    ordered by length within each segment: what a CSR prologue or epilogue walks where the
    rows' sums meet linearly afterwards (no tile walks a hub alone).  Memoised per graph;
    two host reads once (the piece count, the segment bounds)."""
    key = ("csr_pieces", kind, segments, key)
    if key not in ix.memo:
        piece_ptr, row_of = split_rows(m.ptr, CSR_PIECE)
        if segments == "relation":
            seg = ix.relation(kind).index_select(0, row_of)
            count = num_segments(ix.ptr[kind if kind in (EDGE, CSRC) else CDST])
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
        ptr, kw = _seg(ptr)
        out = segment_mm(x.reshape(-1, x.shape[-1]).contiguous(), weight.contiguous(), ptr,
                         gather=read, scatter=write, num_out_rows=H * rows,
                         transpose_weight=rs.transpose_weight, backend=backend,
                         gather_unique=gather is None, scatter_unique=True,
                         prologue=gs.prologue, **kw)
        return out.reshape((rows,) + tuple(step.output.shape))
    ptr, perm = _gemm_layout(ix, rs, rows)
    if bias is not None:
        bias = bias.reshape(weight.shape[0], -1)
    # (a scatter epilogue comes only with relation or no segments: perm is None then)
    scatter, num_out = _out_rows(ix, rs, rows, perm)
    ptr, kw = _seg(ptr)
    out = segment_mm(x.flatten(1).contiguous(), weight.contiguous(), ptr,   # (flatten: 0 rows ok)
                     gather=perm if gather is None else gather, scatter=scatter,
                     num_out_rows=num_out if scatter is not None else None,
                     transpose_weight=rs.transpose_weight, backend=backend,
                     gather_unique=gather is None, scatter_unique=rs.scatter is None, bias=bias,
                     prologue=gs.prologue,
                     addend=None if addend is None else addend.flatten(1),   # (0 rows ok)
                     extra_weight=extra_weight, **kw)
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
        device = ix.graph.device
        if isinstance(ptr, DeviceBounds):    # (each head's rows past ptr[-1] join its last)
            starts = (ptr.ptr[:-1].long().view(1, -1)
                      + rows * torch.arange(heads, device=device).view(-1, 1)).reshape(-1)
            bounds = DeviceBounds(torch.cat([starts, starts.new_full((1,), heads * rows)]),
                                  heads * rows)
        else:
            bounds = tuple([h * rows + b for h in range(heads) for b in ptr[:-1]]
                           + [heads * rows])
        r = perm.long() if perm is not None else torch.arange(rows, device=device)
        src = gather.long().index_select(0, r) if gather is not None else r
        h = torch.arange(heads, device=device).view(-1, 1)
        ix.memo[key] = (bounds, (src.view(1, -1) * heads + h).reshape(-1),
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
        return _transposed(v, _run_wgrad_csr(step, x, dy, ix))
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
    S = num_segments(bounds)
    host, seg_ptr = op_args(bounds)
    # A custom op (hector::segment_mm_wgrad), so that torch.compile does not trace the launch.
    # (a weight stored transposed, [N, K]: the kernel stores dW in that layout)
    flip = bool(v.attr("transposed")) and not headwise
    if step.extra is not None:      # and the bias gradient of the same dy (lower pairs them)
        dw, db = call(segment_mm_wgrad_sums_op, xin.contiguous(), dyin.contiguous(), read_x,
                      read_dy, host, prologue, seg_ptr, flip)
        db = fold_slice_sums(step.extra.attr("body"), db.view((S,) + tuple(dy.shape[1:])))
        return (dw[0] if v.per is None else dw), (db[0] if v.per is None else db)
    dw = call(segment_mm_wgrad_op, xin.contiguous(), dyin.contiguous(), read_x, read_dy,
              host, prologue, seg_ptr, flip)
    if headwise:   # [(head, slice), K, N] -> [slice, head, K, N]
        dw = _transposed(v, dw.view(H, S // H, K, N).transpose(0, 1))
    return dw[0] if v.per is None else dw


def _transposed(v: Value, dw):
    """A weight gradient in the layout its weight is stored in: ``dw`` (or, paired with a
    bias gradient, its first) turned around for a ``transposed`` one the kernel did not
    store so, else as it is (contiguous)."""
    if isinstance(dw, tuple):
        return (_transposed(v, dw[0]),) + dw[1:]
    return (dw.transpose(-1, -2) if v.attr("transposed") else dw).contiguous()


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
    (:func:`~hector.kernels.segment_mm.custom_ops.segment_sums`: one launch, through
    ``node_perm`` when node types are not contiguous; relation rows are sorted by
    relation)."""
    rows = step.body.args[0]
    bounds, _, read_dy = _wgrad_layout(ix, rows.kind, step.body.per, dy.shape[0], 0)
    s = segment_sums(dy.flatten(1), bounds, read_dy)
    return fold_slice_sums(step.body, s.view((num_segments(bounds),) + tuple(dy.shape[1:])))


def kernel_weight(v: Value) -> bool:
    """Whether weight op ``v`` (its arguments evaluated) runs on a kernel of its own on the
    Triton backend: a block-diagonal score weight (``wblocks``), one launch each way
    (``segment_mm.head_blocks``; torch ops would be a stack and a product each way).  Other
    weight ops are torch ops."""
    return v.op == Op.WBLOCKS and len(v.args) <= MAX_PARTS


def run_weight(v: Value, args) -> torch.Tensor:
    """Weight op ``v`` of :func:`kernel_weight` on its kernel (differentiable: a weight root
    evaluated under autograd gets its one-launch backward)."""
    return head_blocks(args)
