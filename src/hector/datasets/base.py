"""The dataset object every loader returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Dict, List, Optional, Tuple

import torch
from ..graph import Graph


@dataclass(eq=False)
class Dataset:
    """A graph with its node labels and splits, in PyG-style tensors.

    ``edge_index`` [2, E] and ``edge_type`` [E] (None for a graph with one relation) use global
    node ids.  For heterogeneous data the ids of one node type form a contiguous range, given by
    ``node_type`` [N] and the names in ``node_type_names``; ``relation_names`` are the canonical
    edge types ``(src_type, relation, dst_type)``.  ``graph`` builds the ``hector.Graph`` once,
    on first use.
    """
    name: str
    edge_index: torch.Tensor
    num_nodes: int
    edge_type: Optional[torch.Tensor] = None
    num_relations: int = 1
    node_type: Optional[torch.Tensor] = None
    node_type_names: Optional[List[str]] = None
    relation_names: Optional[List[Tuple[str, str, str]]] = None
    x: Optional[torch.Tensor] = None
    y: Optional[torch.Tensor] = None
    train_idx: Optional[torch.Tensor] = None
    val_idx: Optional[torch.Tensor] = None
    test_idx: Optional[torch.Tensor] = None
    num_classes: int = 0
    extra: Dict[str, object] = field(default_factory=dict)

    @cached_property
    def graph(self):
        return Graph(self.edge_index, edge_type=self.edge_type, num_nodes=self.num_nodes,
                     num_relations=self.num_relations, node_type=self.node_type,
                     num_node_types=len(self.node_type_names) if self.node_type_names else None,
                     node_type_names=self.node_type_names, relation_names=self.relation_names)

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    def to(self, device) -> "Dataset":
        """A copy with every tensor on ``device`` (the graph is rebuilt there on first use)."""
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                 for k, v in self.__dict__.items() if k != "graph"}
        return Dataset(**moved)

    def __repr__(self) -> str:
        parts = [f"name={self.name!r}", f"num_nodes={self.num_nodes}", f"num_edges={self.num_edges}",
                 f"num_relations={self.num_relations}"]
        if self.x is not None:
            parts.append(f"x={tuple(self.x.shape)}")
        if self.num_classes:
            parts.append(f"num_classes={self.num_classes}")
        return f"Dataset({', '.join(parts)})"
