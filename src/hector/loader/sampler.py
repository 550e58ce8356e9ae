"""One hop of uniform neighbour sampling without replacement, vectorised over the CSR by
destination: no Python loop over nodes or edges, everything on the graph's device.

For the destination nodes of a hop, every incoming edge is a candidate.  Sorting the
candidates by (group, random 31-bit key) -- group: the destination, or (destination,
relation) when fan-outs are per relation -- lists each group's candidates in a uniformly
random order; a candidate is kept when its rank in that order is below its group's fan-out.
That is a uniform sample without replacement of ``min(degree, fanout)`` edges per group (two
equal keys, probability ~2^-31 per pair, are ordered arbitrarily).  One int64 sort; half the
time of a random permutation followed by a stable sort.

On the CPU, with one fan-out ``k`` for all relations (the common case), sorting every
candidate is most of a batch's time (synthetic products, batch 1024, fan-out 25,20: 1.3M
candidates in the second hop, the sorts 53% of the batch).  There each destination's ``k``
picks are drawn instead by Robert Floyd's algorithm, vectorised over the destinations: ``k``
steps over a ``[destinations, k]`` table, step ``i`` drawing ``t`` uniformly in ``[0, d - k +
i]`` and taking ``d - k + i`` instead when ``t`` was taken already -- a uniform ``k``-subset
of the ``d`` candidates in ``O(k^2)`` work per destination, whatever its degree; then one sort
along each row of ``k`` puts them back in CSR order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple, Union

import torch

from ..kernels.sampling.reference import floyd_table_torch


_KEY_RANGE = 2 ** 31            # random keys in [0, 2^31)
_KEY_GROUPS = 2 ** 32           # group * 2^31 + key stays below 2^63
#: Largest fan-out drawn by Floyd's algorithm on the CPU (its work grows as fan-out squared
#: per destination; a larger one sorts the candidates); 0 turns the path off.
FLOYD_MAX_FANOUT = 64
#: Floyd's algorithm is used where ``groups * k * (k + 20) < FLOYD_PAYS * candidates``: its
#: table steps (``k^2 / 2`` comparisons and ~10 ops per pick) cost far less per element than
#: the sorting path per candidate, but it walks every group, empty ones too.  Calibrated on
#: three CPU measurements, one thread (docs/perf-notes.md, "Sampling", 2026-12-04).
FLOYD_PAYS = 150


@dataclass
class SamplingIndex:
    """The graph's CSR by destination in int64 (sampling indexes it with int64 arithmetic),
    the relation of each CSR position, and each node's type: built once per loader."""
    ptr: torch.Tensor
    col: torch.Tensor
    rel: torch.Tensor
    node_type: torch.Tensor
    num_relations: int
    num_node_types: int = 1

    @staticmethod
    def of(graph) -> "SamplingIndex":
        csr = graph.csr_in
        return SamplingIndex(csr.ptr.long(), csr.col.long(), graph.etype.long()[csr.eid.long()],
                             graph.node_type.long(), graph.num_relations,
                             graph.num_node_types)


def sample_hop(index: SamplingIndex, dst: torch.Tensor, fanout: Union[int, torch.Tensor],
               generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample incoming edges of the nodes ``dst`` (global ids).

    Args:
        fanout: an int, edges per destination over all relations together, or an ``[R]``
            int64 tensor, edges per destination and relation; ``-1``: every edge.

    Returns:
        (source global id, position of the destination in ``dst``, relation) per sampled
        edge, sorted by (destination position, CSR order).
    """
    start = index.ptr[dst]
    deg = index.ptr[dst + 1] - start
    per_relation = isinstance(fanout, torch.Tensor)
    # Host sync: the size of every array below, and with one fan-out for all relations the
    # number of edges kept (min(degree, fanout) per destination) in the same read, so the
    # kept candidates need no nonzero (a second sync per hop on CUDA).
    if per_relation or fanout < 0:
        total, kept = int(deg.sum()), None
    else:
        total, kept = torch.stack([deg.sum(), deg.clamp(max=fanout).sum()]).tolist()
        if _floyd_pays(dst, fanout, fanout, dst.numel(), total):
            pos, seg = _floyd_picks(start, deg, torch.full_like(deg, fanout), fanout, kept,
                                    generator)
            return index.col[pos], seg, index.rel[pos]
    seg = torch.repeat_interleave(torch.arange(dst.numel(), device=dst.device), deg,
                                  output_size=total)
    first = torch.cumsum(deg, 0) - deg          # where each destination's candidates start
    pos = start[seg] + torch.arange(total, device=dst.device) - first[seg]
    rel = index.rel[pos]
    if all(f < 0 for f in (fanout.tolist() if per_relation else [fanout])):
        return index.col[pos], seg, rel
    if per_relation:
        low, high = fanout.min().item(), fanout.max().item()
        n, r = dst.numel(), index.num_relations
        if _floyd_pays(dst, low, high, n * r, total):
            # A row's edges are in relation order (the CSR is a stable sort of the canonical
            # order), so each (destination, relation) group is one contiguous range of it.
            counts = torch.bincount(seg * r + rel, minlength=n * r).view(n, r)
            starts = start[:, None] + torch.cumsum(counts, 1) - counts
            pos, group = _floyd_picks(starts.reshape(-1), counts.reshape(-1),
                                      fanout.repeat(n), high, None, generator)
            return index.col[pos], group // r, group % r
    group = seg * index.num_relations + rel if per_relation else seg
    if dst.numel() * index.num_relations < _KEY_GROUPS:
        key = group * _KEY_RANGE + torch.randint(0, _KEY_RANGE, (total,), generator=generator,
                                                 device=dst.device)
        cand = torch.sort(key).indices
        g = group[cand]
    else:   # too many groups to pack with a key into int64: permute, then sort stably
        perm = torch.randperm(total, generator=generator, device=dst.device)
        order = torch.sort(group[perm], stable=True)
        cand, g = perm[order.indices], order.values
    # Rank of each candidate inside its group: its index minus the index where its group
    # starts.  The groups come out of the sort in ascending order, each contiguous, so a
    # destination's group starts where its candidates started before the sort (``first``);
    # a (destination, relation) group at the first index holding its value (a binary search
    # in the sorted groups).  Not a running maximum of the group-start marks: torch.cummax
    # took 1.26 ms per hop on CUDA (synthetic mag, batch 1024), most of a hop's GPU time.
    group_start = torch.searchsorted(g, g) if per_relation else first[g]
    rank = torch.arange(total, device=dst.device) - group_start
    if kept is None:
        limit = fanout[rel[cand]]
        chosen = torch.sort(cand[(limit < 0) | (rank < limit)]).values
    else:
        # The kept candidates sorted back to CSR order (stable, readable blocks): those left
        # out sort last as ``total`` (past every position), and their count is known.
        chosen = torch.sort(torch.where(rank < fanout, cand, total)).values[:kept]
    return index.col[pos[chosen]], seg[chosen], rel[chosen]


def _floyd_pays(dst: torch.Tensor, low: int, high: int, groups: int, total: int) -> bool:
    """Whether a hop's fan-outs (``low`` to ``high``) are drawn by Floyd's algorithm: on the
    CPU, every fan-out in ``[0, FLOYD_MAX_FANOUT]`` (-1, every edge, has no bound on a group's
    picks), where its table of ``groups`` rows of ``high`` picks costs less than sorting the
    ``total`` candidates (:data:`FLOYD_PAYS`: many relations, mostly empty per destination,
    sort)."""
    return (dst.device.type == "cpu" and FLOYD_MAX_FANOUT > 0
            and 0 <= low and high <= FLOYD_MAX_FANOUT
            and groups * high * (high + 20) < FLOYD_PAYS * total)


def _floyd_picks(starts: torch.Tensor, deg: torch.Tensor, k: torch.Tensor, width: int,
                 kept, generator: torch.Generator):
    """CSR positions and group numbers of ``min(deg[g], k[g])`` picks per group ``g`` (the
    candidates ``starts[g] + [0, deg[g])``) by Floyd's algorithm
    (:func:`hector.kernels.sampling.floyd_table`), its valid entries laid
    out row after row by one scatter (``kept`` of them, or counted here when None): the
    same output, in the same order, as the sorting path."""
    n = deg.numel()
    picks, valid = floyd_table_torch(deg, k, width, generator)
    lanes = torch.arange(width)
    counts = torch.minimum(deg, k)
    if kept is None:
        kept = int(counts.sum())
    # Row g's valid picks go to [offset_g, offset_g + counts_g); invalid ones to a spare
    # slot past the end, cut off after (a boolean mask's index would call nonzero).
    offset = torch.cumsum(counts, 0) - counts
    slot = torch.where(valid, offset[:, None] + lanes[None, :], kept).reshape(-1)
    pos = torch.empty(kept + 1, dtype=torch.int64).scatter_(
        0, slot, (starts[:, None] + picks).reshape(-1))[:kept]
    group = torch.empty(kept + 1, dtype=torch.int64).scatter_(
        0, slot, torch.arange(n)[:, None].expand(n, width).reshape(-1))[:kept]
    return pos, group


def relabel(index: SamplingIndex, dst: torch.Tensor, src: torch.Tensor):
    """Local ids for the union of ``dst`` (first) and the sampled sources ``src``.

    Sources are ordered by (node type, first appearance), so each type is a contiguous range
    and, within a type, the destination nodes come first in their own order.

    Returns:
        (global id of each local node, local id of each ``dst``, local id of each ``src``).
    """
    nodes = torch.cat([dst, src])
    uniq, inverse = torch.unique(nodes, return_inverse=True)
    n = nodes.numel()
    first = torch.full((uniq.numel(),), n, dtype=torch.int64, device=nodes.device)
    first.scatter_reduce_(0, inverse, torch.arange(n, device=nodes.device), reduce="amin")
    order = torch.argsort(index.node_type[uniq] * n + first)
    local = torch.empty_like(order)
    local[order] = torch.arange(order.numel(), device=nodes.device)
    node_local = local[inverse]
    return uniq[order], node_local[:dst.numel()], node_local[dst.numel():]
