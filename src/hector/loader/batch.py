"""A mini-batch (:class:`Batch`) and its blocks' ``Graph`` build (:func:`block_graph`), shared
by ``NeighborLoader`` and the static-capacity sampler's cut."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from ..graph import Graph


@dataclass
class Batch:
    """One mini-batch.

    Attributes:
        blocks: one block per layer, outermost first (``blocks[0]`` feeds the first layer;
            ``blocks[-1]``'s destinations are the seeds).  Block ``l``'s destinations are
            block ``l + 1``'s sources, in the same order.
        node_ids: global ids of each block's source nodes, in the block's local order.
        n_id: ``node_ids[0]``: the nodes whose features the first layer reads.
        seed: global ids of the seeds, in the order of the last layer's output rows.
        batch_size: number of seeds.
    """
    blocks: List[Graph]
    node_ids: List[torch.Tensor]
    seed: torch.Tensor
    node_type_ptr: List[int]            # the full graph's, to map global ids to per-type ids
    node_type_names: Optional[List[str]]

    @property
    def n_id(self) -> torch.Tensor:
        return self.node_ids[0]

    @property
    def batch_size(self) -> int:
        return int(self.seed.numel())

    def n_id_dict(self) -> Dict[str, torch.Tensor]:
        """Per node type, the ids *within the type* of the first block's sources (what indexes
        a PyG-style ``x_dict[type]``), in the block's local order."""
        block, out = self.blocks[0], {}
        names = self.node_type_names or [str(t) for t in range(len(self.node_type_ptr) - 1)]
        ptr = block.host_ptr["node"]
        for t, name in enumerate(names):
            out[name] = self.n_id[ptr[t]:ptr[t + 1]] - self.node_type_ptr[t]
        return out

    def x_dict(self, x_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The first block's source features, per node type, from full-graph ``x_dict``."""
        return {t: x_dict[t].index_select(0, ids.to(x_dict[t].device))
                for t, ids in self.n_id_dict().items() if t in x_dict}

    def to(self, device) -> "Batch":
        return Batch([b.to(device) for b in self.blocks], [n.to(device) for n in self.node_ids],
                     self.seed.to(device), self.node_type_ptr, self.node_type_names)



def block_graph(graph: Graph, edge_index: torch.Tensor, edge_type: torch.Tensor,
                node_type: torch.Tensor) -> Graph:
    """The ``Graph`` of a block of ``graph``'s schema over ``node_type.numel()`` source nodes.
    The sampler makes every id valid (local ids of the nodes it lists, relations and types
    of the graph's own edges), so the id checks are skipped: each read back all ids, a device
    sync per check on CUDA.  It also lists the edges sorted by (destination, relation) (by
    destination position, then the graph's CSR order; the destinations' local ids ascend),
    which spares the build a sort (``dst_sorted``)."""
    return Graph(edge_index, edge_type=edge_type, num_nodes=node_type.numel(),
                 num_relations=graph.num_relations, node_type=node_type,
                 num_node_types=graph.num_node_types, node_type_names=graph.node_type_names,
                 relation_names=graph.relation_names, check_ids=False, dst_sorted=True)
