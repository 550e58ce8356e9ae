"""Bipartite blocks: a ``Graph`` over a mini-batch's source nodes whose destination nodes are
some of those sources (what ``hector.loader`` builds, one per layer).

A block is an ordinary ``Graph`` over its ``num_nodes`` source nodes plus three attributes:

* ``num_dst_nodes``: how many destination nodes (the rows a layer returns);
* ``dst_index``: ``[num_dst_nodes]`` local (source-space) id of each destination node, in
  destination order; ``None`` when the destinations are the first ``num_dst_nodes`` sources
  (always so with one node type);
* ``dst_type_ptr``: ``[T + 1]`` host list, destination nodes of type ``t`` are rows
  ``dst_type_ptr[t]:dst_type_ptr[t + 1]`` of the destination order.

With several node types the sources are ordered by (type, destination first): the
destinations of type ``t`` are the first sources of type ``t``, so node types stay contiguous
id ranges (the typed linears and ``x_dict`` slicing need that) and destination ``j`` of type
``t`` is source ``node_type_ptr[t] + (j - dst_type_ptr[t])``.
"""
from __future__ import annotations

from typing import List, Optional

import torch


def mark_block(graph, num_dst_nodes: int, dst_index: Optional[torch.Tensor],
               dst_type_ptr: List[int]):
    """Make ``graph`` (built over the block's source nodes) a block; returns it."""
    if not 0 <= num_dst_nodes <= graph.num_nodes:
        raise ValueError(f"num_dst_nodes={num_dst_nodes} must be in [0, num_nodes="
                         f"{graph.num_nodes}]")
    graph.num_dst_nodes = int(num_dst_nodes)
    graph.dst_index = dst_index
    graph.dst_type_ptr = list(dst_type_ptr)
    return graph


def dst_rows(graph):
    """What selects the destination rows from a [num_nodes, ...] output: a slice when the
    destinations are a prefix, else the index tensor.  ``None`` for a graph that is no block."""
    if graph.num_dst_nodes is None:
        return None
    if graph.dst_index is None:
        return slice(0, graph.num_dst_nodes)
    return graph.dst_index.long()


def take_rows(out: torch.Tensor, rows):
    """``out`` restricted to ``rows`` (``None``: all of it)."""
    if rows is None:
        return out
    if isinstance(rows, slice):
        return out[rows]
    return out.index_select(0, rows)
