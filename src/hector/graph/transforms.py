"""Graphs derived from a graph, memoised on it so a layer called every step derives once."""
from __future__ import annotations

import torch

from .capacity import with_loops
from .graph import Graph, recipe


def with_self_loops(graph: Graph) -> Graph:
    """PyG's ``remove_self_loops`` then ``add_self_loops``: every node gets exactly one self
    loop (relation 0), after the graph's other edges in input order."""
    return graph.derive("self_loops")


@recipe("self_loops")
def _self_loop_twin(graph: Graph) -> Graph:
    twin = with_loops(graph)           # a capacity block's: its sizes stay capacities
    if twin is not None:
        return twin
    ei, et = graph.input_edge_index(), graph.input_edge_type()
    keep = ei[0] != ei[1]
    loops = torch.arange(graph.num_nodes, device=graph.device)
    twin = Graph(
        torch.cat([ei[:, keep], loops.expand(2, -1)], 1),
        edge_type=torch.cat([et[keep], torch.zeros_like(loops)]),
        num_nodes=graph.num_nodes, num_relations=graph.num_relations,
        node_type=graph.node_type.long(), num_node_types=graph.num_node_types,
        node_type_names=graph.node_type_names,
        super_node_threshold=graph.in_degree.super_threshold)
    if graph.is_block:   # same nodes, so the same destination rows
        from .block import mark_block
        mark_block(twin, graph.num_dst_nodes, graph.dst_index, graph.dst_type_ptr)
    return twin
