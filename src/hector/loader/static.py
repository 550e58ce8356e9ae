"""Neighbour sampling with static capacities: a batch's blocks as device tensors whose shapes
depend only on the batch size, the fan-outs and the graph, with the batch's actual sizes kept
in device memory.  Nothing is read back to the host, so a CUDA graph captured once can replay
the sampling of every batch (the loader's generator registered with the graph).

The capacities are the worst case, derived once (:class:`Capacities`): a hop's destinations
are at most the previous hop's nodes, each with at most ``width`` sampled edges (its fan-out,
or the graph's largest in-degree where that is smaller), and its nodes at most those
destinations plus one source per edge, never more than the graph's nodes.  Valid entries are
a prefix of every buffer; what lies past it is padding, in bounds: an edge's indexes node
0, a node slot's names graph node ``slot % num_nodes`` (a gather by the slots stays in
bounds, and a gradient summed back through them -- an embedding table's -- meets no hot row:
a batch's many padding slots naming one node would serialise that sum on it).

Per hop (around the seeds first, like ``NeighborLoader.num_neighbors``):

1. every destination's picks by Floyd's algorithm (:func:`hector.kernels.sampling.floyd_table`: one
   kernel on CUDA, keyed by a seed in device memory that each call advances; a
   ``[destinations, width]`` table; per (destination, relation) group for per-relation
   fan-outs), a uniform sample without replacement of ``min(degree, fan-out)`` incoming edges;
2. the picks laid out as a CSR by destination (``ptr``, counts by a cumsum), in the same order
   as :func:`.sampler.sample_hop`'s: by destination, then CSR position;
3. the hop's nodes: the destinations first, then each new source once, grouped by node type
   (a stable sort by type of the candidates in pick order) so node types stay contiguous
   ranges and, within a type, the destinations are the first nodes in their own order (the
   block layout of :mod:`hector.graph.block`), then the new sources in the order of their
   first pick.  Duplicates are found through a table over the graph's nodes
   (the first candidate naming a node wins), not ``torch.unique``, whose output size is a host
   read.

The uncaptured path turns a :class:`StaticBatch` into an ordinary :class:`~.neighbor.Batch`
of ``Graph`` blocks with one host read (:meth:`StaticBatch.to_batch`).
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch

from ..graph.block import mark_block
from ..graph import build
from ..graph.build import available_bytes
from ..kernels.sampling import floyd_table
from .batch import Batch, block_graph
from .sampler import SamplingIndex


@dataclass(frozen=True)
class Capacities:
    """Buffer sizes of every hop, hop 0 around the seeds: ``dst[h]`` destinations, ``width[h]``
    picks per destination, ``edges[h] = dst[h] * width[h]`` sampled edges and ``nodes[h]``
    nodes: the sampled ones (destinations included) in the first ``nodes[h] - sinks[h]``
    slots, then ``sinks[h]`` sink slots, never sampled, that a capacity block's padding edges
    enter (:mod:`hector.graph.capacity`: ``width[h]`` each at most, so no row of the block is
    longer than a sampled one).  ``dst[h + 1] == nodes[h]``."""
    seeds: int
    width: Tuple[int, ...]
    dst: Tuple[int, ...]
    edges: Tuple[int, ...]
    nodes: Tuple[int, ...]
    sinks: Tuple[int, ...]

    @staticmethod
    def of(batch_size: int, fanouts: Sequence, num_nodes: int, max_degree: int) -> "Capacities":
        """``fanouts``: per hop an int (-1: every edge) or a list of per-relation ints;
        ``max_degree``: the graph's largest in-degree (bounds a fan-out of -1)."""
        widths, dsts, edges, nodes, sinks = [], [], [], [], []
        n = batch_size
        for f in fanouts:
            per = list(f) if isinstance(f, (list, tuple)) else [f]
            w = min(max_degree, sum(max_degree if k < 0 else k for k in per))
            widths.append(w)
            dsts.append(n)
            edges.append(n * w)
            sinks.append(n if w else 0)           # ceil(edges / width)
            # every destination slot is a node slot (the previous hop's sinks included)
            n = max(n, min(num_nodes, n + n * w)) + sinks[-1]
            nodes.append(n)
        return Capacities(batch_size, tuple(widths), tuple(dsts), tuple(edges), tuple(nodes),
                          tuple(sinks))

    def fitted(self, sizes: Sequence[Tuple[int, int, int]], margin: float,
               at_least: Optional["Capacities"] = None) -> "Capacities":
        """Capacities for batches of ``sizes`` (per hop, as :meth:`StaticBatch.sizes` reads
        them: destinations, edges, nodes) with ``margin`` headroom (1.25: a quarter more),
        never above these (the worst case) nor below ``at_least`` (what they grow from).
        Most of a worst-case buffer is padding on a sparse graph (figures in
        docs/perf-notes.md), which a step's kernels walk; fitted blocks carry less, and a
        batch they would not hold is the caller's to detect (:meth:`holds`)."""
        if not margin >= 1.0:
            raise ValueError(f"margin must be >= 1, got {margin}")
        dsts, edges, nodes, sinks = [], [], [], []
        n = self.seeds
        for h, (_, e, v) in enumerate(sizes):
            w = max(self.width[h], 1)
            floor = at_least.edges[h] if at_least is not None else 0
            e_f = min(self.edges[h], max(floor, math.ceil(e * margin)))
            s_f = min(self.sinks[h], -(-e_f // w))
            # Every destination slot is a node slot (the previous hop's sinks included).
            floor = (at_least.nodes[h] - at_least.sinks[h]) if at_least is not None else 0
            real = min(self.nodes[h] - self.sinks[h], max(n, floor, math.ceil(v * margin)))
            dsts.append(n)
            edges.append(e_f)
            sinks.append(s_f)
            nodes.append(real + s_f)
            n = nodes[-1]
        return Capacities(self.seeds, self.width, tuple(dsts), tuple(edges), tuple(nodes),
                          tuple(sinks))

    def holds(self, sizes: Sequence[Tuple[int, int, int]]) -> bool:
        """Whether blocks of these capacities hold a batch of ``sizes`` (host values)."""
        return all(e <= self.edges[h] and v <= self.nodes[h] - self.sinks[h]
                   for h, (_, e, v) in enumerate(sizes))

    def sampling_bytes(self, num_nodes: int) -> int:
        """About the most device memory one sampled batch holds at once: per hop, the picks
        table and the edge buffers (~10 int64 per edge slot), the candidates' sort and the
        nodes (~6 per candidate), and the duplicate table over the graph's nodes."""
        return max((10 * e + 6 * (d + e) + num_nodes + d + e) * 8
                   for d, e in zip(self.dst, self.edges)) + sum(
            (3 * e + 3 * n) * 8 for e, n in zip(self.edges, self.nodes))


@dataclass
class StaticHop:
    """One hop's block, every tensor of a static shape (see :class:`Capacities`).

    Attributes:
        ptr: ``[dst + 1]`` CSR by destination (destination ``p``'s edges are
            ``ptr[p]:ptr[p + 1]``; ``ptr[-1]`` is the hop's edge count).
        src: ``[edges]`` local (node-space) id of each edge's source.
        rel: ``[edges]`` relation of each edge.
        node_ids: ``[nodes]`` global id of each local node (the destinations among them).
        num_nodes: 0-d tensor, the valid prefix of ``node_ids``.
        num_dst: 0-d tensor, the valid destinations (a prefix of the destination slots).
        dst_local: ``[dst]`` local id of each destination.
        type_ptr: ``[T + 1]`` node-type pointers of the local nodes.
    """
    ptr: torch.Tensor
    src: torch.Tensor
    rel: torch.Tensor
    node_ids: torch.Tensor
    num_nodes: torch.Tensor
    num_dst: torch.Tensor
    dst_local: torch.Tensor
    type_ptr: torch.Tensor


@dataclass
class StaticBatch:
    """A batch of seeds (``seeds[:num_seeds]``) with its hops, hop 0 around the seeds."""
    seeds: torch.Tensor
    num_seeds: torch.Tensor
    hops: List[StaticHop]
    caps: Capacities

    @property
    def n_id(self) -> torch.Tensor:
        """Global ids of the first layer's input rows (the outermost hop's nodes; padding
        and sinks name ``slot % num_nodes``, spread over the graph)."""
        return self.n_id_of()

    def capacity_blocks(self, graph, caps: Optional[Capacities] = None) -> list:
        """The hops as capacity blocks (:mod:`hector.graph.capacity`), outermost first like
        ``Batch.blocks``, every size a capacity: no host read.  ``graph``: the sampled graph
        (its relations, node types and names); with several of either, relational blocks.
        ``caps``: smaller capacities (:meth:`Capacities.fitted`) that the caller knows hold
        this batch (:meth:`Capacities.holds`): the buffers' prefixes; default the buffers'.

        On CUDA with ``HECTOR_COMPILE_INDEX=1`` (opt-in, see :func:`compile_index`) the
        build runs as one ``torch.compile``'d function."""
        build = (_compiled(_build_blocks) if self.seeds.is_cuda and compile_index()
                 else _build_blocks)
        return build(self, graph, caps or self.caps)

    def n_id_of(self, caps: Optional[Capacities] = None) -> torch.Tensor:
        """:attr:`n_id` for blocks of ``caps`` (its prefix)."""
        return self.hops[-1].node_ids[:(caps or self.caps).nodes[-1]]

    def sizes(self) -> List[Tuple[int, int, int]]:
        """(destinations, edges, nodes) of every hop, in one host read."""
        flat = torch.stack([v for h in self.hops for v in (h.num_dst, h.ptr[-1], h.num_nodes)])
        vals = flat.tolist()
        return [tuple(vals[3 * i:3 * i + 3]) for i in range(len(self.hops))]

    def to_batch(self, graph, node_type_ptr, node_type_names):
        """The same batch as ``Graph`` blocks (outermost first, like ``NeighborLoader``'s),
        their arrays cut to the actual sizes: one host read."""
        sizes = self.sizes()
        type_ptrs = torch.stack([h.type_ptr for h in self.hops]).tolist()
        node_type = graph.node_type.long()
        blocks, node_ids = [], []
        n_seeds = sizes[0][0]
        dst_type_ptr = None
        for h, (hop, (n_dst, n_edges, n_nodes)) in enumerate(zip(self.hops, sizes)):
            ids = hop.node_ids[:n_nodes]
            counts = hop.ptr[1:n_dst + 1] - hop.ptr[:n_dst]
            dst_pos = torch.repeat_interleave(torch.arange(n_dst, device=ids.device), counts,
                                              output_size=n_edges)
            dst_local = hop.dst_local[:n_dst]
            block = block_graph(graph, torch.stack([hop.src[:n_edges], dst_local[dst_pos]]),
                                hop.rel[:n_edges], node_type[ids])
            if dst_type_ptr is None:     # the seeds' types (ordered by type)
                dst_type_ptr = build.type_ptr(node_type[self.seeds[:n_seeds]],
                                              graph.num_node_types)[0].tolist()
            mark_block(block, n_dst, dst_local if graph.num_node_types > 1 else None,
                       dst_type_ptr)
            blocks.append(block)
            node_ids.append(ids)
            dst_type_ptr = type_ptrs[h]
        return Batch(blocks[::-1], node_ids[::-1], self.seeds[:n_seeds], node_type_ptr,
                     node_type_names)


class StaticSampler:
    """Samples batches of at most ``batch_size`` seeds into static-capacity buffers.

    Args:
        index: the graph's :class:`~.sampler.SamplingIndex` (on the device sampling runs on).
        fanouts: per hop an int (-1: every edge) or an ``[R]`` int64 tensor of per-relation
            fan-outs (as ``NeighborLoader`` parses them).
        batch_size: the most seeds a batch holds.
        generator: the random source (a ``torch.Generator`` on the index's device).
    """

    def __init__(self, index: SamplingIndex, fanouts: Sequence[Union[int, torch.Tensor]],
                 batch_size: int, generator: torch.Generator):
        self.index, self.generator = index, generator
        self.num_nodes = index.node_type.numel()
        self.num_types = index.num_node_types
        deg = index.ptr[1:] - index.ptr[:-1]
        # Host reads here, once per loader: the capacities' bounds.
        self.fanouts = [f.tolist() if isinstance(f, torch.Tensor) else int(f) for f in fanouts]
        self.max_degree = int(deg.max()) if deg.numel() else 0
        self.caps = Capacities.of(batch_size, self.fanouts, self.num_nodes, self.max_degree)
        need, free = self.caps.sampling_bytes(self.num_nodes), available_bytes(index.ptr.device)
        if free is not None and need > free:
            raise ValueError(
                f"static=True: batches of {batch_size} with fan-outs {self.fanouts} need "
                f"buffers for {self.caps.edges[-1]:,} sampled edges (the worst case: every "
                f"fan-out met, the largest in-degree {self.max_degree:,} bounding -1), about "
                f"{need / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB free on "
                f"{index.ptr.device}; use smaller fan-outs or batches, or static=False")
        # Per-relation fan-outs find their (destination, relation) groups in the CSR's
        # (row, relation) keys, made here (their size is known only on the host).
        self._group_key = None
        if any(isinstance(f, list) for f in self.fanouts):
            rows = torch.repeat_interleave(torch.arange(self.num_nodes, device=deg.device), deg)
            self._group_key = rows * index.num_relations + index.rel
        # The kernel's random key, advanced in place by every draw (so a replayed CUDA graph
        # draws anew); drawn from ``generator`` on its device, with no host read.
        self.seed = torch.randint(0, 2 ** 62, (1,), generator=generator,
                                  device=index.ptr.device)
        # Per-relation fan-outs on the device, -1 as the largest in-degree (every edge), and
        # the table width they need (the largest of them).
        self._fan_t = [torch.tensor([self.max_degree if k < 0 else k for k in f],
                                    dtype=torch.int64, device=index.ptr.device)
                       if isinstance(f, list) else None for f in self.fanouts]
        self._fan_width = [max(1, min(self.max_degree, max(
            self.max_degree if k < 0 else k for k in f))) if isinstance(f, list) else None
            for f in self.fanouts]

    def sample(self, seeds: torch.Tensor, num_seeds: Optional[torch.Tensor] = None) -> StaticBatch:
        """``seeds``: ``[batch_size]`` global ids (ordered by node type), of which the first
        ``num_seeds`` (a 0-d device tensor; ``None``: all) are valid."""
        dev = self.index.ptr.device
        if seeds.numel() != self.caps.seeds:
            raise ValueError(f"seeds must hold batch_size={self.caps.seeds} ids (pad a short "
                             f"batch and pass num_seeds), got {seeds.numel()}")
        if num_seeds is None:
            num_seeds = torch.tensor(seeds.numel(), device=dev)
        dst, n_dst, hops = seeds.long(), num_seeds, []
        for h, fan in enumerate(self.fanouts):
            ptr, src_global, rel = self._picks(h, dst, n_dst, fan)
            hop = self._relabel(h, dst, n_dst, ptr, src_global, rel)
            hops.append(hop)
            dst, n_dst = hop.node_ids, hop.num_nodes
        return StaticBatch(seeds, num_seeds, hops, self.caps)

    # -- one hop ------------------------------------------------------------------------
    def _picks(self, h: int, dst: torch.Tensor, n_dst: torch.Tensor, fan):
        """CSR by destination of the hop's picks: (ptr, source global id, relation), the
        arrays ``[edges]`` long, valid up to ``ptr[-1]``."""
        ix, caps = self.index, self.caps
        n, width, e_cap = caps.dst[h], caps.width[h], caps.edges[h]
        dev = dst.device
        valid_dst = torch.arange(n, device=dev) < n_dst
        start = ix.ptr[dst]
        deg = torch.where(valid_dst, ix.ptr[dst + 1] - start, 0)
        if isinstance(fan, list):
            starts, gdeg, k = self._groups(h, dst, start, deg)     # [n, R] each
            r, w = len(fan), self._fan_width[h]
            picks, valid = floyd_table(gdeg.reshape(-1), k.reshape(-1), w, self.generator,
                                       self.seed)
            pos = (starts.reshape(-1, 1) + picks).view(n, r * w)
            valid = valid.view(n, r * w)
        else:
            k = self.max_degree if fan < 0 else fan
            picks, valid = floyd_table(deg, torch.full_like(deg, k), max(width, 1),
                                       self.generator, self.seed)
            pos = start[:, None] + picks
        ptr = build.counts_to_ptr(valid.sum(1))
        # Valid picks keep their row order (lanes ascend; per relation: relation, then lane);
        # the others go to spare slots past the end, one each (stores to one shared slot
        # serialise), cut off after.  One fan-out: a row's valid lanes are its first ones
        # (floyd_table), so a pick's place in its row is its lane, no scan.
        lane = (torch.cumsum(valid.long(), 1) - 1 if isinstance(fan, list)
                else torch.arange(valid.shape[1], device=dev))
        spare = e_cap + torch.arange(valid.numel(), device=dev).view_as(valid)
        slot = torch.where(valid, ptr[:-1, None] + lane, spare).reshape(-1)
        pos_c = torch.zeros(e_cap + valid.numel(), dtype=torch.int64, device=dev)
        pos_c.scatter_(0, slot, torch.where(valid, pos, 0).reshape(-1))
        pos_c = pos_c[:e_cap]
        return ptr, ix.col[pos_c], ix.rel[pos_c]

    def _groups(self, h: int, dst, start, deg):
        """Per (destination, relation): first CSR position, candidates and fan-out.  A row's
        edges are in relation order, so a group is a contiguous range found by a binary
        search in the CSR's (row, relation) keys."""
        k = self._fan_t[h]
        r = k.numel()
        rr = torch.arange(r + 1, device=dst.device)
        bounds = torch.searchsorted(self._group_key, dst[:, None] * r + rr[None, :])
        bounds = torch.minimum(torch.maximum(bounds, start[:, None]), (start + deg)[:, None])
        gdeg = bounds[:, 1:] - bounds[:, :-1]
        return bounds[:, :-1], gdeg, k.expand_as(gdeg)

    def _relabel(self, h: int, dst, n_dst, ptr, src_global, rel) -> StaticHop:
        caps = self.caps
        fn = _compiled(relabel) if dst.is_cuda and compile_index() else relabel
        src, node_ids, num_nodes, dst_local, type_ptr = fn(
            self.index.node_type, self.num_nodes, self.num_types, caps.dst[h],
            caps.nodes[h] - caps.sinks[h], caps.nodes[h], dst, n_dst, ptr, src_global)
        return StaticHop(ptr, src, rel, node_ids, num_nodes, n_dst, dst_local, type_ptr)


def _build_blocks(sb: StaticBatch, graph, caps: Capacities) -> list:
    """:meth:`StaticBatch.capacity_blocks`' build: one capacity block per hop, outermost
    first."""
    from ..graph.capacity import capacity_block
    relational = graph.num_node_types > 1 or graph.num_relations > 1
    fitted = caps != sb.caps
    blocks = []
    for h, hop in reversed(list(enumerate(sb.hops))):
        d, e, real = caps.dst[h], caps.edges[h], caps.nodes[h] - caps.sinks[h]
        ptr, src, dst_node, type_ptr, n_dst = (hop.ptr[:d + 1], hop.src[:e], hop.dst_local[:d],
                                               hop.type_ptr, hop.num_dst)
        if fitted:
            # A batch that smaller capacities do not hold (``Capacities.holds``, read after
            # the build where the build runs ahead of that check: an overlapped step) still
            # builds in bounds; its blocks are wrong and the caller drops them.  For a batch
            # they hold, every clamp is a no-op.
            ptr, src = ptr.clamp(max=e), src.clamp(max=max(real - 1, 0))
            if relational:
                dst_node, n_dst = dst_node.clamp(max=max(real - 1, 0)), n_dst.clamp(max=d)
                type_ptr = type_ptr.clamp(max=real)
        blocks.append(capacity_block(
            ptr, src, caps.nodes[h], real, caps.width[h], False, graph.node_type_names,
            graph.relation_names,
            **(dict(rel=hop.rel[:e], dst_node=dst_node, type_ptr=type_ptr,
                    num_relations=graph.num_relations,
                    num_node_types=graph.num_node_types, dst_count=n_dst)
               if relational else {})))
    return blocks


def compile_index() -> bool:
    """Whether CUDA batches build their index arrays through ``torch.compile``
    (``HECTOR_COMPILE_INDEX=1``): the sampler's relabelling and the capacity blocks.  They
    are a few hundred small index ops a batch (about 80 and 250 for a relational two-hop
    batch: ``scripts/step_ops.py``), each its own kernel in a replayed step; compiled,
    Inductor fuses their elementwise chains around the sorts, scans and binary searches.
    Opt-in: the sorts, scans and searches it keeps hold most of the time, so the fused
    kernels save little, and the first batch of each capacity set pays the compilation
    (docs/perf-notes.md, "Mini-batches: one captured step per batch")."""
    return os.environ.get("HECTOR_COMPILE_INDEX", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _compiled(fn):
    # (dynamic=False: one specialisation per capacity set; a fitted run has one or a few)
    return torch.compile(fn, fullgraph=True, dynamic=False)


def relabel(node_type: torch.Tensor, num_graph_nodes: int, num_types: int, n: int, n_cap: int,
            num_slots: int, dst: torch.Tensor, n_dst: torch.Tensor, ptr: torch.Tensor,
            src_global: torch.Tensor):
    """A hop's local ids: (each pick's local source ``[edges]``, the ``[num_slots]`` local
    nodes' global ids, their valid count (0-d), each destination's local id ``[n]``, the
    local nodes' type pointers).  ``n`` destination slots, ``n_cap`` sampled-node slots of
    ``num_slots``; the rest (padding and sinks) name ``slot % num_graph_nodes``.  Static
    shapes, no host read."""
    dev = dst.device
    cand = torch.cat([dst, src_global])
    c = cand.numel()
    idx = torch.arange(c, device=dev)
    valid = torch.cat([idx[:n] < n_dst, idx[:c - n] < ptr[-1]])
    # Invalid candidates get a spare table entry each: on one shared entry their atomics
    # serialise, and most slots are padding on sparse graphs (docs/perf-notes.md,
    # "Mini-batches: one captured step per batch").
    key_node = torch.where(valid, cand, num_graph_nodes + idx)
    # First candidate naming each node (destinations come first, so they win).
    first = torch.full((num_graph_nodes + c,), c, dtype=torch.int64, device=dev)
    first.scatter_reduce_(0, key_node, idx, reduce="amin")
    first_of = first[key_node]
    is_first = valid & (first_of == idx)
    # Each node's first candidate grouped by type, in candidate order (so the destinations,
    # which come first, keep their slots' order), the others last: a stable sort of the
    # type alone, one radix pass of 8-bit keys on CUDA where a (type, id) key took four.
    order = build.small_key_order(torch.where(is_first, node_type[cand], num_types),
                                  num_types + 1)
    rank = torch.empty_like(order)
    rank[order] = idx
    num_nodes = is_first.sum()
    local = torch.where(valid, rank[first_of], 0)     # (an invalid candidate: 0)
    slots = torch.arange(num_slots, device=dev)
    spread = slots % num_graph_nodes        # padding and the sinks (see the module's doc)
    node_ids = torch.cat([cand[order[:n_cap]], spread[n_cap:]])
    sampled = slots < num_nodes
    node_ids = torch.where(sampled, node_ids, spread)
    types = torch.where(sampled, node_type[node_ids], num_types)
    type_ptr = torch.searchsorted(types, torch.arange(num_types + 1, device=dev))
    return local[n:], node_ids, num_nodes, local[:n], type_ptr
