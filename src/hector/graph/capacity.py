"""Capacity blocks: a sampled mini-batch block as a ``Graph`` whose every host-visible size is a
capacity, the same for every batch, built from device tensors with no host read.  A step
captured once in a CUDA graph on such blocks replays for every batch.

The sampler (:mod:`hector.loader.static`) gives a hop's picks as a CSR by destination over
``num_dst`` destination rows, valid up to ``ptr[-1]``, in an ``[edges]`` buffer.  The block is
the genuine graph over ``num_nodes`` nodes that holds them and pads the buffer with edges
between *sink* nodes (the last ``num_nodes - first_sink`` slots, never sampled): sink ``s``
takes padding edges ``[s * width, (s + 1) * width)`` as destination and source.  So

* the edge count is the buffer's (plus one self loop per node in the twin with loops);
* no row is longer than ``width`` (plus the loop) in either direction except a sampled
  source's out-degree, so the node-parallel traversals never meet a padding row longer than
  a sampled one;
* a sink's rows only ever reach sinks: a layer's output on the destinations, which are never
  sinks, is the block's without padding, and its gradients get nothing from the padding
  (nothing downstream reads a sink's output).

Several relations and node types (a relational block): edges in the canonical order (by
relation, then destination), compact maps of ``edges`` rows each (a bound: their real row
counts stay on the device, in their ``rel_ptr[-1]``), and every segment pointer kept on the
device as a :class:`~hector.kernels.sizes.DeviceBounds` in ``host_ptr``.  The padding edges
take the last relation, the nodes past the sampled ones the last node type, compact rows
past the real ones the last relation and a sink each in turn, and destination slots past the
batch's a sink each in turn (a scatter by compact row or destination slot never lands on a
real node, nor piles on one row: a row walked by one program).  The compiled relational
layers run on such blocks with no host read: their segment GEMMs take the device bounds,
their traversal CSRs are built without reads and walked in one bin of whole rows.  A block
of one relation and node type gets the same compact maps (bounds too) when a compiled
program first asks for them (:func:`with_compact_maps`), so the compiled attention layers
(GAT) run on it the same way.

The block's degree statistics are its bounds: in-degree at most ``width`` (``+ 1``), mean
``edges / nodes``; a source's out-degree, unknown without a read, is summarised the same
way.  The attention plans take node-parallel traversals on a capacity block whatever the
statistics say (``kernels.attention.plan.make_plan``): its rows are bounded by the fan-out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from . import build
from ..kernels.sizes import DeviceBounds
from .graph import SUPER_NODE_DEGREE, Graph
from .structures import CSR, DegreeStats


@dataclass(frozen=True, eq=False)
class Capacity:
    """What a capacity block is made of (kept on it, to derive its twin with self loops)."""
    ptr: torch.Tensor
    src: torch.Tensor
    num_nodes: int
    first_sink: int
    width: int
    self_loops: bool
    rel: Optional[torch.Tensor] = None
    dst_node: Optional[torch.Tensor] = None
    type_ptr: Optional[torch.Tensor] = None
    num_relations: int = 1
    num_node_types: int = 1
    dst_count: Optional[torch.Tensor] = None


def capacity_block(ptr: torch.Tensor, src: torch.Tensor, num_nodes: int, first_sink: int,
                   width: int, self_loops: bool = False,
                   node_type_names=None, relation_names=None, *,
                   rel: Optional[torch.Tensor] = None, dst_node: Optional[torch.Tensor] = None,
                   type_ptr: Optional[torch.Tensor] = None, num_relations: int = 1,
                   num_node_types: int = 1, dst_count: Optional[torch.Tensor] = None) -> Graph:
    """The block ``Graph`` (see the module's docstring) of a hop's picks: ``ptr`` ``[D + 1]``
    by destination, ``src`` ``[edges]`` local source ids; nodes ``[first_sink, num_nodes)``
    are its sinks, enough for every padding edge at ``width`` a sink.  ``self_loops``: PyG's
    ``remove_self_loops`` + ``add_self_loops``, every node's loop last in its row.

    A relational block (``num_relations`` or ``num_node_types`` above 1) also takes ``rel``
    ``[edges]``, each pick's relation (a destination's picks sorted by relation, as the
    sampler gives them), ``dst_node`` ``[D]``, each destination's node (increasing), and
    ``type_ptr`` ``[T + 1]``, the node types' ranges over the sampled nodes (the sampler's
    order), and ``dst_count`` (0-d), the batch's destinations (slots past them map to the
    sinks in turn); one relation and type: destination ``p`` is node ``p``."""
    dev, num_dst, e_cap = ptr.device, ptr.numel() - 1, src.numel()
    sinks = num_nodes - first_sink
    relational = num_relations > 1 or num_node_types > 1
    if not 0 <= num_dst <= first_sink <= num_nodes:
        raise ValueError(f"need 0 <= destinations ({num_dst}) <= first_sink ({first_sink}) "
                         f"<= num_nodes ({num_nodes})")
    if e_cap and sinks * max(width, 1) < e_cap:
        raise ValueError(f"{sinks} sinks of width {width} cannot hold {e_cap} padding edges")
    if relational and (rel is None or dst_node is None or type_ptr is None
                       or dst_count is None):
        raise ValueError("a relational capacity block needs rel, dst_node, type_ptr and "
                         "dst_count")
    if relational and self_loops:
        raise ValueError("self_loops: only on a block of one relation and node type")
    pos = torch.arange(e_cap, device=dev)
    # (searchsorted over a whole pointer array, less one, equals it over ptr[1:] as ptr[0] = 0:
    # torch 2.11's Inductor cannot lower a search over a slice, HECTOR_COMPILE_INDEX's case)
    row = torch.searchsorted(ptr, pos, right=True) - 1        # num_dst past the valid edges
    valid = pos < ptr[-1]
    if self_loops:
        valid &= src.long() != row
    row = row.clamp(max=max(num_dst - 1, 0))
    # Kept picks before each position (and in all, last), so a row's count is a difference
    # at its bounds: no scatter, whose padding entries would all hit one row's counter.
    # Without loops to drop, the kept picks are the positions below ptr[-1]: no scan.
    kept_at = build.counts_to_ptr(valid.long()) if self_loops else None
    kept = kept_at[-1] if self_loops else ptr[-1]
    counts = torch.zeros(num_nodes, dtype=torch.int64, device=dev)
    per_dst = kept_at[ptr[1:]] - kept_at[ptr[:-1]] if self_loops else ptr.diff()
    if dst_node is None:
        counts[:num_dst] = per_dst
    else:      # (destination slots past the batch's have no picks: they add 0 to a node)
        counts.index_add_(0, dst_node.long(), per_dst)
    padding = e_cap - kept
    w = max(width, 1)
    sink = torch.arange(sinks, device=dev)
    counts[first_sink:] += (padding - sink * w).clamp(min=0, max=w)
    if self_loops:
        counts += 1
    gptr = build.counts_to_ptr(counts)
    total = e_cap + (num_nodes if self_loops else 0)
    # Where each entry goes: a kept pick at its row's start plus its rank among the row's
    # kept picks; padding entry j in sink j // w; a loop last in its row.  Masked entries
    # write spare slots past the end, one each (stores to one shared slot serialise).
    if self_loops:
        rank = kept_at[:-1] - kept_at[ptr[:-1]][row] if num_dst else kept_at[:-1]
    else:
        rank = pos - ptr[row] if num_dst else pos
    spare = total + pos
    row_node = row if dst_node is None or not num_dst else dst_node.long()[row]
    slot = torch.where(valid, gptr[row_node] + rank, spare)
    j = pos
    pad_sink = first_sink + torch.div(j, w, rounding_mode="floor").clamp(max=max(sinks - 1, 0))
    pad_slot = torch.where(j < padding, gptr[pad_sink] + j % w, spare)
    # (zeros, not empty: for a batch the capacities do not hold, whose picks collide, an
    # entry left unwritten must still name a node; see loader.static._build_blocks)
    col = torch.zeros(total + e_cap, dtype=torch.int64, device=dev)
    col.scatter_(0, slot, src.long())
    col.scatter_(0, pad_slot, pad_sink)
    if self_loops:
        nodes = torch.arange(num_nodes, device=dev)
        col.scatter_(0, gptr[1:] - 1, nodes)
    col = col[:total]
    entries = torch.arange(total, device=dev) if self_loops else pos    # (total == e_cap)
    dst = torch.searchsorted(gptr, entries, right=True) - 1
    capacity = Capacity(ptr, src, num_nodes, first_sink, width, self_loops, rel, dst_node,
                        type_ptr, num_relations, num_node_types, dst_count)
    g = _graph(gptr, col, dst, num_nodes, num_dst, width + int(self_loops), capacity,
               node_type_names, relation_names, edges=not relational)
    if relational:
        etype = torch.full((total + e_cap,), num_relations - 1, dtype=torch.int64, device=dev)
        etype.scatter_(0, slot, rel.long())
        _relational(g, col, dst, etype[:total], capacity)
    return g


def _relational(g: Graph, col: torch.Tensor, dst: torch.Tensor, etype: torch.Tensor,
                c: Capacity) -> None:
    """Turn the one-relation block ``g`` (its edges by destination: ``col`` their sources,
    ``dst`` their destinations, ``etype`` their relations, int64) into the relational one:
    canonical order, compact maps, node types, and every segment pointer as device bounds
    (see the module's docstring); no host read."""
    n, r, t, total, dev = g.num_nodes, c.num_relations, c.num_node_types, g.num_edges, g.device
    idx = g.index_dtype
    # Input edges run by (destination, relation): a stable sort by relation is canonical.
    perm = build.relation_order(etype, r)
    src, dst, et = (build.take(a, perm) for a in (col, dst, etype))
    eid = torch.empty_like(perm).scatter_(0, perm, torch.arange(total, device=dev))
    g.csr_in = CSR(g.csr_in.ptr, g.csr_in.col, eid.to(idx))
    g.src, g.dst, g.etype, g.edge_perm = src.to(idx), dst.to(idx), et.to(torch.int32), perm.to(idx)
    g.num_relations, g.num_node_types = r, t
    g.rel_ptr = build.search_ptr(et, r).to(idx)
    _compact_maps(g, src, dst, et, r)
    nodes = torch.arange(n, device=dev)
    type_ptr = c.type_ptr.long()
    g.node_type = (torch.searchsorted(type_ptr, nodes, right=True) - 1).clamp_(max=t - 1).to(
        torch.int32)
    g.node_type_ptr = torch.cat([type_ptr[:t], type_ptr.new_full((1,), n)]).to(idx)
    g.host_ptr.update(edge=DeviceBounds(g.rel_ptr, total),
                      node=DeviceBounds(g.node_type_ptr, n))
    slots = torch.arange(c.dst_node.numel(), device=dev)
    g.dst_index = torch.where(slots < c.dst_count, c.dst_node.long(),
                              sinks_in_turn(slots, n, c.first_sink)).to(idx)
    g.dst_type_ptr = None


def compact_rows(graph: Graph) -> Tuple[int, int]:
    """``graph``'s (compact_src, compact_dst) row counts, without building a capacity block's
    maps: each is ``num_edges`` rows there, a bound (:func:`_compact_maps`)."""
    if graph.compact_src is None and graph.capacity is not None:
        return graph.num_edges, graph.num_edges
    return graph.compact_src.num_rows, graph.compact_dst.num_rows


def with_compact_maps(graph: Graph) -> Graph:
    """``graph``, with its compact maps built if it is a capacity block that has none yet.
    A block of one relation and node type builds them on first need, as a relational one
    does at once (see :func:`_compact_maps`): the compiled programs read them, the layers
    that call the attention op directly never do, nor does the twin without self loops of
    a layer that adds them."""
    if graph.compact_src is None and graph.capacity is not None:
        none = torch.zeros_like(graph.dst, dtype=torch.int64)      # (the one relation)
        _compact_maps(graph, graph.src, graph.dst, none, 1)
    return graph


def _compact_maps(g: Graph, src: torch.Tensor, dst: torch.Tensor, etype: torch.Tensor,
                  r: int) -> None:
    """``g``'s compact maps over its canonical edges (``src``, ``dst``, ``etype`` int64 of
    ``r`` relations), each of ``num_edges`` rows (a bound: the real row counts stay on the
    device, in the map's ``rel_ptr``; rows past the real ones: :func:`filler_keys`), their
    pointers device bounds in ``host_ptr``: no host read."""
    n, total = g.num_nodes, g.num_edges
    pad = filler_keys(total, n, g.capacity.first_sink, r, g.device)
    maps = [build.compact_from_runs(build.compact_runs(end, etype, n, r, keys_sorted=sorted_),
                                    total, n, pad_key=pad)
            for end, sorted_ in ((src, False), (dst, True))]
    g.compact_src, g.compact_dst = (m.narrowed(g.index_dtype) for m in maps)
    g.host_ptr = dict(g.host_ptr, compact_src=DeviceBounds(g.compact_src.rel_ptr, total),
                      compact_dst=DeviceBounds(g.compact_dst.rel_ptr, total))


def filler_keys(rows: int, num_nodes: int, first_sink: int, num_relations: int,
                device) -> torch.Tensor:
    """``[rows]`` keys (``relation * N + node``) for a capacity block's compact rows past the
    real ones: the last relation and the sinks in turn.  One shared node would make its row of
    a traversal from compact rows to nodes hold every filler row (most of a fitted block's
    rows), walked in order by one program: the step's longest kernel."""
    n = max(num_nodes, 1)
    rows_ = torch.arange(rows, dtype=torch.int64, device=device)
    return sinks_in_turn(rows_, n, first_sink).add_((max(num_relations, 1) - 1) * n)


def sinks_in_turn(i: torch.Tensor, num_nodes: int, first_sink: int) -> torch.Tensor:
    """The sink of each entry ``i`` (int64), the sinks ``[first_sink, num_nodes)`` in turn,
    for padding that must not pile on one row; the last node where there is no sink."""
    sinks = num_nodes - first_sink
    if sinks > 0:
        return i.remainder(sinks).add_(first_sink)
    return torch.full_like(i, max(num_nodes - 1, 0))


def _graph(gptr, col, dst, num_nodes: int, num_dst: int, max_row: int, capacity: Capacity,
           node_type_names, relation_names, edges: bool = True) -> Graph:
    """A ``Graph`` over these arrays, every field set without a read (see ``Graph._build``
    for what each one is).  ``edges=False``: the per-edge arrays and the type pointers are
    left for :func:`_relational`, which sets them in canonical order (made here, they would
    be a dozen kernels a block for nothing)."""
    dev, total = gptr.device, col.numel()
    idx = build.index_dtype(num_nodes, total)
    g = object.__new__(Graph)
    g.num_nodes, g.num_relations, g.num_node_types, g.num_edges = num_nodes, 1, 1, total
    g.device, g.index_dtype = dev, idx
    g.node_type_names = list(node_type_names) if node_type_names is not None else None
    g.relation_names = [tuple(r) for r in relation_names] if relation_names is not None else None
    g.graph_ptr = None
    # (the edges run by destination: a source column is the CSR's, an edge's id its
    # position; each array is made once and named twice, nothing writes into it)
    g.src = col.to(idx)
    g._csr_out = None
    g.node_perm, g.node_types_contiguous = None, True
    if edges:
        eid = torch.arange(total, device=dev, dtype=idx)
        g.csr_in = CSR(gptr.to(idx), g.src, eid)
        g.dst, g.edge_perm = dst.to(idx), eid
        g.etype = torch.zeros(total, dtype=torch.int32, device=dev)
        g.node_type = torch.zeros(num_nodes, dtype=torch.int32, device=dev)
        g.rel_ptr = build.host_constant((0, total), dev, idx)
        g.node_type_ptr = build.host_constant((0, num_nodes), dev, idx)
    else:
        g.csr_in = CSR(gptr.to(idx), g.src, None)
    g.host_ptr = {"edge": [0, total], "compact_src": None, "compact_dst": None,
                  "node": [0, num_nodes]}
    g.compact_src = g.compact_dst = None
    mean = total / num_nodes if num_nodes else 0.0
    stats = DegreeStats(max_row, mean, 0.0, 0, int(max_row >= SUPER_NODE_DEGREE),
                        SUPER_NODE_DEGREE)
    g.in_degree = g.out_degree = stats
    g.num_dst_nodes, g.dst_index, g.dst_type_ptr = num_dst, None, [0, num_dst]
    g.capacity = capacity
    g._device_copies = {dev: g}
    g._derived = {}
    return g


def with_loops(graph: Graph) -> Optional[Graph]:
    """The twin with self loops of a capacity block (None for any other graph)."""
    c = getattr(graph, "capacity", None)
    if c is None:
        return None
    if c.self_loops:
        return graph
    return capacity_block(c.ptr, c.src, c.num_nodes, c.first_sink, c.width, True,
                          graph.node_type_names, graph.relation_names, rel=c.rel,
                          dst_node=c.dst_node, type_ptr=c.type_ptr,
                          num_relations=c.num_relations, num_node_types=c.num_node_types,
                          dst_count=c.dst_count)
