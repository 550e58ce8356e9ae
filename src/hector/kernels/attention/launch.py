"""Runtime of the fused edge attention on the Triton path: the strategy choice (DF-GNN's
dynamic fusion), per-graph chunk tables, kernel launches (registry kernels rendered for the
spec, edge tile and warps autotuned on CUDA) and the ``autograd.Function``.

Saved for backward: the inputs themselves (references, no copies), the output ``o`` and one
fp32 log-sum-exp per (row, head) -- never the [E, H] attention weights.  The backward
recomputes ``alpha = exp(s - lse)`` on the fly (FlashAttention style); the row max is folded
into ``lse``, so it is not stored separately.

k and v may have any row stride (:func:`rows_dense`): a compiler that computes K and V with one
GEMM into a ``[rows, H*DK + H*DV]`` buffer passes its two column slices as they are, and the
backward can write dk and dv into one such joint buffer (``joint_kv``), the gradient of that
GEMM's output, so neither direction copies the slices apart or back together.
"""
from __future__ import annotations

import itertools
import os
import weakref
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from ...device import DEFAULT_NUM_SMS, num_sms
from ...graph.structures import CSR
from .. import autotune
from .. import registry
from ..eager import call
from ..handles import HandleTable
from ..reduce import column_sum
from ..sizes import next_pow2
from .reference import dropout_threshold
from .spec import AttentionSpec, Schedule, default_schedule, tune_configs

#: Programs in flight per SM assumed by the strategy rule's fair share.
PROGRAMS_PER_SM = 4
#: One-warp edge-parallel programs resident per SM that the chunk size aims at: the chunks
#: are latency-bound gathers, so they need many programs in flight.  Measured on the H200
#: (GAT and Transformer attention, one and four heads, forward and both backward kernels):
#: synthetic arxiv (1.17M edges) ran 1.4-1.7x faster with 128-edge chunks than with 1024 (the
#: size the rule gave before, aiming at two programs x 4 per SM), github-musae (578K)
#: 1.7-2.5x, amazon-computers (287K) 1.1-2.0x; mag's derived graph (21.1M) stays at MAX_CHUNK.
CHUNK_PROGRAMS_PER_SM = 48
#: Below this in-degree no row is long enough to straggle, whatever the graph.
MIN_STRAGGLER_DEGREE = 512
#: A row straggles once it holds more than this fraction of a fair share of the edges.  A
#: node-parallel program walks its row serially, one latency-bound edge tile (about 1 us on
#: the H200) after another, while the other programs stream their rows at full bandwidth:
#: measured on the H200 on HGT's derived graph of synthetic mag (21.1M edges, longest row
#: 61,726 = 1.54 shares, four heads of 16, fp32), node-parallel took 46.0 ms for the forward
#: and both backward traversals, edge-parallel 14.5 ms (the longest row alone is ~15K tiles).
#: The reddit, products and proteins profiles (longest rows 0.05-0.1 shares) stay node-parallel.
STRAGGLER_SHARE = 1 / 3
#: Mean degree from which rows count as long (see ``choose_strategy``).
LONG_ROW_MEAN_DEGREE = 256
#: Rows this short on average, and more than SHORT_ROWS_PER_LANE per program in flight, go
#: edge-parallel: one program per row then costs more to schedule than its edges take.
#: Measured on the H200: the source side of compiled RGAT's derived graph on synthetic
#: wikikg2 (12.9M compact rows, 1.25 edges each) took 8.8 ms node-parallel (see
#: docs/perf-notes.md, "Session 15").
SHORT_ROW_MEAN_DEGREE = 2.0
SHORT_ROWS_PER_LANE = 64

_chunk_tables: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def choose_strategy(degree, num_edges: int, sms: int = DEFAULT_NUM_SMS,
                    heads: int = 1) -> Tuple[str, str]:
    """('node' | 'edge', why) for a traversal over rows with degree statistics ``degree``.

    Node-parallel finishes when its longest row does, so it loses once one row holds a large
    part of a fair share of the whole traversal: ``E / (SMs * programs per SM)``, the work
    each in-flight program would get if edges were spread evenly; one program's serial walk
    is several times slower per edge than the device's aggregate stream, so the threshold is
    ``STRAGGLER_SHARE`` of that share (measured; see there).  Edge-parallel pays for a
    combine pass and a row loop per chunk, so the longest row must also be long in absolute
    terms (at least MIN_STRAGGLER_DEGREE).

    Long rows on average (mean degree >= LONG_ROW_MEAN_DEGREE) with one head also go
    edge-parallel.  This is measured, not derived: on the H200 suite (docs/perf-notes.md) the
    only such graphs, synthetic reddit and proteins, ran 1-12% faster edge-parallel in every
    one-head case (F=128), while with four heads node-parallel was as fast or up to 11% faster.

    Many very short rows (mean degree < SHORT_ROW_MEAN_DEGREE, more than
    SHORT_ROWS_PER_LANE rows per program in flight) go edge-parallel too: a program per row
    is then mostly scheduling (measured; see there).
    """
    lanes = sms * PROGRAMS_PER_SM
    share = num_edges / lanes if lanes else float(num_edges)
    facts = (f"max degree {degree.max}, mean {degree.mean:.1f}, cv {degree.cv:.2f}; "
             f"fair share per program E/({sms} SMs x {PROGRAMS_PER_SM}) = {share:.0f} edges")
    if degree.max >= MIN_STRAGGLER_DEGREE and degree.max > STRAGGLER_SHARE * share:
        return "edge", f"edge-parallel: the longest row would straggle ({facts})"
    if heads == 1 and degree.mean >= LONG_ROW_MEAN_DEGREE:
        return "edge", (f"edge-parallel: long rows (mean degree >= {LONG_ROW_MEAN_DEGREE}) with "
                        f"one head, where equal chunks measured faster ({facts})")
    if 0 < degree.mean < SHORT_ROW_MEAN_DEGREE and \
            num_edges / degree.mean > SHORT_ROWS_PER_LANE * lanes:
        return "edge", (f"edge-parallel: many short rows (mean degree < "
                        f"{SHORT_ROW_MEAN_DEGREE}, over {SHORT_ROWS_PER_LANE} rows per program "
                        f"in flight): a program per row costs more than its edges ({facts})")
    return "node", f"node-parallel: no row long enough to straggle ({facts})"


@dataclass(frozen=True)
class AttentionPlan:
    """The schedules of one call: forward + destination-side backward traverse CSR-by-
    destination (``dst``); the source-side backward traverses CSR-by-source (``src``), whose
    skew is the out-degree's, so it gets its own choice."""
    dst: Schedule
    src: Schedule
    #: The schedules are the heuristic's (not pinned by the caller): on CUDA each kernel's
    #: edge tile and warps are then autotuned around them (kernels/autotune.py).
    tune: bool = False


def make_plan(graph, spec: AttentionSpec, strategy: str = "auto",
              schedule: Optional[Schedule] = None) -> AttentionPlan:
    """``schedule`` (tests, tuning) overrides both sides; otherwise 'auto' runs the rule."""
    if schedule is not None:
        return AttentionPlan(schedule, schedule)
    sms = num_sms(graph.device)
    scheds = []
    for stats in (graph.in_degree, graph.out_degree):
        if strategy == "auto":
            chosen, reason = choose_strategy(stats, graph.num_edges, sms, spec.heads)
        else:
            chosen, reason = strategy, f"{strategy}-parallel: requested by the caller"
        scheds.append(default_schedule(spec, chosen, graph.num_edges, stats.mean,
                                       sms * CHUNK_PROGRAMS_PER_SM, reason=reason))
    return AttentionPlan(*scheds, tune=True)


def chunk_rows(graph, csr, chunk: int) -> torch.Tensor:
    """``[num_chunks, 2]`` (first row, end row) of each equal edge chunk of ``csr``.

    Chunk ``c`` covers edges ``[c*chunk, (c+1)*chunk)``; it starts at the row containing its
    first edge and ends after the row containing its last edge.  Rows without edges are given
    to the chunk before the boundary they sit on, so every row is written exactly once.
    Cached per (graph, csr, chunk): it depends on the structure only.
    """
    table = _chunk_tables.setdefault(graph, {})
    key = (id(csr), chunk)
    if key not in table:
        ptr = csr.ptr.to(torch.int64)
        n, e = ptr.numel() - 1, int(graph.num_edges)
        num_chunks = max(1, -(-e // chunk))
        bounds = (torch.arange(num_chunks + 1, device=ptr.device) * chunk).clamp_(max=e)
        # (a 1-D slice of a contiguous pointer is contiguous; a stack's result too: no
        # .contiguous() calls, each an aten op of every new block's first step)
        first = torch.searchsorted(ptr[1:], bounds, right=True)
        first[:1].zero_()           # (in place on views: no scalar lifted to a tensor)
        first[-1:].fill_(n)
        # The row holding the next chunk's first edge is cut (so shared) when it starts before
        # (the comparison's bool adds as 0 or 1).
        nxt = first[1:]
        end = nxt + (ptr.index_select(0, nxt) < bounds[1:])
        table[key] = torch.stack([first[:-1], end], dim=1).to(graph.index_dtype)
    return table[key]


def active_rows(graph, csr, num_empty: Optional[int] = None) -> Tuple["CSR", torch.Tensor]:
    """The rows of ``csr`` that hold edges, as a compressed CSR, and their ids (every row's
    id when all hold edges).  ``num_empty``: how many rows hold none, when the host knows
    (:func:`empty_rows`), so no ``nonzero`` reads the count back (a device sync per CSR of
    every new mini-batch block's attention graph).

    The edge-parallel schedule hands each run of edgeless rows to one program, which walks it
    serially: 620K such rows (the derived graph of compiled RGAT on fb15k) cost 125 ms, and
    ogbn-mag's 1.13M authors, which receive no edges, sit in the middle of the node range.
    The kernels read and write the row-side tensors through the ids (``row_ids``), so
    skipping those rows copies nothing (a gather of the row-side inputs and a scatter of the
    outputs took 6 ms of HGT's 45 ms step on mag).  Cached per (graph, csr)."""
    table = _chunk_tables.setdefault(graph, {})
    key = ("active", id(csr))
    if key not in table:
        rows = csr.ptr.numel() - 1
        if num_empty is None:
            nz = (csr.ptr[1:] > csr.ptr[:-1]).nonzero().squeeze(1)
        else:
            nz = _rows_by_use(graph, csr, num_empty)[:rows - num_empty]
        if nz.numel() == rows:
            table[key] = (csr, nz)
        else:
            ptr = torch.cat([csr.ptr[nz], csr.ptr[-1:]]).contiguous()
            table[key] = (CSR(ptr, csr.col, csr.eid), nz)
    return table[key]


def idle_rows(graph, csr, num_empty: Optional[int] = None) -> torch.Tensor:
    """The ids of the rows of ``csr`` without edges (what :func:`active_rows` leaves out),
    cached per (graph, csr); ``num_empty`` as there."""
    table = _chunk_tables.setdefault(graph, {})
    key = ("idle", id(csr))
    if key not in table:
        if num_empty is None:
            table[key] = (csr.ptr[1:] == csr.ptr[:-1]).nonzero().squeeze(1)
        else:
            rows = csr.ptr.numel() - 1
            table[key] = _rows_by_use(graph, csr, num_empty)[rows - num_empty:]
    return table[key]


def _rows_by_use(graph, csr, num_empty: int) -> torch.Tensor:
    """Every row id of ``csr``: those with edges ascending, then those without ascending (a
    stable sort of the empty flag; the host knows where the two parts meet), the same ids
    ``nonzero`` gives each part; shared by :func:`active_rows` and :func:`idle_rows`."""
    table = _chunk_tables.setdefault(graph, {})
    key = ("by_use", id(csr))
    if key not in table:
        if num_empty == 0:
            table[key] = torch.arange(csr.ptr.numel() - 1, device=csr.ptr.device)
        else:
            empty = (csr.ptr[1:] == csr.ptr[:-1]).to(torch.uint8)
            table[key] = torch.sort(empty, stable=True).indices
    return table[key]


def empty_rows(graph, side: str) -> int:
    """How many rows of :func:`side_csr` hold no edge, from the degree statistics the graph's
    build read (no device read): the rows past the cut hold none, so all the graph's rows
    with edges lie in it."""
    stats = graph.in_degree if side == "dst" else graph.out_degree
    return side_rows(graph, side) - (graph.num_nodes - stats.num_isolated)


def _rows_of(graph, csr, sched: Schedule, side: str):
    """(csr to traverse, data row of each of its rows, its number of rows) for one traversal
    of ``side``'s rows; node-parallel traverses every row in place (the ids are then unused:
    ``csr.ptr`` stands in)."""
    if sched.strategy != "edge":
        return csr, csr.ptr, csr.ptr.numel() - 1
    csr, ids = active_rows(graph, csr, empty_rows(graph, side))
    return csr, ids, (csr.ptr.numel() - 1)


def side_rows(graph, side: str) -> int:
    """Rows of the ``side`` ("src" or "dst") operands, outputs and gradients: a derived
    graph's ``num_src_rows`` / ``num_dst_rows`` (:class:`hector.graph.derived.AttentionGraph`),
    else every node."""
    rows = getattr(graph, f"num_{side}_rows", None)
    return graph.num_nodes if rows is None else rows


def side_csr(graph, side: str) -> CSR:
    """The CSR a traversal of ``side``'s rows walks: by destination for "dst", by source for
    "src", its pointer cut to :func:`side_rows` (the rows past it hold no edges, so the cut
    CSR keeps every edge); one object per (graph, side), since the chunk and active-row
    tables are keyed by the CSR's identity."""
    csr = graph.csr_in if side == "dst" else graph.csr_out
    rows = side_rows(graph, side)
    if rows == csr.ptr.numel() - 1:
        return csr
    table = _chunk_tables.setdefault(graph, {})
    key = ("side", side)
    if key not in table:
        table[key] = CSR(csr.ptr[:rows + 1], csr.col, csr.eid)
    return table[key]


def fill_rows(ids: torch.Tensor, value: torch.Tensor, out: torch.Tensor) -> None:
    """``out[ids] = value`` for a ``[W]`` row ``value`` and ``[rows, W]`` ``out``, one launch."""
    if ids.numel():
        width = out.shape[1]
        block_w = min(next_pow2(width), 128)
        registry.kernel("fill_rows")[(-(-ids.numel() // 32),)](
            ids, ids.numel(), value, out, width, BLOCK_R=32, BLOCK_W=block_w)


def _rows_out(skips: bool, shape, **kw) -> torch.Tensor:
    """A row-side output: zeros where the traversal ``skips`` rows (an edge-parallel one over
    a graph with edgeless rows: those stay exactly 0), else uninitialised, since the kernels
    write every row (a fill of each output was 4-5% of a training step on a 169K-node
    graph whose rows all have self loops)."""
    return (torch.zeros if skips else torch.empty)(shape, **kw)


def score_params(spec: AttentionSpec, strategy: str) -> dict:
    """Render parameters of the traversal kernels (kernels/registry.py): which score terms
    exist, leaky relu, dropout, and the schedule kind."""
    return dict(has_qk=spec.has_qk, has_src=spec.has_src, has_dst=spec.has_dst,
                has_leaky=spec.has_leaky, has_dropout=spec.has_dropout,
                edge_parallel=strategy == "edge", dst_edge=spec.dst_edge)


def _tiles(sched: Schedule) -> dict:
    """The ``tl.constexpr`` tile sizes and launch options of one traversal launch."""
    return dict(BLOCK_E=sched.block_e, BLOCK_H=sched.block_h, BLOCK_DK=sched.block_dk,
                BLOCK_DV=sched.block_dv, num_warps=sched.num_warps)


def _launch_traversal(name: str, params: dict, plan: AttentionPlan, sched: Schedule, grid,
                      args: tuple, shape: tuple, device: torch.device,
                      accumulates: Optional[torch.Tensor] = None,
                      overwrites: Sequence[torch.Tensor] = ()) -> None:
    """Launch traversal kernel ``name``, its edge tile and warps autotuned around ``sched``
    when the plan allows it.  Trials run on the real outputs: stores leave the same values
    whichever run was last, but an output the kernel sums into with atomics
    (``accumulates``: the destination term's gradient per (dst, relation) row) is zeroed
    before every run, or each autotune trial would add its sums again; inputs the kernel
    writes its outputs over (``overwrites``) are copied once before tuning and put back
    before every trial (that copy exists only while a new shape is tuned)."""
    if grid[0] == 0:       # a side with no rows (a derived graph's): nothing to traverse
        if accumulates is not None:
            accumulates.zero_()
        return
    kernel = registry.kernel(name, **params)

    def run(s: Schedule):
        if accumulates is not None:
            accumulates.zero_()
        kernel[grid](*args, **_tiles(s))
    if plan.tune and autotune.enabled(device):
        # Looked up by this key first: the config list and spec hash cost more host time
        # than the launch, on every call of a step that is not captured.
        bucket = autotune.bucket(*shape)

        def pick():
            kept = [t.clone() for t in overwrites]

            def trial(s: Schedule):
                for t, c in zip(overwrites, kept):
                    t.copy_(c)
                run(s)
            chosen = autotune.choose(name, registry.spec_hash(name, **params), bucket,
                                     tune_configs(sched), trial, device)
            for t, c in zip(overwrites, kept):
                t.copy_(c)
            return chosen
        sched = autotune.memo(
            ("attention", name, tuple(sorted(params.items())), sched, bucket, str(device),
             os.environ.get("HECTOR_CACHE_DIR")), pick)
    run(sched)


def _traversal(graph, csr, sched: Schedule, heads: int):
    """(grid, chunk table, number of chunks) of one traversal over the rows of ``csr``."""
    hb = -(-heads // sched.block_h)
    if sched.strategy == "edge":
        rows = chunk_rows(graph, csr, sched.chunk)
        return (rows.shape[0], hb), rows, rows.shape[0]
    return (csr.ptr.numel() - 1, hb), csr.ptr, 0


def _combine_sum(csr, sched, rows, row_ids, nchunks, part, out):
    """Add the partials of rows cut by chunk boundaries into ``out``, whose rows may be wider
    than the partials' (dk or dv as a slice of a joint dk|dv buffer): its row stride is
    passed."""
    if nchunks > 1:
        width = part.shape[-1]
        block_w = min(1024, next_pow2(width))
        registry.kernel("combine_sum")[(nchunks - 1, -(-width // block_w))](
            csr.ptr, rows, row_ids, part, out, width, out.stride(0), sched.chunk,
            BLOCK_W=block_w)


def rows_dense(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``t`` itself when its last two dims are dense (``stride(-1) == 1`` and ``stride(-2) ==
    shape[-1]``; a dim of size 1 may have any stride), whatever its row stride; else a
    contiguous copy.  The kernels take k's and v's row strides, so a k and a v that are column
    slices of one ``[rows, H*DK + H*DV]`` buffer (K and V computed by one GEMM) are read in
    place, without the copy a ``.contiguous()`` would make."""
    if t is None:
        return None
    last_ok = t.shape[-1] == 1 or t.stride(-1) == 1
    heads_ok = t.dim() < 2 or t.shape[-2] == 1 or t.stride(-2) == t.shape[-1]
    return t if last_ok and heads_ok else t.contiguous()


def _row_stride(t: Optional[torch.Tensor], dense: int) -> int:
    """Row stride (elements) of a kernel operand; ``dense`` where the slot holds a dummy."""
    return t.stride(0) if t is not None else dense


def _check_joint(joint_kv: bool, need_k: bool, need_v: bool) -> None:
    if joint_kv and not (need_k and need_v):
        raise ValueError("joint_kv=True needs both the k and the v gradient (needs[2] and "
                         f"needs[0]); got need_k={need_k}, need_v={need_v}")


def _joint_kv_buffer(skips: bool, n_src: int, heads: int, dim_k: int, dim_v: int, dtype,
                     device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dkv ``[n_src, H*DK + H*DV]``, dk, dv): dk and dv are views of its two column slices,
    so the backward writes the gradient of a joint K|V GEMM output directly (the kernels
    take dk's and dv's row strides).  Zeros where the traversal ``skips`` rows, like
    :func:`_rows_out`."""
    dkv = _rows_out(skips, (n_src, heads * (dim_k + dim_v)), dtype=dtype, device=device)
    dk = dkv[:, :heads * dim_k].unflatten(1, (heads, dim_k))
    dv = dkv[:, heads * dim_k:].unflatten(1, (heads, dim_v))
    return dkv, dk, dv


def _check_into(v: Optional[torch.Tensor], k: Optional[torch.Tensor]) -> None:
    """The k and v that ``into_kv`` writes over: read by the kernels in place (no copy) and
    disjoint (two column ranges of one buffer, or two buffers)."""
    for t, name in ((v, "v"), (k, "k")):
        if t is not None and rows_dense(t) is not t:
            raise ValueError(f"into_kv: {name} must have dense heads and columns (any row "
                             f"stride) to be written in place; got strides {t.stride()}")
    if v is not None and k is not None and overlap(v, k):
        raise ValueError("into_kv: k and v overlap in memory, so their gradients cannot "
                         "both be written over them")


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may share elements (conservative): one storage and intersecting
    spans, unless both are ``[rows, ...]`` tensors of the same rows and row stride, dense
    within a row, whose column ranges do not intersect (k and v as two column slices of one
    K|V GEMM output)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    size = a.element_size()
    spans = [(t.data_ptr(), t.data_ptr() + size * (1 + sum((n - 1) * st for n, st in
                                                           zip(t.shape, t.stride()))))
             for t in (a, b)]
    if spans[0][1] <= spans[1][0] or spans[1][1] <= spans[0][0]:
        return False
    stride = a.stride(0)
    if (b.stride(0) != stride or a.shape[0] != b.shape[0] or b.element_size() != size
            or any(rows_dense(t) is not t or t[0].numel() > stride for t in (a, b))):
        return True
    base = a.untyped_storage().data_ptr()
    ca, cb = ((t.data_ptr() - base) // size for t in (a, b))
    if ca // stride != cb // stride:     # not the same rows
        return True
    lo_a, lo_b = ca % stride, cb % stride
    return not (lo_a + a[0].numel() <= lo_b or lo_b + b[0].numel() <= lo_a)


def joint_of(dk: torch.Tensor, dv: torch.Tensor) -> torch.Tensor:
    """The joint ``[n_src, H*DK + H*DV]`` buffer whose column slices are the dk and dv that
    ``attention_backward(..., joint_kv=True)`` returned (the tensor itself, not a view, when
    dk still knows it as its base)."""
    width = dk.shape[1] * dk.shape[2] + dv.shape[1] * dv.shape[2]
    base = dk._base
    if base is not None and tuple(base.shape) == (dk.shape[0], width) and \
            base.data_ptr() == dk.data_ptr() and base.is_contiguous():
        return base
    # Rebuilt from the views only if they are exactly its two column slices.
    if dk.shape[0] and (dk.stride(0) != width or dv.stride(0) != width or
                        dv.data_ptr() != dk.data_ptr() + dk.shape[1] * dk.shape[2]
                        * dk.element_size()):
        raise RuntimeError("joint_of: dk and dv are not the column slices of one "
                           "[rows, H*DK + H*DV] buffer")
    return dk.as_strided((dk.shape[0], width), (width, 1), dk.storage_offset())


def attention_forward(graph, spec: AttentionSpec, plan: AttentionPlan, params: tuple,
                      v, q, k, a_src, a_dst, bias=None, dst_index=None):
    """(out, lse): the forward traversal (and the combine pass of an edge-parallel one).
    ``bias`` ``[H, Dv]`` (or None): added to every output row by the kernels' epilogue.
    ``dst_index`` (``spec.dst_edge``): each canonical edge's row of ``a_dst``.  ``k``, ``v``:
    any row stride (:func:`rows_dense`)."""
    v, k = rows_dense(v), rows_dense(k)
    _, heads, dim_v = v.shape
    n = side_rows(graph, "dst")
    sched = plan.dst
    full = side_csr(graph, "dst")
    csr, row_ids, n_rows = _rows_of(graph, full, sched, "dst")
    skips = csr is not full                    # edgeless rows left out (edge-parallel)
    out = torch.empty((n, heads, dim_v), dtype=v.dtype, device=v.device)
    if skips:
        # The rows the kernels skip hold the bias alone, or zeros: written there only (for a
        # 1.94M x 64 fp32 output, 1.13M rows skipped, on the H200: a full-height zero fill
        # took 0.1 ms, a broadcast copy of the bias 0.29 ms, an index_put 0.27).
        fill_rows(idle_rows(graph, full, empty_rows(graph, "dst")), out.new_zeros(heads * dim_v) if bias is None
                  else bias.reshape(-1), out.view(n, heads * dim_v))
    lse = _rows_out(skips, (n, heads), dtype=torch.float32, device=v.device)
    grid, rows, nchunks = _traversal(graph, csr, sched, heads)
    if sched.strategy == "edge":
        m_part = torch.empty(nchunks, 2, heads, dtype=torch.float32, device=v.device)
        l_part = torch.empty_like(m_part)
        acc_part = torch.empty(nchunks, 2, heads, dim_v, dtype=torch.float32, device=v.device)
    else:
        m_part = l_part = acc_part = lse
    if n > 0:
        has_bias = bias is not None
        args = (csr.ptr, csr.col, csr.eid, rows, row_ids, _or(q, v), _or(k, v), v,
                _or(a_src, lse), _or(a_dst, lse), _or(dst_index, lse), _or(bias, lse), out,
                lse, m_part, l_part,
                acc_part, *_scalars(params, lse), graph.num_edges, heads, spec.dim_qk, dim_v,
                _or(k, v).stride(0), v.stride(0), sched.chunk)
        _launch_traversal("attention_fwd", dict(score_params(spec, sched.strategy),
                                                has_bias=has_bias),
                          plan, sched, grid, args, _shape(n_rows, graph.num_edges, spec),
                          v.device)
        if nchunks > 1:
            registry.kernel("attention_combine", has_bias=has_bias)[(nchunks - 1, grid[1])](
                csr.ptr, rows, row_ids, m_part, l_part, acc_part, _or(bias, lse), out, lse,
                heads, dim_v, sched.chunk, BLOCK_H=sched.block_h, BLOCK_DV=sched.block_dv)
    return out, lse


def attention_backward(graph, spec: AttentionSpec, plan: AttentionPlan, params: tuple,
                       needs: tuple, dout, v, q, k, a_src, a_dst, out, lse, dlse=None,
                       bias=None, dst_index=None, joint_kv: bool = False,
                       into_kv: bool = False):
    """(dv, dq, dk, d a_src, d a_dst), None where ``needs`` (same order) is False.
    ``dlse``: the gradient of the log-sum-exp output, if it has one.  Since ``d lse_v / d
    s_e = alpha_e``, it joins ``ds_e = alpha_e (<dout_v, v_u> - delta_v)`` as ``delta_v -
    dlse_v``: the kernels run unchanged.  ``dst_index`` (``spec.dst_edge``): each canonical
    edge's row of ``a_dst``, whose gradient then has ``a_dst``'s rows (summed with atomics).
    Other gradients have their side's rows (:func:`side_rows`: a derived graph's sources or
    destinations).  ``bias``: the forward's epilogue bias, which ``out`` includes
    (subtracted where delta reads ``out``).  ``k``, ``v``: any row stride (:func:`rows_dense`).

    ``joint_kv`` (needs both the k and the v gradient): dk and dv are written into one
    ``[n_src, H*DK + H*DV]`` buffer (dk's columns first) and returned as views of it
    (:func:`joint_of` gives it back): the gradient of a GEMM that computed K and V together
    into such a buffer, with no concatenation afterwards.

    ``into_kv``: dk and dv are written over k's and v's own rows (the caller's last read of
    them; see :func:`edge_attention_grads_triton`), which must then need no copy
    (:func:`rows_dense`) and not overlap: the source-side kernel reads a row's k and v only
    in the program that writes its gradients, after the destination side read them per edge.
    Returned as those same tensors (with ``joint_kv``, column views of one buffer)."""
    need_v, need_q, need_k, need_src, need_dst = needs
    _check_joint(joint_kv, need_k, need_v)
    if into_kv:
        _check_into(v if need_v else None, k if need_k else None)
    v, k = rows_dense(v), rows_dense(k)
    n_src, heads, dim_v = v.shape              # (side_rows(graph, "src"))
    n = side_rows(graph, "dst")
    dim_k = spec.dim_qk
    dout = dout.contiguous()
    if graph.num_nodes == 0 or not any((need_v, need_q, need_k, need_src, need_dst)):
        empty = [torch.empty_like(t) if need else None for t, need in
                 ((v, need_v), (q, need_q), (k, need_k), (a_src, need_src), (a_dst, need_dst))]
        if into_kv:      # no edges: zero gradients, in the consumed rows
            empty[0], empty[2] = (t.zero_() if need else None
                                  for t, need in ((v, need_v), (k, need_k)))
        elif joint_kv:
            _, empty[2], empty[0] = _joint_kv_buffer(False, n_src, heads, dim_k, dim_v,
                                                     k.dtype, v.device)
        return tuple(empty)
    dq = dk = dv = da_src = da_dst = None
    delta = torch.empty(n, heads, dtype=torch.float32, device=v.device)
    rows_total = n * heads
    registry.kernel("row_dot", has_bias=bias is not None)[(-(-rows_total // 16),)](
        dout, out, _or(bias, delta), delta, rows_total, dim_v, heads, BLOCK_R=16,
        BLOCK_D=min(next_pow2(dim_v), 128))
    if dlse is not None:
        delta -= dlse
    fp32 = dict(dtype=torch.float32, device=v.device)

    if need_q or need_dst:
        # Rows are destinations: q, a_dst, dout, lse, delta are read (and dq, d a_dst
        # written) per row; k, v, a_src per edge through the column ids.
        sched = plan.dst
        full = side_csr(graph, "dst")
        csr, row_ids, n_rows = _rows_of(graph, full, sched, "dst")
        skips = csr is not full
        tensors = (_or(q, v), _or(k, v), v, _or(a_src, lse), _or(a_dst, lse),
                   _or(dst_index, lse), dout, lse, delta)
        dq = _rows_out(skips, (n, heads, dim_k), dtype=q.dtype, device=v.device) if need_q else None
        per_edge = need_dst and spec.dst_edge     # summed per edge into a_dst's rows
        if per_edge:     # zeroed by the launch (before every autotune trial too)
            da_dst = torch.empty(a_dst.shape[0], heads, **fp32)
        elif need_dst:
            da_dst = _rows_out(skips, (n, heads), dtype=a_dst.dtype, device=v.device)
        grid, rows, nchunks = _traversal(graph, csr, sched, heads)
        dq_part = torch.empty(nchunks, 2, heads * dim_k, **fp32) if need_q and nchunks else lse
        dd_part = (torch.empty(nchunks, 2, heads, **fp32) if need_dst and nchunks
                   and not per_edge else lse)
        args = (csr.ptr, csr.col, csr.eid, rows, row_ids, *tensors, _or(dq, lse),
                _or(da_dst, lse), dq_part, dd_part, *_scalars(params, lse), graph.num_edges,
                heads, dim_k, dim_v, tensors[1].stride(0), v.stride(0), sched.chunk)
        _launch_traversal("attention_bwd_dst", dict(score_params(spec, sched.strategy),
                                                    need_dq=need_q, need_ddst=need_dst),
                          plan, sched, grid, args, _shape(n_rows, graph.num_edges, spec),
                          v.device, accumulates=da_dst if per_edge else None)
        for flag, part, grad in ((need_q, dq_part, dq),
                                 (need_dst and not per_edge, dd_part, da_dst)):
            if flag:
                _combine_sum(csr, sched, rows, row_ids, nchunks, part, grad)
        if per_edge:
            da_dst = da_dst.to(a_dst.dtype)

    if need_k or need_v or need_src:
        # Rows are sources: k, v, a_src are read (and dk, dv, d a_src written) per row;
        # q, a_dst, dout, lse, delta per edge through the column ids (destinations).
        sched = plan.src
        full = side_csr(graph, "src")
        csr, row_ids, n_rows = _rows_of(graph, full, sched, "src")
        skips = csr is not full
        tensors = (_or(q, v), _or(k, v), v, _or(a_src, lse), _or(a_dst, lse),
                   _or(dst_index, lse), dout, lse, delta)
        new = dict(device=v.device)
        if into_kv:
            dk, dv = (k if need_k else None), (v if need_v else None)
        elif joint_kv:
            _, dk, dv = _joint_kv_buffer(skips, n_src, heads, dim_k, dim_v, k.dtype, v.device)
        else:
            dk = _rows_out(skips, (n_src, heads, dim_k), dtype=k.dtype, **new) if need_k else None
            dv = _rows_out(skips, (n_src, heads, dim_v), dtype=v.dtype, **new) if need_v else None
        da_src = (_rows_out(skips, (n_src, heads), dtype=a_src.dtype, **new) if need_src
                  else None)
        grid, rows, nchunks = _traversal(graph, csr, sched, heads)
        dk_part = torch.empty(nchunks, 2, heads * dim_k, **fp32) if need_k and nchunks else lse
        dv_part = torch.empty(nchunks, 2, heads * dim_v, **fp32) if need_v and nchunks else lse
        ds_part = torch.empty(nchunks, 2, heads, **fp32) if need_src and nchunks else lse
        args = (csr.ptr, csr.col, csr.eid, rows, row_ids, *tensors, _or(dk, lse), _or(dv, lse),
                _or(da_src, lse), dk_part, dv_part, ds_part, *_scalars(params, lse),
                graph.num_edges, heads, dim_k, dim_v, tensors[1].stride(0), v.stride(0),
                _row_stride(dk, heads * dim_k), _row_stride(dv, heads * dim_v), sched.chunk)
        consumed = [t for t in (dk, dv) if t is not None] if into_kv else []
        _launch_traversal("attention_bwd_src", dict(score_params(spec, sched.strategy),
                                                    need_dk=need_k, need_dv=need_v,
                                                    need_dsrc=need_src),
                          plan, sched, grid, args, _shape(n_rows, graph.num_edges, spec),
                          v.device, overwrites=consumed)
        for flag, part, grad in ((need_k, dk_part, dk), (need_v, dv_part, dv),
                                 (need_src, ds_part, da_src)):
            if flag:
                _combine_sum(csr, sched, rows, row_ids, nchunks, part, grad)
        if consumed and skips:      # rows with no edges were not written: their gradient is 0
            keep = torch.zeros(n_src, dtype=v.dtype, device=v.device)
            keep[row_ids.long()] = 1
            for t in consumed:
                t.mul_(keep.view(-1, 1, 1))
    return dv, dq, dk, da_src, da_dst


class EdgeAttentionFunction(torch.autograd.Function):
    """A call with a pinned schedule (tests, tuning scripts); the rest runs the
    ``hector::edge_attention`` custom op (below)."""

    @staticmethod
    def forward(ctx, graph, spec: AttentionSpec, plan: AttentionPlan, params: tuple,
                v, q, k, a_src, a_dst, bias=None):
        out, lse = attention_forward(graph, spec, plan, params, v, q, k, a_src, a_dst, bias)
        ctx.graph, ctx.spec, ctx.plan, ctx.params = graph, spec, plan, params
        ctx.save_for_backward(v, q, k, a_src, a_dst, out, lse, bias)
        return out

    @staticmethod
    def backward(ctx, dout):
        *saved, bias = ctx.saved_tensors
        dout = dout.contiguous()
        grads = attention_backward(ctx.graph, ctx.spec, ctx.plan, ctx.params,
                                   tuple(ctx.needs_input_grad[4:9]), dout, *saved, bias=bias)
        dbias = bias_grad(dout, bias) if ctx.needs_input_grad[9] else None
        return (None, None, None, None, *grads, dbias)



def _shape(rows: int, edges: int, spec: AttentionSpec) -> tuple:
    """Sizes whose power-of-two bucket keys a traversal's tuning: rows, edges, row width."""
    return rows, edges, spec.heads * max(spec.dim_qk, spec.dim_v)


def _or(t: Optional[torch.Tensor], dummy: torch.Tensor) -> torch.Tensor:
    # Absent operands are not rendered into the kernel; any pointer fills the slot.
    return t if t is not None else dummy


def _scalars(params: tuple, dummy: torch.Tensor):
    """(scale, slope, seed pointer, keep threshold, 1/(1-p)) as the kernels take them; the
    seed is read by the kernels from device memory (``dummy`` fills the slot without
    dropout, where the kernels are rendered without the read)."""
    scale, slope, p, seed = params
    return (float(scale), float(slope if slope is not None else 0.0),
            seed_tensor(seed, dummy.device) if p > 0 else dummy,
            dropout_threshold(p) if p > 0 else 0, 1.0 / (1.0 - p) if p > 0 else 1.0)


def seed_tensor(seed, device) -> torch.Tensor:
    """The dropout seed as the one-element int64 device tensor the kernels read: a tensor
    seed as it is (drawn on the device: see ``op.draw_seed``), an int filled in on the device
    (a fill, not a host-to-device copy)."""
    if isinstance(seed, torch.Tensor):
        return seed.reshape(1).to(device=device, dtype=torch.int64)
    return torch.full((1,), int(seed or 0) & 0x7FFFFFFF, dtype=torch.int64, device=device)


# -- the custom operators (torch.library) ---------------------------------------------------
# Opaque custom ops rather than ``triton_op``: inductor tracing into the attention template was
# seen to re-type its running max ``m_i`` from fp32 to fp64, and the launch code around the
# kernels (strategy choice, chunk tables, autotuning) reads host values that must stay out of
# a traced graph anyway.  torch.compile and CUDA-graph capture see one node per direction with
# a shape-only fake implementation.  Ops take no Python objects: the graph travels as an int
# handle (``graph_handle``), the spec is rebuilt from the tensors, the plan is memoised per
# (graph, spec, strategy) inside the op.  The dropout seed travels as a one-element device
# tensor (``seed_tensor``; the int ``seed`` is only used when it is None): the kernels read it
# from memory, so a captured graph that redraws it on the device (``op.draw_seed``) drops a
# fresh mask on every replay.

#: Graph handles for the ops (weak: a freed mini-batch graph's entry goes with it).
_GRAPHS = HandleTable("_attention_op_handle", "graph")
_next_handle = itertools.count(1)       # launch handles are never reused, though entries go


def graph_handle(graph) -> int:
    """A process-unique int naming ``graph`` for the custom ops (memoised on the graph)."""
    return _GRAPHS.handle(graph)


def _graph(handle: int):
    return _GRAPHS.get(handle)


class _Launch:
    """(spec, plan) of one launch handle, an object the table can hold weakly."""
    __slots__ = ("spec", "plan", "__weakref__")

    def __init__(self, spec: AttentionSpec, plan: AttentionPlan):
        self.spec, self.plan = spec, plan


#: launch handle -> (spec, plan) a caller decided (the compiler's attention steps).  Weak: the
#: plan holds its entry, and the plan lives as long as whoever chose it keeps it (the
#: compiler: memoised on the graph's index), so a mini-batch's entries go with its graph.
_LAUNCHES: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def launch_handle(graph, spec: AttentionSpec, plan: AttentionPlan) -> int:
    """A process-unique int naming the caller's (spec, plan) for the custom op, memoised on
    the plan object (a copy gets its own), so the op launches exactly those objects."""
    mark = getattr(plan, "_launch_handle", None)
    if mark is not None and torch.compiler.is_compiling():
        return mark              # dynamo cannot trace the weak table; it guards on the mark
    entry = _LAUNCHES.get(mark) if mark is not None else None
    if entry is None or entry.plan is not plan or entry.spec is not spec:
        mark, entry = next(_next_handle), _Launch(spec, plan)
        # frozen dataclass: memos only; the entry is held here so the weak table keeps it
        object.__setattr__(plan, "_launch_handle", mark)
        object.__setattr__(plan, "_launch_entry", entry)
        _LAUNCHES[mark] = entry
    return mark


def _op_setup(handle, v, q, a_src, a_dst, negative_slope, dropout, strategy, launch=0):
    """(graph, spec, plan) of one op call: the caller's (``launch`` > 0), or derived from the
    tensors with the plan memoised per (graph, spec, strategy)."""
    graph = _graph(handle)
    if launch:
        entry = _LAUNCHES[launch]
        return graph, entry.spec, entry.plan
    spec = AttentionSpec.of(v, q, a_src, a_dst, negative_slope, has_dropout=dropout > 0)
    return graph, spec, _memo_plan(graph, spec, strategy)


def _memo_plan(graph, spec: AttentionSpec, strategy: str) -> AttentionPlan:
    """The heuristic plan of ``spec`` on ``graph``, made once per (graph, spec, strategy)."""
    table = _chunk_tables.setdefault(graph, {})
    key = ("plan", spec, strategy)
    if key not in table:
        table[key] = make_plan(graph, spec, strategy)
    return table[key]


@torch.library.custom_op("hector::edge_attention", mutates_args=())
def edge_attention_op(graph: int, v: torch.Tensor, q: Optional[torch.Tensor],
                      k: Optional[torch.Tensor], a_src: Optional[torch.Tensor],
                      a_dst: Optional[torch.Tensor], scale: float,
                      negative_slope: Optional[float], dropout: float, seed: int,
                      strategy: str, launch: int, seed_tensor: Optional[torch.Tensor] = None,
                      bias: Optional[torch.Tensor] = None,
                      dst_index: Optional[torch.Tensor] = None
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out ``[N, H, Dv]``, lse ``[N, H]`` fp32, kept for the backward); ``bias`` ``[H, Dv]``:
    added to every output row by the kernels' epilogue; ``dst_index``: see
    :func:`attention_forward` (only with a caller's spec, ``launch``)."""
    g, spec, plan = _op_setup(graph, v, q, a_src, a_dst, negative_slope, dropout, strategy,
                              launch)
    return attention_forward(g, spec, plan, (scale, negative_slope, dropout,
                                             _seed_of(seed, seed_tensor)), v, q, k, a_src, a_dst,
                             bias, dst_index)


def _seed_of(seed: int, seed_tensor: Optional[torch.Tensor]):
    return seed_tensor if seed_tensor is not None else seed


@edge_attention_op.register_fake
def _(graph, v, q, k, a_src, a_dst, scale, negative_slope, dropout, seed, strategy, launch,
      seed_tensor=None, bias=None, dst_index=None):
    n = side_rows(_graph(graph), "dst")
    return (v.new_empty((n,) + tuple(v.shape[1:])),
            v.new_empty((n, v.shape[1]), dtype=torch.float32))


@torch.library.custom_op("hector::edge_attention_backward", mutates_args=())
def edge_attention_backward_op(
        graph: int, dout: torch.Tensor, v: torch.Tensor, q: Optional[torch.Tensor],
        k: Optional[torch.Tensor], a_src: Optional[torch.Tensor], a_dst: Optional[torch.Tensor],
        out: torch.Tensor, lse: torch.Tensor, scale: float, negative_slope: Optional[float],
        dropout: float, seed: int, strategy: str, launch: int,
        needs: List[bool], seed_tensor: Optional[torch.Tensor] = None,
        dlse: Optional[torch.Tensor] = None,
        bias: Optional[torch.Tensor] = None,
        dst_index: Optional[torch.Tensor] = None, joint_kv: bool = False) -> List[torch.Tensor]:
    """[dv, dq, dk, d a_src, d a_dst]; a gradient not asked for is an empty tensor (a
    schema output cannot be None).  ``dlse``: the log-sum-exp output's gradient, if any;
    ``bias``, ``dst_index``: see :func:`attention_backward` (the bias's own
    gradient is a column sum of ``dout``, taken by the autograd formula).

    ``joint_kv`` (both the k and the v gradient asked for): ``[empty, dq, dkv, d a_src,
    d a_dst]`` with ``dkv`` ``[n_src, H*DK + H*DV]``, dk's columns first: the gradient of a
    GEMM that computed K and V into one buffer, written by the kernels in place (no
    concatenation).  One tensor in dk's slot and an empty one in dv's, since a custom op's
    outputs must not alias each other."""
    g, spec, plan = _op_setup(graph, v, q, a_src, a_dst, negative_slope, dropout, strategy,
                              launch)
    # Positional: the compiler's tests spy on attention_backward with (graph, spec, plan, *rest).
    grads = list(attention_backward(g, spec, plan, (scale, negative_slope, dropout,
                                                    _seed_of(seed, seed_tensor)),
                                    tuple(needs), dout, v, q, k, a_src, a_dst, out, lse,
                                    None if dlse is None else dlse.float(), bias, dst_index,
                                    joint_kv))
    if joint_kv:
        grads[0], grads[2] = None, joint_of(grads[2], grads[0])
    return [gr if gr is not None else v.new_empty(0) for gr in grads]


@torch.library.custom_op("hector::edge_attention_backward_into", mutates_args=("v", "k"))
def edge_attention_backward_into_op(
        graph: int, dout: torch.Tensor, v: torch.Tensor, q: Optional[torch.Tensor],
        k: Optional[torch.Tensor], a_src: Optional[torch.Tensor], a_dst: Optional[torch.Tensor],
        out: torch.Tensor, lse: torch.Tensor, scale: float, negative_slope: Optional[float],
        launch: int, needs: List[bool], bias: Optional[torch.Tensor] = None,
        dst_index: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """``hector::edge_attention_backward`` (no dropout) that writes dv over ``v`` and dk
    over ``k`` (each where ``needs`` asks for it; both given, in the op's order [v, q, k,
    a_src, a_dst]) and returns ``[dq, d a_src, d a_dst]`` (empty where not asked for): a
    backward that reads the forward's k and v for the last time needs no second buffer of
    their size (HGT and RGAT on wikikg2: 6.2 and 3.1 GiB).  A custom op's outputs may not
    alias its inputs, so the two gradients are the mutated inputs themselves."""
    g, spec, plan = _op_setup(graph, v, q, a_src, a_dst, negative_slope, 0.0, "auto", launch)
    grads = attention_backward(g, spec, plan, (scale, negative_slope, 0.0, 0), tuple(needs),
                               dout, v, q, k, a_src, a_dst, out, lse, None, bias, dst_index,
                               False, True)
    return [gr if gr is not None else v.new_empty(0) for gr in (grads[1], grads[3], grads[4])]


@edge_attention_backward_into_op.register_fake
def _(graph, dout, v, q, k, a_src, a_dst, out, lse, scale, negative_slope, launch, needs,
      bias=None, dst_index=None):
    # (no _check_into here: a fake tensor has no data pointers; the real op checks)
    n_src, n = v.shape[0], side_rows(_graph(graph), "dst")
    rows = (n, n_src, a_dst.shape[0] if a_dst is not None else n)
    return [v.new_empty((r,) + tuple(t.shape[1:]), dtype=t.dtype)
            if need and t is not None else v.new_empty(0)
            for t, need, r in zip((q, a_src, a_dst), (needs[1], needs[3], needs[4]), rows)]


@edge_attention_backward_op.register_fake
def _(graph, dout, v, q, k, a_src, a_dst, out, lse, scale, negative_slope, dropout, seed,
      strategy, launch, needs, seed_tensor=None, dlse=None, bias=None, dst_index=None,
      joint_kv=False):
    # Gradients have their side's rows (v's for the sources); a_dst's has its own rows (a
    # per-edge destination term's are (dst, relation) rows).
    _check_joint(joint_kv, needs[2], needs[0])
    n_src, n = v.shape[0], side_rows(_graph(graph), "dst")
    rows = [n_src, n, n_src, n_src, a_dst.shape[0] if a_dst is not None else n]
    grads = [v.new_empty((r,) + tuple(t.shape[1:]), dtype=t.dtype)
             if need and t is not None else v.new_empty(0)
             for t, need, r in zip((v, q, k, a_src, a_dst), needs, rows)]
    if joint_kv:
        width = k.shape[1] * k.shape[2] + v.shape[1] * v.shape[2]
        grads[0], grads[2] = v.new_empty(0), v.new_empty((n_src, width), dtype=k.dtype)
    return grads


def _setup_context(ctx, inputs, output):
    graph, v, q, k, a_src, a_dst, *rest = inputs
    # rest: scale, slope, dropout, seed, strategy, launch, then the optional seed_tensor,
    # bias and dst_index.
    scalars = rest[:6]
    seed_t, bias, dst_index = (list(rest[6:9]) + [None] * 3)[:3]
    ctx.graph, ctx.scalars = graph, scalars
    # The seed tensor is saved too: the backward redraws the forward's mask from it.
    ctx.save_for_backward(v, q, k, a_src, a_dst, *output, seed_t, bias, dst_index)


def _autograd_backward(ctx, dout, dlse):
    needs = list(ctx.needs_input_grad[1:6])
    *saved, seed_t, bias, dst_index = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(saved[-2])
    grads = call(edge_attention_backward_op, ctx.graph, dout, *saved, *ctx.scalars, needs,
                 seed_t, dlse, bias=bias, dst_index=dst_index)
    need_bias = len(ctx.needs_input_grad) > 13 and ctx.needs_input_grad[13]
    return (None, *[g if need else None for g, need in zip(grads, needs)],
            None, None, None, None, None, None, None,
            bias_grad(dout, bias) if need_bias else None, None)


def bias_grad(dout: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The epilogue bias's gradient: ``dout`` summed over its rows, as a GEMV against a ones
    vector (a column reduction ran far below bandwidth on the H200: ``nn._bias``)."""
    return column_sum(dout.reshape(dout.shape[0], -1)).reshape(bias.shape).to(bias.dtype)


edge_attention_op.register_autograd(_autograd_backward, setup_context=_setup_context)


def edge_attention_grads_triton(graph, spec: AttentionSpec, plan: AttentionPlan, needs,
                                dout, v, q, k, a_src, a_dst, out, lse, scale: float,
                                negative_slope: Optional[float],
                                dst_index: Optional[torch.Tensor] = None,
                                joint_kv: bool = False,
                                bias: Optional[torch.Tensor] = None,
                                into_kv: bool = False) -> List[torch.Tensor]:
    """The fused backward as the ``hector::edge_attention_backward`` op, called directly by
    the compiler's backward plan (whose IR autodiff differentiated the attention as one
    operator): ``[dv, dq, dk, d a_src, d a_dst]`` for ``needs`` (same order), an empty tensor
    where not asked for.  ``out``, ``lse``: the forward's (``return_lse`` below); no dropout.
    ``dst_index``: see :func:`attention_backward`.  ``k``, ``v``: any row stride (column
    slices of one K|V GEMM output are not copied: :func:`rows_dense`).  ``joint_kv``: dk and
    dv as one ``[n_src, H*DK + H*DV]`` tensor in dk's slot, an empty one in dv's (see the
    op).  ``bias``: the forward's epilogue bias ``[H, Dv]`` (``out`` includes it); its own
    gradient is the caller's.

    ``into_kv``: dv and dk written over ``v`` and ``k`` themselves, which the caller reads
    for the last time here (``hector::edge_attention_backward_into``; they must need no
    copy and not overlap); the same return value, the gradients being those tensors (with
    ``joint_kv``, :func:`joint_of` them: the buffer they are column slices of)."""
    _check_joint(joint_kv, needs[2], needs[0])
    # (k and v go in as they are when written over: the op refuses what it would copy)
    tensors = [t if into_kv and name in ("k", "v") else _operand(t, name)
               for t, name in zip((v, q, k, a_src, a_dst), _OPERANDS)]
    if into_kv:
        dq, da_src, da_dst = call(edge_attention_backward_into_op, graph_handle(graph),
                                  dout.contiguous(), *tensors, out.contiguous(),
                                  lse.contiguous(), float(scale), negative_slope,
                                  launch_handle(graph, spec, plan), list(needs),
                                  bias=None if bias is None else bias.contiguous(),
                                  dst_index=dst_index)
        dv, dk = (t if need else v.new_empty(0)
                  for t, need in ((tensors[0], needs[0]), (tensors[2], needs[2])))
        if joint_kv:
            dv, dk = v.new_empty(0), joint_of(dk, dv)
        return [dv, dq, dk, da_src, da_dst]
    return call(edge_attention_backward_op, graph_handle(graph), dout.contiguous(), *tensors,
                out.contiguous(), lse.contiguous(), float(scale), negative_slope, 0.0, 0,
                "auto", launch_handle(graph, spec, plan), list(needs), dst_index=dst_index,
                joint_kv=joint_kv, bias=None if bias is None else bias.contiguous())


_OPERANDS = ("v", "q", "k", "a_src", "a_dst")


def _operand(t: Optional[torch.Tensor], name: str) -> Optional[torch.Tensor]:
    """An input as the kernels take it: k and v with any row stride (no copy of a slice of
    a joint K|V buffer), the others contiguous."""
    if t is None:
        return None
    return rows_dense(t) if name in ("k", "v") else t.contiguous()


def edge_attention_triton(graph, v, q=None, k=None, a_src=None, a_dst=None, scale=1.0,
                          negative_slope=None, dropout=0.0, seed=None, strategy="auto",
                          schedule: Optional[Schedule] = None, *,
                          spec: Optional[AttentionSpec] = None,
                          plan: Optional[AttentionPlan] = None, return_lse: bool = False,
                          bias: Optional[torch.Tensor] = None,
                          dst_index: Optional[torch.Tensor] = None):
    """The Triton path of :func:`hector.kernels.attention.op.edge_attention` (inputs already
    validated): the ``hector::edge_attention`` custom op, or with a pinned ``schedule`` the
    ``autograd.Function``.  ``spec`` / ``plan``: decided by the caller (the compiler) and
    launched as given (the op receives them by handle); otherwise derived from the tensors
    and planned here (inside the op, memoised per graph).  ``return_lse``: (out, the
    per-destination log-sum-exp ``[N, H]`` fp32) for a caller that runs the backward itself
    (not with a pinned ``schedule``).  ``bias``: ``[H, Dv]``, added by the epilogue.
    ``dst_index``: each canonical edge's row of ``a_dst`` (a per-edge destination term; the
    caller's ``spec`` says ``dst_edge``).  ``k``, ``v``: any row stride (:func:`rows_dense`:
    column slices of one K|V GEMM output are read in place)."""
    tensors = [_operand(t, name) for t, name in zip((v, q, k, a_src, a_dst), _OPERANDS)]
    bias = bias.contiguous() if bias is not None else None
    if schedule is None:
        if spec is None and (plan is not None or dst_index is not None):
            spec = AttentionSpec.of(v, q, a_src, a_dst, negative_slope, has_dropout=dropout > 0,
                                    dst_index=dst_index)
        # A caller's spec without a plan gets the memoised plan: one handle per (graph, spec),
        # not a new plan and handle every call.
        launch = 0 if plan is None and spec is None else launch_handle(
            graph, spec, plan if plan is not None else _memo_plan(graph, spec, strategy))
        seed_t = seed_tensor(seed, v.device) if dropout > 0 else None
        out = call(edge_attention_op, graph_handle(graph), *tensors, float(scale),
                   negative_slope, float(dropout), 0, strategy, launch, seed_t, bias,
                   dst_index)
        return out if return_lse else out[0]
    if return_lse or dst_index is not None:
        raise ValueError("return_lse and dst_index need the custom op's path (no pinned "
                         "schedule)")
    if spec is None:
        spec = AttentionSpec.of(v, q, a_src, a_dst, negative_slope, has_dropout=dropout > 0)
    if plan is None:
        plan = make_plan(graph, spec, strategy, schedule)
    return EdgeAttentionFunction.apply(graph, spec, plan, (scale, negative_slope, dropout, seed),
                                       *tensors, bias)
