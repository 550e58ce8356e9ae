"""The torch backend of the compiler: each IR operator as plain PyTorch ops on a graph's index
arrays.  It is the CPU path, the reference the Triton path is tested against, and (through
torch autograd) the reference for the IR-level autodiff.  Typed linears never index a weight
per row: rows come grouped by type (canonical edge order and compact maps are sorted by
relation; node types through ``node_type_ptr``/``node_perm``), so each slice multiplies one
contiguous segment."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from ..graph.build import (counts_of, counts_to_ptr, host_constant, sort_key, sorted_ptr,
                           take_rows)
from ..graph.capacity import compact_rows, with_compact_maps
from ..kernels.activations import gelu_grad
from ..kernels.traversal.reference import edge_softmax_torch
from ..kernels.attention.reference import dropout_keep
from ..kernels.reduce import accumulating
from ..kernels.segment_mm.head_blocks import head_blocks_torch
from . import attention_csr
from .ir import (CDST, CSRC, EDGE, NODE, NORMALIZE_EPS, Op, Value, WEIGHT, attention_roles,
                 place_tiles, toposort)


class _Pointers(dict):
    """A graph's segment pointers by row kind (``graph.host_ptr``'s); the compact kinds' are
    read on first need, a capacity block's maps built then (:func:`with_compact_maps`)."""

    def __init__(self, graph):
        super().__init__({kind: graph.host_ptr[kind] for kind in (EDGE, NODE)})
        self.graph = graph

    def __missing__(self, kind: str):
        self[kind] = with_compact_maps(self.graph).host_ptr[kind]
        return self[kind]


class GraphIndex:
    """Row counts, per-row types, movement indices and host-side segment pointers of one
    graph, built once and memoised on it (the compiler asks for them every call)."""

    def __init__(self, graph):
        self.graph = g = graph
        # A capacity block of one relation builds its compact maps only when a plan reads
        # compact rows (``_Pointers``, ``move``, ``relation``): an attention layer's program
        # never does, and the maps are two sorts and some forty kernels a batch.
        src_rows, dst_rows = compact_rows(g)
        self.rows = {NODE: g.num_nodes, EDGE: g.num_edges, CSRC: src_rows, CDST: dst_rows}
        self._idx: Dict[tuple, torch.Tensor] = {}
        self._counts: Dict[tuple, torch.Tensor] = {}
        self._groups: Dict[tuple, tuple] = {}
        self._group_ptr: Dict[tuple, torch.Tensor] = {}
        # The four segment pointers as Python ints, read by the Graph build with its other
        # sizes (one device read per graph; a mini-batch block pays none here); a capacity
        # block's are DeviceBounds, never read by the Triton path (see host_bounds).
        self.ptr = _Pointers(g)
        self.node_perm = None if g.node_types_contiguous else g.node_perm.long()
        # Graph-only quantities the runtime derives (host segment pointers, layouts), keyed
        # by the caller: built on the first call, read on every later one.
        self.memo: Dict[tuple, object] = {}

    def host_bounds(self, kind: str) -> List[int]:
        """``ptr[kind]`` as Python ints, what the torch backend slices rows by.  A capacity
        block's device bounds are read once (the torch backend runs eagerly), the last
        segment reaching to the capacity: its padding rows are computed with it (they
        reach only sink rows, whose gradients are zero)."""
        bounds = self.ptr[kind]
        if isinstance(bounds, (list, tuple)):
            return bounds
        key = ("host_bounds", kind)
        if key not in self.memo:
            self.memo[key] = bounds.ptr.tolist()[:-1] + [bounds.capacity]
        return self.memo[key]

    @staticmethod
    def of(graph) -> "GraphIndex":
        return graph.derived("compiler_index", lambda: GraphIndex(graph))

    def relation(self, kind: str) -> torch.Tensor:
        """``[rows]`` int64 relation of each ``kind`` row, widened once per graph (every
        call widening the graph's int32 array was a row-sized copy each step)."""
        key = ("relation", kind)
        if key not in self.memo:
            g = self.graph if kind == EDGE else with_compact_maps(self.graph)
            self.memo[key] = {EDGE: g.etype, CSRC: g.compact_src.rel,
                              CDST: g.compact_dst.rel}[kind].long()
        return self.memo[key]

    def node_type(self) -> torch.Tensor:
        """``[nodes]`` int64 node type, widened once per graph (HGT read it four times a
        training step: a node-sized copy each)."""
        if "node_type" not in self.memo:
            self.memo["node_type"] = self.graph.node_type.long()
        return self.memo["node_type"]

    def relation_source_type(self) -> torch.Tensor:
        """``[R]`` int64 on the graph's device: each relation's source node type (what
        ``wsrc`` slices by); kept, so a captured step reads no host data."""
        if "relation_source_type" not in self.memo:
            types = self.graph.relation_source_types()
            if types is None:
                raise ValueError("this plan re-slices a per-node-type weight per relation, but "
                                 "the graph has a relation whose sources have several node "
                                 "types (compile for this graph's statistics)")
            # (shared by every graph of the schema: no copy, no stream wait per block)
            self.memo["relation_source_type"] = host_constant(tuple(types), self.graph.device)
        return self.memo["relation_source_type"]

    def move(self, one: str, many: str, end: str) -> torch.Tensor:
        """For each row of kind ``many``, its row of kind ``one``."""
        key = (one, many, end)
        if key not in self._idx:
            g = self.graph if (one, many) == (NODE, EDGE) else with_compact_maps(self.graph)
            if (one, many) == (NODE, EDGE):
                t = g.src if end == "src" else g.dst
            elif (one, many) == (NODE, CSRC):
                t = g.compact_src.node
            elif (one, many) == (NODE, CDST):
                t = g.compact_dst.node
            elif (one, many) == (CSRC, EDGE):
                t = g.compact_src.edge_row
            elif (one, many) == (CDST, EDGE):
                t = g.compact_dst.edge_row
            else:
                raise ValueError(f"no movement between {one} and {many} rows")
            self._idx[key] = t.long()
        return self._idx[key]

    def grouped(self, one: str, many: str, end: str):
        """``(ptr, perm)``, both int64: the ``many`` rows grouped by their ``one`` row, each
        group in ``many`` order (``perm``: a stable sort of :meth:`move`; ``ptr [rows[one] +
        1]``: each group's bounds).  What a scatter's CSR and an edgewise program's CSR are
        made of.  Taken from what the graph holds where it can: edges by destination are its
        CSR by destination, edges by source its CSR by source (shared with the attention
        backward), and edges by compact destination row are in order already (canonical order
        sorts them by (relation, destination)); other groupings sort, once per graph."""
        key = (one, many, end)
        if key not in self._groups:
            g, n = self.graph, self.rows[one]
            if (one, many) == (NODE, EDGE):
                csr = g.csr_in if end == "dst" else g.csr_out
                self._groups[key] = (csr.ptr.long(), csr.eid.long())
            elif (one, many) == (CDST, EDGE):
                idx = self.move(one, many, end)
                self._groups[key] = (self.group_ptr(*key),
                                     torch.arange(idx.numel(), device=idx.device))
            else:
                perm = torch.sort(sort_key(self.move(one, many, end), n), stable=True).indices
                self._groups[key] = (self.group_ptr(*key), perm)
        return self._groups[key]

    def group_ptr(self, one: str, many: str, end: str) -> torch.Tensor:
        """The pointers of :meth:`grouped` alone (int64): the counts' cumsum, no sort."""
        key = (one, many, end)
        if key not in self._group_ptr:
            if (one, many, end) == (NODE, EDGE, "dst"):
                ptr = self.graph.csr_in.ptr.long()
            elif (one, many) == (CDST, EDGE):     # (ascending: no count needed)
                ptr = sorted_ptr(self.move(one, many, end), self.rows[one])
            else:
                ptr = counts_to_ptr(counts_of(self.move(one, many, end), self.rows[one]))
            self._group_ptr[key] = ptr
        return self._group_ptr[key]

    def counts(self, one: str, many: str, end: str) -> torch.Tensor:
        """How many ``many`` rows map to each ``one`` row (at least 1: a mean of nothing is 0)."""
        key = (one, many, end)
        if key not in self._counts:
            self._counts[key] = self._count(one, many, end).clamp_(min=1).to(torch.float32)
        return self._counts[key]

    def _count(self, one: str, many: str, end: str) -> torch.Tensor:
        """The counts, from a pointer array where the graph has one (a degree) or the index
        ascends (compact (dst, relation) rows): ``bincount`` reads its input's largest value
        back to size its output, a device sync on CUDA for every new mini-batch block."""
        g, n = self.graph, self.rows[one]
        if (one, many) == (NODE, EDGE):
            return (g.csr_in if end == "dst" else g.csr_out).degrees().long()
        if (one, many) == (CDST, EDGE):
            return torch.diff(sorted_ptr(self.move(one, many, end), n))
        return torch.bincount(self.move(one, many, end), minlength=n)[:n]


def segment_matmul(x: torch.Tensor, w: torch.Tensor, ptr: List[int],
                   perm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``out[r] = x[r] @ w[s]`` for rows r of segment s (rows listed through ``perm`` when
    the segments are not contiguous).  ``x`` is ``[rows, K]`` or ``[rows, H, K]`` with
    per-head weights ``w[s]: [H, K, N]``."""
    if perm is not None:
        out = segment_matmul(x[perm], w, ptr)
        return torch.empty_like(out).index_copy(0, perm, out)
    head = x.dim() == 3
    parts = []
    for s in range(len(ptr) - 1):
        a, b = ptr[s], ptr[s + 1]
        if b > a:
            xs = x[a:b]
            parts.append(torch.einsum("rhk,hkn->rhn", xs, w[s]) if head else xs @ w[s])
    if not parts:
        shape = (x.shape[0], x.shape[1], w.shape[-1]) if head else (x.shape[0], w.shape[-1])
        return x.new_zeros(shape) + 0 * w.sum()
    return torch.cat(parts, 0)


def segment_outer(x: torch.Tensor, dy: torch.Tensor, ptr: List[int], slices: int,
                  perm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``dW[s] = sum_{r in s} x[r]^T dy[r]`` (the weight gradient of :func:`segment_matmul`)."""
    if perm is not None:
        x, dy = x[perm], dy[perm]
    head = x.dim() == 3
    out = []
    for s in range(slices):
        a, b = ptr[s], ptr[s + 1]
        xs, ds = x[a:b], dy[a:b]
        out.append(torch.einsum("rhk,rhn->hkn", xs, ds) if head else xs.t() @ ds)
    return torch.stack(out)


def _slice_index(ix: GraphIndex, w: Value, kind: str) -> Optional[torch.Tensor]:
    if w.per == "relation":
        return ix.relation(kind)
    if w.per == "node_type":
        return ix.node_type()
    return None


def _operand(t: torch.Tensor, v: Value, rows_kind: str, ix: GraphIndex) -> torch.Tensor:
    """A weight operand of an elementwise op, broadcast to ``[rows, h, d]`` (a small vector
    per row, picked by the row's type; never a matrix)."""
    if v.kind != WEIGHT:
        return t
    per_slice = t if v.per is not None else t.unsqueeze(0)
    shape = (1,) + tuple(v.shape) if len(v.shape) == 2 else (1, 1, v.shape[0])
    per_slice = per_slice.reshape((per_slice.shape[0],) + shape[1:])
    idx = _slice_index(ix, v, rows_kind)
    return per_slice if idx is None else take_rows(per_slice, idx)


_acc = accumulating


def edge_softmax(s: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Softmax of ``s [E, H, 1]`` over each destination's incoming edges (row max subtracted)."""
    return edge_softmax_torch(dst, num_nodes, s)


def eval_op(v: Value, a: List[torch.Tensor], ix: GraphIndex) -> torch.Tensor:
    """One IR operator on torch tensors (``a``: its evaluated arguments)."""
    op = v.op
    if op == Op.LINEAR:
        x, w = a
        rows = x.shape[0]
        headwise = len(v.args[1].shape) == 3
        xin = x if headwise else x.flatten(1)
        per = v.args[1].per
        if per is None:
            y = torch.einsum("rhk,hkn->rhn", xin, w) if headwise else xin @ w
        elif per == "relation":
            y = segment_matmul(xin, w, ix.host_bounds(v.kind))
        else:
            y = segment_matmul(xin, w, ix.host_bounds(NODE), ix.node_perm)
        return y.reshape((rows,) + v.shape)
    if op == Op.GATHER:
        one, many = v.args[0].kind, v.kind
        idx = ix.move(one, many, v.attr("end"))
        out = a[0].index_select(0, idx)
        if v.attr("norm") == "mean":
            out = out / ix.counts(one, many, v.attr("end")).index_select(0, idx).view(-1, 1, 1)
        return out
    if op == Op.SCATTER:
        one, many = v.kind, v.args[0].kind
        idx = ix.move(one, many, v.attr("end"))
        x = a[0]
        out = x.new_zeros((ix.rows[one],) + tuple(x.shape[1:])).index_add(0, idx, x)
        if v.attr("reduce") == "mean":
            out = out / ix.counts(one, many, v.attr("end")).view(-1, 1, 1)
        return out
    if op == Op.EDGE_SOFTMAX:
        return edge_softmax(a[0], ix.move(NODE, EDGE, "dst"), ix.rows[NODE])
    if op == Op.DOT:
        return (a[0] * a[1]).sum(-1, keepdim=True)
    if op in (Op.ADD, Op.SUB, Op.MUL):
        if v.kind == WEIGHT:
            x, y = a
        else:
            x, y = (_operand(t, arg, v.kind, ix) for t, arg in zip(a, v.args))
        return x + y if op == Op.ADD else x - y if op == Op.SUB else x * y
    if op == Op.HEAD_MEAN:
        return a[0].mean(1, keepdim=True)
    if op == Op.NORMALIZE:
        return F.normalize(a[0], p=2.0, dim=-1, eps=NORMALIZE_EPS)
    if op == Op.NORMALIZE_GRAD:
        g, x = a
        norm = x.norm(dim=-1, keepdim=True)
        y = x / norm.clamp_min(NORMALIZE_EPS)
        projected = (g - y * (g * y).sum(-1, keepdim=True)) / norm.clamp_min(NORMALIZE_EPS)
        return torch.where(norm > NORMALIZE_EPS, projected, g / NORMALIZE_EPS)
    if op == Op.RESHAPE:
        return a[0].reshape((a[0].shape[0],) + v.shape)
    if op == Op.COLS:      # a view: the rows keep their stride
        start, width = v.attr("start"), v.shape[0] * v.shape[1]
        return a[0].flatten(1)[:, start:start + width].unflatten(1, v.shape)
    if op == Op.PLACE:
        return place_columns(v, a)
    if op == Op.EXPAND:
        return a[0].expand((a[0].shape[0],) + v.shape)
    if op == Op.REDUCE_TO:
        x = a[0]
        for axis, n in ((1, v.shape[0]), (2, v.shape[1])):
            if n == 1 and x.shape[axis] != 1:
                x = x.sum(axis, keepdim=True)
        return x
    return _eval_elementwise_or_weight(v, a, ix)


def _eval_elementwise_or_weight(v: Value, a: List[torch.Tensor], ix: GraphIndex) -> torch.Tensor:
    op = v.op
    x = a[0] if a else None
    if op == Op.NEG:
        return -x
    if op == Op.EXP:
        return torch.exp(x)
    if op == Op.SIGMOID:
        return torch.sigmoid(x)
    if op == Op.TANH:
        return torch.tanh(x)
    if op == Op.GELU:
        return F.gelu(x)
    if op == Op.RELU:
        return torch.relu(x)
    if op == Op.LEAKY_RELU:
        return F.leaky_relu(x, v.attr("slope"))
    if op == Op.SCALE:
        return x * v.attr("factor")
    if op == Op.LEAKY_RELU_GRAD:
        return torch.where(x > 0, torch.ones_like(x), torch.full_like(x, v.attr("slope")))
    if op == Op.GELU_GRAD:
        return gelu_grad(x)
    if op == Op.WMUL:
        return _wmul(a[0], a[1], len(v.args[0].shape) == 1, v.args[1].shape)
    if op == Op.WSRC:
        return x[ix.relation_source_type()]
    if op == Op.WSCALE:          # [.., H, K, N] * [.., H, 1] per head
        return a[0] * a[1][..., None]
    if op == Op.WCOMBINE:
        comp, basis = a
        return (comp @ basis.reshape(basis.shape[0], -1)).reshape((comp.shape[0],) + v.shape)
    if op == Op.BLOCKDIAG:
        nb = v.args[0].shape[0]
        eye = torch.eye(nb, dtype=x.dtype, device=x.device)
        full = torch.einsum("...bkn,bc->...bkcn", x, eye)
        return full.reshape(full.shape[:-4] + v.shape)
    if op == Op.WT:
        return x.transpose(-1, -2)
    if op == Op.WCAT:
        return torch.cat(a, -2 if v.attr("rows") else -1)
    if op == Op.WHEADS:
        return torch.cat(a, -3)
    if op == Op.WCOLS:
        return x[..., v.attr("start"):v.attr("start") + v.shape[-1]]
    if op == Op.WBLOCKS:
        return head_blocks_torch(a)
    if op == Op.WGRAD:
        return _wgrad(v, a[0], a[1], ix)
    if op == Op.WSUM:
        return _wsum(v, x, ix)
    if op == Op.CONST:
        return torch.full((ix.rows[v.kind],) + v.shape, v.attr("value"))
    raise NotImplementedError(f"torch backend: no rule for IR op {op!r}")


def place_columns(v: Value, pieces: List[torch.Tensor]) -> torch.Tensor:
    """``place``: the pieces' flattened rows at their columns, zeros between (a concat when
    they tile the row)."""
    flat = [p.flatten(1) for p in pieces]
    if place_tiles(v):
        return torch.cat(flat, 1).unflatten(1, v.shape)
    out = flat[0].new_zeros(pieces[0].shape[0], v.shape[0] * v.shape[1])
    for s, f in zip(v.attr("starts"), flat):
        out[:, s:s + f.shape[1]] = f
    return out.unflatten(1, v.shape)


def _wmul(a: torch.Tensor, b: torch.Tensor, row: bool, b_shape) -> torch.Tensor:
    """``a @ b`` over leading slice dims; ``a`` a matrix, or a row ``[.., K]`` (``row``); a
    per-head ``b`` ``[.., H, k, n]`` multiplies as its block-diagonal matrix, head by head."""
    a = a.unsqueeze(-2) if row else a
    if len(b_shape) == 3 and b_shape[0] == 1:
        b = b[..., 0, :, :]
    if len(b_shape) == 3 and b_shape[0] > 1:
        H, k, _ = b_shape
        out = torch.einsum("...mhk,...hkn->...mhn", a.unflatten(-1, (H, k)), b).flatten(-2)
    else:
        out = torch.matmul(a, b)
    return out.squeeze(-2) if row else out


def _wgrad(v: Value, x: torch.Tensor, dy: torch.Tensor, ix: GraphIndex) -> torch.Tensor:
    headwise = len(v.shape) == 3
    if not headwise:
        x, dy = x.flatten(1), dy.flatten(1)   # (flatten: fine with 0 rows)
    kind = v.args[0].kind
    if v.attr("transposed"):     # (a weight stored [N, K]: its gradient dy^T x, in place)
        if v.per is None and not headwise:
            return dy.t() @ x
        return _wgrad(v.with_attrs(transposed=None), x, dy, ix).transpose(-1, -2).contiguous()
    if v.per is None:
        return torch.einsum("rhk,rhn->hkn", x, dy) if headwise else x.t() @ dy
    if v.per == "relation":
        ptr = ix.host_bounds(kind)
        return segment_outer(x, dy, ptr, len(ptr) - 1)
    ptr = ix.host_bounds(NODE)
    return segment_outer(x, dy, ptr, len(ptr) - 1, ix.node_perm)


#: Slice sums of at most this many slices are a one-hot product; more, an ``index_add``.
ONE_HOT_SLICES = 64
_ONE_HOT_ELEMENTS = 1 << 26          # one-hot entries per chunk of rows (256 MiB in fp32)


def slice_sums(dy: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """``[n, ...]``: the rows of ``dy`` summed per slice id ``idx`` (a bias gradient per node
    type or relation).  With few slices, a one-hot product in fp32 rather than ``index_add``:
    on CUDA, ``index_add`` of every row into a handful of slots serialises on atomics (HGT
    on synthetic mag: 7 ms per bias gradient, 1.9M rows into 4 slots, where reading the rows
    once takes 0.1 ms); the product reads ``dy`` once, with no atomics, deterministically,
    in a fixed number of launches (no host sync: it can be captured)."""
    if n > ONE_HOT_SLICES:
        return dy.new_zeros((n,) + tuple(dy.shape[1:])).index_add(0, idx, dy)
    flat = dy.flatten(1)            # (not reshape(rows, -1): ambiguous with no rows)
    work = torch.promote_types(dy.dtype, torch.float32)      # (float64 stays float64)
    out = torch.zeros(n, flat.shape[1], dtype=work, device=dy.device)
    ids = torch.arange(n, device=dy.device)
    step = max(1, _ONE_HOT_ELEMENTS // max(n, 1))
    for lo in range(0, flat.shape[0], step):
        hot = (idx[lo:lo + step, None] == ids).to(work)
        out += hot.t() @ flat[lo:lo + step].to(work)
    return out.to(dy.dtype).reshape((n,) + tuple(dy.shape[1:]))


def _wsum(v: Value, dy: torch.Tensor, ix: GraphIndex) -> torch.Tensor:
    kind = v.args[0].kind
    idx = _slice_index(ix, v, kind)
    if idx is None:
        s = dy.sum(0)
    else:
        n = len(ix.host_bounds(kind if v.per == "relation" else NODE)) - 1
        s = slice_sums(dy, idx, n)
    return fold_slice_sums(v, s)


def fold_slice_sums(v: Value, s: torch.Tensor) -> torch.Tensor:
    """A ``wsum``'s value from the row sums ``s`` (``[slices, h, d]``, or ``[h, d]`` with no
    slices): summed over heads or features where the weight has one."""
    h, d = (1, v.shape[0]) if len(v.shape) == 1 else v.shape
    lead = s.dim() - 2
    if h == 1 and s.shape[lead] != 1:
        s = s.sum(lead, keepdim=True)
    if d == 1 and s.shape[lead + 1] != 1:
        s = s.sum(lead + 1, keepdim=True)
    return s.reshape(s.shape[:lead] + tuple(v.shape))


def edge_side(t: torch.Tensor, v: Value, end: str, ix: GraphIndex) -> torch.Tensor:
    """A node / compact / edge value read per edge from the ``end`` side."""
    if v.kind == EDGE:
        return t
    return t.index_select(0, ix.move(v.kind, EDGE, end))


def attention_score(v: Value, a: List[torch.Tensor], ix: GraphIndex) -> torch.Tensor:
    """The pre-activation score ``scale <q_v, k_u> p_r + a_src + a_dst`` of a fused
    ``attention`` operator, per edge ``[E, H, 1]``."""
    roles = attention_roles(v, tuple(zip(v.args, a)))
    terms = []
    if "q" in roles:
        q = edge_side(roles["q"][1], roles["q"][0], "dst", ix)
        k = edge_side(roles["k"][1], roles["k"][0], "src", ix)
        qk = (q * k).sum(-1, keepdim=True) * v.attr("scale")
        if "p" in roles:
            qk = qk * _operand(roles["p"][1], roles["p"][0], EDGE, ix)
        terms.append(qk)
    if "a_src" in roles:
        terms.append(edge_side(roles["a_src"][1], roles["a_src"][0], "src", ix))
    if "a_dst" in roles:
        terms.append(edge_side(roles["a_dst"][1], roles["a_dst"][0], "dst", ix))
    score = terms[0]
    for t in terms[1:]:
        score = score + t
    return score


def _lse(t: torch.Tensor, dst: torch.Tensor, n: int) -> torch.Tensor:
    """``[n, H]`` log-sum-exp of the scores ``t [E, H, 1]`` over each destination's edges (0
    for a node without incoming edges), in fp32 at least, as the attention kernels keep it."""
    t = _acc(t[..., 0])
    idx = dst[:, None].expand_as(t)
    top = t.new_full((n, t.shape[1]), float("-inf")).scatter_reduce(0, idx, t.detach(), "amax")
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    total = t.new_zeros((n, t.shape[1])).index_add(0, dst, torch.exp(t - top[dst]))
    return top + torch.log(torch.where(total > 0, total, torch.ones_like(total)))


def per_argument(body: Value, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """The tensors bound to each of a kernel body's arguments, in order.  A kernel's inputs
    are its distinct values, so one tensor may stand for several arguments (an attention
    whose source and destination score terms are one value): its ``arg`` leaves say which."""
    if all(a.op == Op.ARG for a in body.args):
        return [inputs[a.attr("index")] for a in body.args]
    return list(inputs)


def attention_torch_lse(v: Value, a: List[torch.Tensor], ix: GraphIndex):
    """(output, log-sum-exp ``[N, H]``) of a fused ``attention`` operator (what fusion makes
    of score -> edge softmax -> weighted aggregation), evaluated edge by edge: the torch
    backend of an attention step (the log-sum-exp is what :func:`attention_bwd_torch`
    reads)."""
    roles = attention_roles(v, tuple(zip(v.args, a)))
    if attention_csr.applies(roles, ix.graph):
        for end in ("src", "dst"):   # (the edge-wise form's index memos: a traced call of the
            ix.move(NODE, EDGE, end)  # plans must find them filled, not write them)
        out, lse = attention_csr.forward(v, roles, ix.graph)
        return (out + _epilogue_term(roles["bias"], out) if "bias" in roles else out), lse
    score = _activated(v, attention_score(v, a, ix))
    dst = ix.move(NODE, EDGE, "dst")
    lse = _lse(score, dst, ix.rows[NODE])
    alpha = torch.exp(_acc(score) - lse[dst][..., None]).to(score.dtype)
    value, t = roles["v"]
    z = _kept(v, roles, ix)
    alpha = alpha if z is None else alpha * z.to(alpha.dtype)
    msg = alpha * edge_side(t, value, "src", ix)
    out = msg.new_zeros((ix.rows[NODE],) + tuple(msg.shape[1:])).index_add(0, dst, msg)
    if "bias" in roles:         # the epilogue bias or addend (fuse: RGAT's bias, GAT's residual)
        out = out + _epilogue_term(roles["bias"], out)
    return out, lse


def _epilogue_term(role, out: torch.Tensor) -> torch.Tensor:
    """An attention's ``bias`` role (value, tensor) shaped to broadcast over ``out``
    ``[N, H, D]``: a weight row as ``[H, D]``, node rows (an addend) as ``[N, H, D]``."""
    value, t = role
    shape = out.shape[1:] if value.kind == WEIGHT else out.shape
    return t.reshape(shape).to(out.dtype)


def _kept(att: Value, roles, ix: GraphIndex):
    """The attention's dropout as a per-edge factor ``[E, H, 1]``: 0 for a dropped (edge,
    head), ``1 / (1 - p)`` for a kept one (the kernels' mask: a hash of the seed and the
    canonical edge id, which is the edge row); None without dropout."""
    p = att.attr("dropout", 0.0)
    if p == 0:
        return None
    eid = torch.arange(ix.rows[EDGE], device=ix.graph.device)
    keep = dropout_keep(roles["seed"][1], eid, att.heads, p)
    return (keep.to(torch.float32) / (1.0 - p))[..., None]


def _activated(v: Value, score: torch.Tensor) -> torch.Tensor:
    slope = v.attr("slope")
    return score if slope is None else F.leaky_relu(score, slope)


def attention_bwd_torch(b: Value, att: Value, a: List[torch.Tensor],
                        ix: GraphIndex) -> Dict[str, torch.Tensor]:
    """The gradients of an ``attention_bwd`` node (role -> gradient on the role's rows), edge
    by edge: the reference of the fused backward kernels.  With ``s`` the pre-activation
    score, ``t`` the activated one, ``alpha = exp(t - lse)`` and ``g`` the output's gradient:
    ``dv_u = sum alpha g_v``; ``dt = alpha (<g_v, v_u> - <g_v, out_v>)``; ``ds = dt act'(s)``;
    ``dq_v = sum scale ds k'_u``, ``dk'_u = sum scale ds q_v`` (``k' = k p_r``), ``da = sum ds``.
    ``att``: ``attention_of_bwd(b)``, built once by the caller (torch.compile cannot trace IR
    construction)."""
    n = len(att.args)
    role_t, (grad, out, lse) = a[:n], a[n:n + 3]
    roles = attention_roles(att, tuple(zip(att.args, role_t)))
    if attention_csr.applies(roles, ix.graph):
        return _joint(b, attention_csr.backward(att, roles, ix.graph, grad, lse,
                                                b.attr("needs")))
    s = attention_score(att, role_t, ix)
    dst = ix.move(NODE, EDGE, "dst")
    alpha = torch.exp(_acc(_activated(att, s)) - lse[dst][..., None])
    g_e = _acc(grad.index_select(0, dst))
    value, vt = roles["v"]
    z = _kept(att, roles, ix)                     # d out / d alpha carries the mask too
    z = 1.0 if z is None else z
    d_alpha = z * (g_e * _acc(edge_side(vt, value, "src", ix))).sum(-1, keepdim=True)
    if "bias" in roles:         # ``out`` includes the epilogue term; delta is <g, attention>
        out = out - _epilogue_term(roles["bias"], out)
    delta = (_acc(grad) * _acc(out)).sum(-1, keepdim=True).index_select(0, dst)
    ds = alpha * (d_alpha - delta)
    slope = att.attr("slope")
    if slope is not None:
        ds = torch.where(s > 0, ds, ds * slope)
    scale = att.attr("scale")
    per_edge = {"v": (alpha * z * g_e, "src"), "a_src": (ds, "src"), "a_dst": (ds, "dst")}
    if "q" in roles:
        q_e = _acc(edge_side(roles["q"][1], roles["q"][0], "dst", ix))
        k_e = _acc(edge_side(roles["k"][1], roles["k"][0], "src", ix))
        if "p" in roles:
            k_e = k_e * _acc(_operand(roles["p"][1], roles["p"][0], EDGE, ix))
        per_edge.update(q=(scale * ds * k_e, "dst"), k=(scale * ds * q_e, "src"))
    grads = {}
    for role in b.attr("needs"):
        contrib, end = per_edge[role]
        like, t = roles[role]
        if like.kind != EDGE:
            contrib = contrib.new_zeros((ix.rows[like.kind],) + tuple(contrib.shape[1:])) \
                .index_add(0, ix.move(like.kind, EDGE, end), contrib)
        grads[role] = contrib.to(t.dtype)
    return _joint(b, grads)


def _joint(b: Value, grads: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """With ``joint`` (``ir.joint_kv``), the k and v gradients side by side as ``kv`` too."""
    if b.attr("joint", False):
        grads["kv"] = torch.cat([grads["k"].flatten(1), grads["v"].flatten(1)], 1).unsqueeze(1)
    return grads


def extra_product(y: torch.Tensor, v: torch.Tensor, shape) -> torch.Tensor:
    """``y V`` row by row (``y``'s rows flattened), in fp32 at least and rounded once, as
    the GEMM's epilogue forms a step's extra product (``GemmSpec.extra_cols``)."""
    work = torch.promote_types(y.dtype, torch.float32)
    return (y.flatten(1).to(work) @ v.to(work)).to(y.dtype).reshape((y.shape[0],) + tuple(shape))


def eval_body(body: Value, inputs: List[torch.Tensor], ix: GraphIndex) -> torch.Tensor:
    """Evaluate a kernel body, its ``arg`` leaves bound to ``inputs``."""
    memo: Dict[Value, torch.Tensor] = {}
    for b in toposort([body]):
        if b.op == Op.ARG:
            memo[b] = inputs[b.attr("index")]
        elif b.op == Op.ATTENTION:
            memo[b] = attention_torch_lse(b, [memo[x] for x in b.args], ix)[0]
        else:
            memo[b] = eval_op(b, [memo[x] for x in b.args], ix)
    return memo[body]
