"""Frozen kernel specs for the fused attention op (DF-GNN): *what* is computed
(:class:`AttentionSpec`) kept apart from *how* it is scheduled (:class:`Schedule`), so one
semantics can run under either schedule and tests can pin a schedule (TVM/Halide style)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Optional, Tuple

import torch

from ..sizes import next_pow2

STRATEGIES = ("node", "edge")

#: Heads share a program while one node's slice of them, BLOCK_H * BLOCK_D, stays this small:
#: the per-edge index chain is then walked once per edge, not once per group of heads (RGAT's
#: 8 heads x 16 on the H200: docs/perf-notes.md, "Fused attention kernels", 2026-11-25).
_ROW_BUDGET = 128
#: Target elements of one gathered [BLOCK_E, BLOCK_H, BLOCK_D] tile, and elements per warp.
#: These kernels are latency-bound gathers: on an H200 (1M random edges, mean degree 10, bf16)
#: small tiles on one warp beat 2-8 warps by 2-3x, since more small programs stay resident to
#: hide the gathers; 256-element tiles beat 512 for 3 of 4 head shapes tried.  So a row of
#: 128 elements takes 2 edges per step, not 4 (faster for RGAT's 8 heads of 16 too).
_EDGE_TILE = 256
_WARP_TILE = 512


#: Largest edge-parallel chunk.  The programs are latency-bound gathers on one warp, so many
#: short chunks beat a few long ones (on HGT's derived graph of synthetic mag, 512-1024 edges
#: against 8192: docs/perf-notes.md, "Compiled relational layers", 2026-11-23).
MAX_CHUNK = 1024
#: Smallest edge-parallel chunk: below it the per-chunk row search, partial writes and combine
#: pass outweigh the extra programs (64-edge chunks measured 5-35% slower than 128 on
#: github-musae and amazon-computers, H200).
MIN_CHUNK = 128
#: Smallest chunk on a small graph, one whose edges cannot give every resident program a
#: MIN_CHUNK chunk: there the device is mostly idle, and what a call costs is the serial walk
#: of its longest chunk (or, node-parallel, its longest row), one latency-bound edge tile
#: after another.  Such a graph's chunks aim at fewer programs
#: (``plan.SMALL_GRAPH_PROGRAMS_PER_SM``), never below this nor below four edge tiles.
#: On the H200 (captured, 128-wide rows) cora ran fastest with 16-edge chunks and synthetic
#: pubmed with 32, while amazon-computers stays at MIN_CHUNK (docs/perf-notes.md, "Fused
#: attention kernels", 2026-11-28).
SMALL_CHUNK = 16


@dataclass(frozen=True)
class AttentionSpec:
    """Semantics of one edge-attention call, per head ``h`` and edge ``u -> v``::

        s_uv  = scale * <q_v, k_u> [has_qk] + a_src[u] [has_src] + a_dst[v] [has_dst]
        s_uv  = leaky_relu(s_uv, negative_slope)            [negative_slope is not None]
        alpha = softmax over the incoming edges of v (dropout when has_dropout)
        out_v = sum_u alpha_uv * v_u

    ``dst_edge``: the destination term is read per edge, ``a_dst[dst_index[e]]`` for the
    edge's canonical id ``e``, instead of once per destination row: a term of the (dst,
    relation) pair (RGAT's, on compact rows), so the softmax still runs over all of ``v``'s
    edges in one pass.  Its gradient is then summed into ``a_dst``'s rows with atomics.
    """
    heads: int
    dim_qk: int          # 0 when the q.k term is absent
    dim_v: int
    has_qk: bool
    has_src: bool
    has_dst: bool
    negative_slope: Optional[float]
    has_dropout: bool
    dtype: torch.dtype
    dst_edge: bool = False
    #: k and v hold one row of Dk / Dv that every head reads (``[N, H, D]`` views with head
    #: stride 0: a key shared by the heads, as a reordered Transformer's input rows); the
    #: gradients dk and dv stay per head.
    shared_kv: bool = False
    #: k's rows are v's rows divided by a per-node norm ``k_norm [N]`` (AGNN's normalised keys,
    #: ``k = x / |x|`` with ``v = x``): the destination side gathers v once per edge and forms
    #: k from it (half the bytes per edge); k itself is read only as the source side's own
    #: rows, and its gradient is returned as without the norm.
    normed_k: bool = False

    @property
    def has_leaky(self) -> bool:
        return self.negative_slope is not None

    @staticmethod
    def of(v: torch.Tensor, q=None, a_src=None, a_dst=None, negative_slope=None,
           has_dropout: bool = False, dst_index=None, k=None,
           k_norm=None) -> "AttentionSpec":
        return AttentionSpec(heads=int(v.shape[1]), dim_qk=int(q.shape[2]) if q is not None else 0,
                             dim_v=int(v.shape[2]), has_qk=q is not None,
                             has_src=a_src is not None, has_dst=a_dst is not None,
                             negative_slope=None if negative_slope is None else float(negative_slope),
                             has_dropout=has_dropout, dtype=v.dtype,
                             dst_edge=dst_index is not None, shared_kv=shared_heads(v, k),
                             normed_k=k_norm is not None)


def shared_heads(v: torch.Tensor, k=None) -> bool:
    """Whether v (and k, when given) are ``[N, H, D]`` views of one head's rows that all
    ``H > 1`` heads read (head stride 0, dense columns): the kernels then read one row per
    node instead of a copy with a row per head."""
    def one_row(t):
        return t.dim() == 3 and t.stride(1) == 0 and (t.shape[2] == 1 or t.stride(2) == 1)
    return v.dim() == 3 and v.shape[1] > 1 and one_row(v) and (k is None or one_row(k))


@dataclass(frozen=True)
class Schedule:
    """How the kernels traverse the graph.

    ``strategy='node'``: one program per (destination row, block of heads), looping over the
    row in ``block_e`` tiles.  ``strategy='edge'``: the CSR edge array cut into equal chunks of
    ``chunk`` edges regardless of row boundaries, one program per (chunk, block of heads), plus
    a short combine pass for the rows cut by chunk boundaries.
    """
    strategy: str
    block_e: int
    block_h: int
    block_dk: int
    block_dv: int
    chunk: int = 0           # edges per program; used by strategy 'edge' only
    num_warps: int = 1
    reason: str = ""

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        for name in ("block_e", "block_h", "block_dk", "block_dv"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"Schedule.{name} must be a power of two, got {value}")
        if self.strategy == "edge" and self.chunk < 1:
            raise ValueError(f"Schedule.chunk must be >= 1 for strategy 'edge', got {self.chunk}")


def default_schedule(spec: AttentionSpec, strategy: str, num_edges: int, mean_degree: float,
                     num_programs: int, reason: str = "", block_e: Optional[int] = None,
                     chunk: Optional[int] = None,
                     small_graph_programs: Optional[int] = None) -> Schedule:
    """Tile sizes from the spec and the degree statistics.

    Heads share a program while a row slice stays small (GAT's 8 heads x 8 features become one
    64-wide contiguous gather instead of eight 8-wide ones); wide heads get a grid axis.  The
    edge tile follows the mean degree (a tile much longer than the typical row is mostly masked
    lanes), capped so that one warp holds it; wider rows get more warps.  ``num_programs`` is
    how many one-warp programs the device keeps in flight; edge-parallel chunks are sized so
    that each gets about one (rounded down to a power of two), within ``MIN_CHUNK`` and
    ``MAX_CHUNK`` edges (measured; see there).  On a graph too small for that (the chunk
    would fall below ``MIN_CHUNK``) they aim at ``small_graph_programs`` programs instead,
    down to ``SMALL_CHUNK`` edges (measured; see there); without it, ``MIN_CHUNK`` holds.
    """
    block_dk = next_pow2(max(spec.dim_qk, 1))
    block_dv = next_pow2(max(spec.dim_v, 1))
    width = max(block_dk, block_dv)
    block_h = max(1, min(next_pow2(spec.heads), _ROW_BUDGET // width))
    row = block_h * width
    if block_e is None:
        block_e = min(max(next_pow2(max(int(mean_degree), 1)), 4), max(1, _EDGE_TILE // row))
    if chunk is None:
        chunk = _pow2_share(num_edges, num_programs)
        if chunk < MIN_CHUNK and small_graph_programs:
            chunk = max(min(max(_pow2_share(num_edges, small_graph_programs), SMALL_CHUNK),
                            MIN_CHUNK), 4 * block_e)
        else:
            chunk = min(max(chunk, 4 * block_e, MIN_CHUNK), MAX_CHUNK)
    num_warps = min(max(next_pow2(block_e * row) // _WARP_TILE, 1), 8)
    return Schedule(strategy=strategy, block_e=block_e, block_h=block_h, block_dk=block_dk,
                    block_dv=block_dv, chunk=chunk if strategy == "edge" else 0,
                    num_warps=num_warps, reason=reason)


def _pow2_share(num_edges: int, programs: int) -> int:
    """The power of two at or below ``num_edges / programs`` (at least 1)."""
    per_program = max(num_edges // max(programs, 1), 1)
    return next_pow2(per_program + 1) // 2


@functools.lru_cache(maxsize=1024)
def tune_configs(sched: Schedule) -> Tuple[Schedule, ...]:
    """The config list of a traversal around the heuristic ``sched`` (first: what runs
    untuned): the edge tile doubled, quadrupled and halved, twice the warps, and the doubled
    tile on twice the warps (a 128-element row starts at 2 edges per step; the old heuristic's
    4 and its tuner's 8 and 4-on-2-warps stay candidates).  Strategy, chunk and the
    head/feature tiles stay (they shape the grid, the chunk tables and the partial buffers,
    and BLOCK_D must cover a head), so every config is valid wherever ``sched`` is; edge
    tiles stay within [1, 128] and warps within [1, 8].  ``reason`` is dropped: it describes
    the graph, not the config."""
    base = replace(sched, reason="")
    seen = [base]
    wider = replace(base, block_e=min(base.block_e * 2, 128))
    for cfg in (wider, replace(base, block_e=min(base.block_e * 4, 128)),
                replace(base, block_e=max(base.block_e // 2, 1)),
                replace(base, num_warps=min(base.num_warps * 2, 8)),
                replace(wider, num_warps=min(base.num_warps * 2, 8))):
        if cfg not in seen:
            seen.append(cfg)
    return tuple(seen)
