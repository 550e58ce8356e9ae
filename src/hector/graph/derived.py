"""Derived bipartite graphs for the fused attention op, built with only what that op reads.

The compiler runs some attention steps on a graph derived from the real one (sources: compact
(src, relation) rows or edges; destinations: nodes or compact (dst, relation) rows; one derived
edge per edge; see :mod:`hector.compiler.steps_triton.attention`).  Every mini-batch block
builds its own.
A full :class:`~hector.graph.Graph` re-validates ids the real graph already checked and builds
compact maps, a relation order and a node-type grouping the op never reads: about half the
host time of a new batch's first RGAT step.  :class:`AttentionGraph` is a ``Graph`` holding
exactly the op's fields, equal to those a full build of the same edges would hold.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import build
from .graph import SUPER_NODE_DEGREE, Graph, recipe
from .structures import CSR, DegreeStats

#: What an :class:`AttentionGraph` holds (besides sizes and device): the fused attention op's
#: inputs (both CSRs, their degree statistics) and the edge endpoints (its torch reference).
ATTENTION_FIELDS = ("src", "dst", "edge_perm", "rel_ptr", "csr_in", "csr_out", "in_degree",
                    "out_degree")


class AttentionGraph(Graph):
    """One relation, one node type, edges ``src[i] -> dst[i]`` over ``num_nodes`` ids, holding
    only :data:`ATTENTION_FIELDS`; any other ``Graph`` field raises a clear AttributeError.

    Ids are trusted (the caller derives them from a validated graph): nothing is read back to
    check them.  ``dst_sorted``: ``dst`` is known non-decreasing, so the canonical edge order
    (by destination, input order within ties) is the input order and no sort runs.
    ``dst_order``: that order when the caller holds it (the stable sort of ``dst``: for a
    graph's own destinations, its ``csr_in.eid``), so no sort runs either; trusted.
    ``num_src`` / ``num_dst``: every source id is below ``num_src`` and every destination id
    below ``num_dst`` (default ``num_nodes``; trusted): the op's operands of that side have
    that many rows and its traversals of that side run over that many (a derived graph's ids
    span max(sources, destinations), and padding the shorter side's operands, outputs and
    gradients to it cost HGT on mag a 1.1M-row fill and copy each way).  ``capacity``: the
    capacity block it is derived from (:mod:`.capacity`): its degree statistics are that
    block's bounds, with no read, and the attention plans treat it as the block."""

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, num_nodes: int,
                 dst_sorted: bool = False, dst_order: Optional[torch.Tensor] = None,
                 num_src: Optional[int] = None, num_dst: Optional[int] = None,
                 capacity: Optional[Graph] = None):
        # (no super().__init__: a full Graph build is what this class avoids)
        if src.dim() != 1 or dst.shape != src.shape:
            raise ValueError(f"src and dst must be 1-D of one length, got {tuple(src.shape)} "
                             f"and {tuple(dst.shape)}")
        src, dst = src.long(), dst.long()
        n, e, dev = int(num_nodes), int(src.numel()), src.device
        self.num_nodes, self.num_edges, self.device = n, e, dev
        self.num_src_rows = n if num_src is None else int(num_src)
        self.num_dst_rows = n if num_dst is None else int(num_dst)
        if not (0 <= self.num_src_rows <= n and 0 <= self.num_dst_rows <= n):
            raise ValueError(f"num_src ({num_src}) and num_dst ({num_dst}) must lie in [0, "
                             f"num_nodes = {n}]")
        self.num_relations = self.num_node_types = 1
        self.index_dtype = idx = build.index_dtype(n, e)
        self.node_type_names = self.relation_names = self.graph_ptr = None
        edges = torch.arange(e, device=dev)
        if dst_order is not None and dst_order.shape != (e,):
            raise ValueError(f"dst_order must be [E] = [{e}], got {tuple(dst_order.shape)}")
        if dst_sorted:
            perm = edges
        elif dst_order is not None:
            perm = dst_order.long()
        else:
            perm = build.stable_argsort(build.sort_key(dst, n))
        if not dst_sorted:
            src, dst = build.take(src, perm), build.take(dst, perm)
        # Canonical order is by destination, so the CSR by destination is that order itself
        # (what Graph's stable sort of a sorted key returns).
        csr_in = CSR(ptr=build.sorted_ptr(dst, n), col=src, eid=edges)
        # The CSR by source (a sort) is built on first use, as a Graph's (only a backward to
        # the sources reads it); its degrees are counted here for the statistics.
        if capacity is not None:
            self.in_degree, self.out_degree = capacity.in_degree, capacity.out_degree
            self.capacity = capacity.capacity
        else:
            self.in_degree, self.out_degree = DegreeStats.of_each(
                [csr_in.degrees(), build.counts_of(src, n)], SUPER_NODE_DEGREE)
        self.src, self.dst, self.edge_perm = src.to(idx), dst.to(idx), perm.to(idx)
        self.rel_ptr = torch.arange(2, dtype=idx, device=dev) * e     # [0, E], no host copy
        self.csr_in = CSR(*(a.to(idx) for a in (csr_in.ptr, csr_in.col, csr_in.eid)))
        self._csr_out = None
        self._device_copies = {dev: self}
        self._derived = {}

    def __getattr__(self, name: str):
        # Only reached for attributes the instance lacks (what a full Graph would also hold).
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"{name!r}: a derived attention graph holds only "
                             f"{', '.join(ATTENTION_FIELDS)} (build a hector.Graph for more)")


def has_in_edges(graph: Graph, dtype: torch.dtype) -> torch.Tensor:
    """``[N]``: 1 where a node has an incoming edge, else 0, in ``dtype`` (made once per
    graph; under ``torch.compile`` made in the compiled code instead, since a tensor that a
    compiled region made, kept on the graph, may live in a CUDA-graph pool that later
    replays overwrite)."""
    if torch.compiler.is_compiling():
        return _has_in_edges(graph, dtype)
    return graph.derive(("has_in_edges", dtype))


@recipe("has_in_edges")
def _has_in_edges(graph: Graph, dtype: torch.dtype) -> torch.Tensor:
    return (graph.csr_in.degrees() > 0).to(dtype)
