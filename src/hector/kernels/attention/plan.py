"""Planning of the fused edge attention on the Triton path: the strategy choice (DF-GNN's
dynamic fusion: node- or edge-parallel per side), :class:`AttentionPlan` and its memo per
(graph, spec, strategy), and the per-graph row tables the traversals walk (equal edge chunks,
the rows with and without edges, each side's cut CSR).

Everything here reads the graph only (its CSRs and degree statistics), never the attention's
operands; the row tables and memoised plans are kept per graph in one weak table (a freed
mini-batch graph's entries go with it).  The launches that walk these tables are in
:mod:`.launch`.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Optional, Tuple

import torch

from ...device import DEFAULT_NUM_SMS, num_sms
from ...graph.structures import CSR
from .spec import MIN_CHUNK, AttentionSpec, Schedule, default_schedule

#: Programs in flight per SM assumed by the strategy rule's fair share.
PROGRAMS_PER_SM = 4
#: One-warp edge-parallel programs resident per SM that the chunk size aims at: the chunks
#: are latency-bound gathers, so they need many programs in flight: on the H200 mid-size
#: graphs ran faster with 128-edge chunks than with the 1024 of a rule aiming at two programs
#: x 4 per SM, while mag's derived graph stays at MAX_CHUNK (docs/perf-notes.md, "Fused
#: attention kernels", 2026-11-24).
CHUNK_PROGRAMS_PER_SM = 48
#: Programs a small graph's short chunks aim at (``spec.SMALL_CHUNK``): fewer than
#: CHUNK_PROGRAMS_PER_SM, since each chunk pays a row search, partial writes and its share of
#: the combine pass.  16 per SM gives cora and synthetic pubmed the chunks that ran fastest
#: on the H200 (docs/perf-notes.md, "Fused attention kernels", 2026-11-28); amazon-computers
#: and github-musae stay at MIN_CHUNK.
SMALL_GRAPH_PROGRAMS_PER_SM = 16
#: On a small graph (chunks shorter than MIN_CHUNK), node-parallel is as slow as its longest
#: row's walk: more than this many edge tiles one after another, short chunks are faster.
#: On the H200 rows of 75-84 tiles ran faster edge-parallel and rows of 38-42 tiles did not,
#: so those stay node-parallel (docs/perf-notes.md, "Fused attention kernels", 2026-11-28).
LONG_WALK_TILES = 48
#: Below this in-degree no row is long enough to straggle, whatever the graph.
MIN_STRAGGLER_DEGREE = 512
#: A row straggles once it holds more than this fraction of a fair share of the edges.  A
#: node-parallel program walks its row serially, one latency-bound edge tile (about 1 us on
#: the H200) after another, while the other programs stream their rows at full bandwidth, so
#: a row well below one share already decides the call's time (HGT's derived graph of
#: synthetic mag: docs/perf-notes.md, "Compiled relational layers", 2026-11-23).  The reddit,
#: products and proteins profiles (longest rows 0.05-0.1 shares) stay node-parallel.
STRAGGLER_SHARE = 1 / 3
#: Mean degree from which rows count as long (see ``choose_strategy``).
LONG_ROW_MEAN_DEGREE = 256
#: Rows this short on average, and more than SHORT_ROWS_PER_LANE per program in flight, go
#: edge-parallel: one program per row then costs more to schedule than its edges take
#: (compiled RGAT's source side on synthetic wikikg2, 1.25 edges per row: docs/perf-notes.md,
#: "Compiled relational layers", 2026-11-24).
SHORT_ROW_MEAN_DEGREE = 2.0
SHORT_ROWS_PER_LANE = 64

_chunk_tables: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def choose_strategy(degree, num_edges: int, sms: int = DEFAULT_NUM_SMS,
                    heads: int = 1, tile: int = 0, chunk: int = 0) -> Tuple[str, str]:
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

    On a small graph, where edge-parallel chunks (``chunk`` edges, from the schedule) are
    shorter than MIN_CHUNK, a row of more than LONG_WALK_TILES edge tiles (``tile`` edges
    each) goes edge-parallel: the device is mostly idle, and the call lasts as long as its
    longest serial walk (measured; see there).
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
    if tile and 0 < chunk < MIN_CHUNK and degree.max > LONG_WALK_TILES * tile:
        return "edge", (f"edge-parallel: on a graph this small the longest row's walk "
                        f"({degree.max} edges, {tile} per tile) outlasts {chunk}-edge chunks "
                        f"({facts})")
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
        edge = default_schedule(spec, "edge", graph.num_edges, stats.mean,
                                sms * CHUNK_PROGRAMS_PER_SM,
                                small_graph_programs=sms * SMALL_GRAPH_PROGRAMS_PER_SM)
        if strategy == "auto" and getattr(graph, "capacity", None) is not None:
            # A capacity block's statistics are bounds, not counts (graph/capacity.py): its
            # rows are at most the fan-out long, and most of its nodes are padding or
            # sources without rows, which the short-rows rule would count as work.
            chosen, reason = "node", ("node-parallel: a capacity block, rows bounded by the "
                                      "fan-out")
        elif strategy == "auto":
            chosen, reason = choose_strategy(stats, graph.num_edges, sms, spec.heads,
                                             tile=edge.block_e, chunk=edge.chunk)
        else:
            chosen, reason = strategy, f"{strategy}-parallel: requested by the caller"
        scheds.append(replace(edge, strategy=chosen, chunk=edge.chunk if chosen == "edge"
                              else 0, reason=reason))
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


def merge_counters(graph, csr, chunk: int, head_blocks: int) -> torch.Tensor:
    """int32 zeros, one per (row of ``csr``, block of heads): the arrival counters of an
    edge-parallel forward that merges its cut rows itself (``merge_last``; each launch's
    last arrival sets its row's back to 0, so one buffer serves every launch and replay).
    Cached with the chunk table, per (graph, csr, chunk, head blocks); launches of one
    graph on two streams at once would share it."""
    table = _chunk_tables.setdefault(graph, {})
    key = ("counts", id(csr), chunk, head_blocks)
    if key not in table:
        table[key] = torch.zeros((csr.ptr.numel() - 1) * head_blocks, dtype=torch.int32,
                                 device=csr.ptr.device)
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


def _memo_plan(graph, spec: AttentionSpec, strategy: str) -> AttentionPlan:
    """The heuristic plan of ``spec`` on ``graph``, made once per (graph, spec, strategy)."""
    table = _chunk_tables.setdefault(graph, {})
    key = ("plan", spec, strategy)
    if key not in table:
        table[key] = make_plan(graph, spec, strategy)
    return table[key]
