"""Block-diagonal batching: many small graphs (molecule-style) as one ``Graph``."""
from __future__ import annotations

from typing import Sequence

import torch


def batch_graphs(cls, graphs: Sequence):
    """Offsets every graph's node ids past the previous ones and concatenates the edges in
    each graph's input order, so edge-wise inputs of the members concatenate the same way.
    One vectorised pass over all edges; the batch is then built like any other graph."""
    graphs = list(graphs)
    if not graphs or not all(isinstance(g, cls) for g in graphs):
        raise TypeError("graphs must be a non-empty sequence of hector.Graph")
    first = graphs[0]
    for i, g in enumerate(graphs[1:], 1):
        if (g.num_relations, g.num_node_types) != (first.num_relations, first.num_node_types) \
                or g.relation_names != first.relation_names or g.node_type_names != first.node_type_names:
            raise ValueError(f"graphs[{i}] has another schema (relations / node types) than graphs[0]; "
                             "only graphs with the same node types and relations can be batched")
        if g.device != first.device:
            raise ValueError(f"graphs[{i}] is on {g.device} but graphs[0] is on {first.device}")
    device = first.device
    num_nodes = torch.tensor([g.num_nodes for g in graphs], device=device)
    num_edges = torch.tensor([g.num_edges for g in graphs], device=device)
    node_offset = torch.cumsum(num_nodes, 0) - num_nodes
    edge_offset = torch.cumsum(num_edges, 0) - num_edges
    shift = torch.repeat_interleave(node_offset, num_edges)
    # Canonical arrays of all members, put back into (member, input position) order at once.
    perm = torch.cat([g.edge_perm.long() for g in graphs]) + torch.repeat_interleave(edge_offset, num_edges)
    src = torch.empty_like(perm)
    dst = torch.empty_like(perm)
    etype = torch.empty_like(perm)
    src[perm] = torch.cat([g.src.long() for g in graphs]) + shift
    dst[perm] = torch.cat([g.dst.long() for g in graphs]) + shift
    etype[perm] = torch.cat([g.etype.long() for g in graphs])
    out = cls(torch.stack([src, dst]), edge_type=etype, num_nodes=int(num_nodes.sum()),
              num_relations=first.num_relations,
              node_type=torch.cat([g.node_type.long() for g in graphs]),
              num_node_types=first.num_node_types, node_type_names=first.node_type_names,
              relation_names=first.relation_names,
              super_node_threshold=first.in_degree.super_threshold)
    out.graph_ptr = torch.cat([node_offset, num_nodes.sum().view(1)]).to(out.index_dtype)
    return out
