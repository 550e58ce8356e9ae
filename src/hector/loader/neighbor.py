"""``NeighborLoader``: mini-batches of seed nodes with their sampled multi-hop neighbourhood,
as bipartite ``Graph`` blocks every hector layer accepts (PyG's ``NeighborLoader`` and DGL's
blocks in one object)."""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch

from .. import checks as C
from ..graph import Graph, build
from ..graph.block import mark_block
from .batch import Batch, block_graph
from .prefetch import prefetched
from .sampler import SamplingIndex, relabel, sample_hop
from .static import StaticSampler


class NeighborLoader:
    """Iterate over mini-batches of ``input_nodes`` with sampled neighbourhoods.

    Args:
        graph: a ``hector.Graph`` (homogeneous or heterogeneous; with several node types,
            each type must be a contiguous id range, as ``Graph.from_hetero`` builds it).
        num_neighbors: fan-out per hop, PyG's convention: ``num_neighbors[0]`` is sampled
            around the seeds (it feeds the last layer).  Each entry an int (edges per
            destination over all relations; ``-1``: all) or a dict {relation: int} giving a
            fan-out per relation (keys: a relation's name, ``(src, rel, dst)`` tuple or id;
            every relation must be listed).
        input_nodes: the seeds: global ids (``None``: every node), a node-type name (every
            node of that type) or ``(type name, ids within the type)``.
        batch_size, shuffle, drop_last: as in ``torch.utils.data.DataLoader``.
        seed: seeds the shuffle and the sampler (``torch.Generator`` s on the graph's
            device), so two loaders with the same seed yield the same batches.  The shuffle
            generator is the same for every part (so parts stay disjoint every epoch), the
            sampler's differs per part.
        num_parts, part: iterate over part ``part`` of ``num_parts`` equal shares of the
            (shuffled) seeds, every part with the same number of batches (for data-parallel
            training: rank ``part`` of ``num_parts``); the remainder seeds are left out.
        prefetch: build up to this many batches ahead in a background thread while the
            caller computes on the current one (0: none).  The batches are the same as
            without it (one thread samples them in order with the loader's generators); run
            one iteration of a loader at a time (two would share its generators).  The thread
            stops when the iteration ends or its iterator is dropped.  On CUDA it runs on the
            graph's device and its default stream.  On an H200 ``prefetch=2`` made epochs of
            synthetic mag (fan-out 25,20, batch 1024) 10-17% shorter, but small Python-bound
            batches slower (both threads queue for the GIL): measure before turning it on.
        static: sample into buffers of static capacities on the graph's device
            (:mod:`hector.loader.static`): no host read while sampling, one per batch to cut
            its blocks to size.  :meth:`static_batches` yields the uncut batches, which a
            step captured once in a CUDA graph can replay on.  The batches have every
            property of the others, from other random draws.

    Sampling runs on the graph's device; move the graph first (``graph.to('cuda')``).
    """

    def __init__(self, graph: Graph, num_neighbors: Sequence, input_nodes=None,
                 batch_size: int = 1, shuffle: bool = False, seed: Optional[int] = None,
                 drop_last: bool = False, num_parts: int = 1, part: int = 0,
                 prefetch: int = 0, static: bool = False):
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a hector.Graph, got {type(graph).__name__}")
        if graph.num_node_types > 1 and not graph.node_types_contiguous:
            raise ValueError("graph: node types must be contiguous id ranges (build it with "
                             "Graph.from_hetero) so each block keeps them contiguous")
        C.check_size(batch_size, "batch_size")
        C.check_size(num_parts, "num_parts")
        if not 0 <= C.check_count(part, "part") < num_parts:
            raise ValueError(f"part must be in [0, num_parts={num_parts}), got {part}")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if seed is not None and not -2 ** 63 <= seed < 2 ** 63:
            raise ValueError(f"seed must fit in 64 bits (a torch.Generator's), got {seed}")
        self.graph, self.batch_size = graph, batch_size
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.num_parts, self.part = num_parts, part
        self.prefetch = C.check_count(prefetch, "prefetch")
        self.fanouts = [self._fanout(f, i) for i, f in enumerate(_as_list(num_neighbors))]
        self.seeds = self._input_nodes(input_nodes)
        self.index = SamplingIndex.of(graph)
        seed = seed if seed is not None else int(torch.seed() % 2 ** 31)
        self.shuffle_generator = torch.Generator(device=graph.device)
        self.shuffle_generator.manual_seed(seed)
        self.generator = torch.Generator(device=graph.device)
        self.generator.manual_seed(seed + 7919 * part)
        self.node_type_ptr = list(graph.host_ptr["node"])
        self.seed_type = self._only_seed_type()
        #: The most nodes a batch can hold (see ``_max_nodes``).
        self.max_nodes = self._max_nodes()
        self.static = None
        if static:
            self.static = StaticSampler(self.index, self.fanouts, batch_size, self.generator)

    def _only_seed_type(self) -> Optional[int]:
        """The node type of every seed when they share one (read once, here), else None: a
        batch's destination type pointers are then known without a read (a device sync per
        batch on CUDA)."""
        if self.graph.num_node_types == 1:
            return 0
        if not self.seeds.numel():
            return None
        types = self.index.node_type[self.seeds]
        lo, hi = torch.stack([types.min(), types.max()]).tolist()
        return lo if lo == hi else None

    # -- argument parsing -----------------------------------------------------------------
    def _fanout(self, f, hop: int) -> Union[int, torch.Tensor]:
        name = f"num_neighbors[{hop}]"
        if isinstance(f, dict):
            fans, keys = [None] * self.graph.num_relations, {}
            for key, v in f.items():
                try:
                    r = self.graph.relation_index(key)
                except (TypeError, ValueError) as err:
                    raise type(err)(f"{name}: key {key!r}: {err}") from None
                if r in keys:     # one relation by two spellings (name, triple, id)
                    raise ValueError(f"{name} gives relation {r} twice, as {keys[r]!r} and "
                                     f"{key!r}; give each relation one fan-out")
                keys[r] = key
                fans[r] = _check_fanout(v, f"{name}[{key!r}]")
            missing = [self.graph.relation_names[r] if self.graph.relation_names else r
                       for r, v in enumerate(fans) if v is None]
            if missing:
                raise ValueError(f"{name} has no fan-out for relation(s) {missing}; give every "
                                 "relation one (-1 for all edges, 0 for none)")
            return torch.tensor(fans, dtype=torch.int64, device=self.graph.device)
        return _check_fanout(f, name)

    def _input_nodes(self, input_nodes) -> torch.Tensor:
        ids = self._seed_ids(input_nodes)
        # A seed twice would be one destination node sampled twice (twice the fan-out).
        if ids.unique().numel() != ids.numel():
            raise ValueError("input_nodes has duplicate ids; give each seed once")
        return ids

    def _seed_ids(self, input_nodes) -> torch.Tensor:
        g = self.graph
        if input_nodes is None:
            return torch.arange(g.num_nodes, device=g.device)
        if isinstance(input_nodes, str):
            return g.nodes_of_type(input_nodes)
        if isinstance(input_nodes, tuple):
            if len(input_nodes) != 2 or not isinstance(input_nodes[0], str):
                raise TypeError("input_nodes as a tuple must be (node type name, ids), got "
                                f"{input_nodes!r}")
            of_type = g.nodes_of_type(input_nodes[0])
            ids = C.check_index(input_nodes[1], "input_nodes[1]", 1)
            C.check_range(ids, "input_nodes[1]", of_type.numel(),
                          f"the number of {input_nodes[0]!r} nodes")
            return of_type[ids.to(g.device).long()]
        ids = C.check_index(input_nodes, "input_nodes", 1)
        C.check_range(ids, "input_nodes", g.num_nodes, "graph.num_nodes")
        ids = ids.to(g.device).long()
        if g.num_node_types > 1:   # the last block's destinations must be ordered by type
            ids = ids[torch.sort(g.node_type.long()[ids], stable=True).indices]
        return ids

    # -- iteration ------------------------------------------------------------------------
    def _part_seeds(self) -> torch.Tensor:
        seeds = self.seeds
        if self.shuffle:
            seeds = seeds[torch.randperm(seeds.numel(), generator=self.shuffle_generator,
                                         device=seeds.device)]
        share = seeds.numel() // self.num_parts if self.num_parts > 1 else seeds.numel()
        return seeds[self.part * share:(self.part + 1) * share]

    def _max_nodes(self) -> int:
        """The most nodes a batch can hold (``n_id``'s length at most): each hop adds at most
        its fan-out of sources per destination (summed over relations for per-relation
        fan-outs; every node when a fan-out is -1), never more than the graph's nodes.  Made
        once, at construction: per-relation fan-outs live on the graph's device, so each
        call would read them back."""
        n, total = min(self.batch_size, self.seeds.numel()), self.graph.num_nodes
        for f in self.fanouts:
            per = f.tolist() if isinstance(f, torch.Tensor) else [f]
            n = total if min(per) < 0 else min(total, n * (1 + sum(per)))
        return n

    def __len__(self) -> int:
        n = self.seeds.numel() // self.num_parts if self.num_parts > 1 else self.seeds.numel()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        if self.prefetch:
            return prefetched(self._batches(), self.prefetch, self.graph.device)
        return self._batches()

    def _batches(self):
        if self.static is not None:
            for sb in self.static_batches():
                yield sb.to_batch(self.graph, self.node_type_ptr, self.graph.node_type_names)
            return
        for chunk in self._seed_chunks():
            if self.seed_type is not None:     # every seed of one type: its pointers known
                t, n = self.seed_type, chunk.numel()
                yield self.sample(chunk, [0] * (t + 1) + [n] * (self.graph.num_node_types - t))
            else:
                yield self.sample(chunk)

    def _seed_chunks(self):
        """Each batch's seeds (this part's, shuffled when asked), ordered by node type."""
        seeds, size = self._part_seeds(), self.batch_size
        for b in range(len(self)):
            chunk = seeds[b * size:(b + 1) * size]
            if self.seed_type is None:          # (one type: ordered already)
                chunk = chunk[torch.sort(self.index.node_type[chunk], stable=True).indices]
            yield chunk

    def static_batches(self):
        """The batches as :class:`~.static.StaticBatch` es (a loader made with ``static=True``):
        seeds padded to ``batch_size`` with their count on the device, every buffer of a
        static shape, nothing read back to the host."""
        for seeds, count in self.seed_batches():
            yield self.static.sample(seeds, count)

    def seed_batches(self):
        """Each batch's seeds before sampling (a loader made with ``static=True``): ``(seeds,
        count)``, the seeds ordered by node type and padded to ``batch_size``, their count a
        0-d device tensor; what a captured step copies into its buffers."""
        if self.static is None:
            raise RuntimeError("static batches need a loader made with static=True")
        size = self.batch_size
        full = torch.full((), size, dtype=torch.int64, device=self.graph.device)
        for chunk in self._seed_chunks():
            n = chunk.numel()
            if n < size:          # the last, short batch: padded, its count on the device
                yield torch.cat([chunk, chunk.new_zeros(size - n)]), torch.full_like(full, n)
            else:
                yield chunk, full

    def sample(self, seeds: torch.Tensor, seed_type_ptr: Optional[List[int]] = None) -> Batch:
        """The batch of these seeds (global ids, ordered by node type); ``seed_type_ptr``:
        their type pointers, when the caller knows them (else one read)."""
        g, blocks, node_ids = self.graph, [], []
        dst = seeds
        # Destinations per node type: the seeds' counted once (one read), every later hop's
        # are the previous block's sources, whose type pointers its build has read.
        dst_ptr = seed_type_ptr if seed_type_ptr is not None else build.type_ptr(
            self.index.node_type[dst], g.num_node_types)[0].tolist()
        for fanout in self.fanouts:
            src, dst_pos, rel = sample_hop(self.index, dst, fanout, self.generator)
            nodes, dst_local, src_local = relabel(self.index, dst, src)
            block = block_graph(g, torch.stack([src_local, dst_local[dst_pos]]), rel,
                                self.index.node_type[nodes])
            # One node type: the destinations are exactly the first sources (no index needed).
            mark_block(block, dst.numel(), dst_local if g.num_node_types > 1 else None, dst_ptr)
            blocks.append(block)
            node_ids.append(nodes)
            dst, dst_ptr = nodes, block.host_ptr["node"]
        return Batch(blocks[::-1], node_ids[::-1], seeds, self.node_type_ptr, g.node_type_names)


def _as_list(num_neighbors) -> list:
    if isinstance(num_neighbors, (int, dict)) or not isinstance(num_neighbors, Sequence) \
            or isinstance(num_neighbors, str) or len(num_neighbors) == 0:
        raise TypeError("num_neighbors must be a non-empty list (one entry per layer) of ints "
                        f"or dicts {{relation: int}}, got {num_neighbors!r}")
    return list(num_neighbors)


def _check_fanout(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < -1:
        raise ValueError(f"{name} must be an int >= -1 (-1: every neighbour), got {v!r}")
    return v
