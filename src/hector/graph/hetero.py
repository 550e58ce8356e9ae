"""PyG ``HeteroData`` layout (per-type local ids) to one global id space."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

from .. import checks as C


@dataclass
class FlatHetero:
    edge_index: torch.Tensor
    edge_type: torch.Tensor
    node_type: torch.Tensor
    num_nodes: int
    node_type_names: List[str]
    relation_names: List[Tuple[str, str, str]]
    node_offset: Dict[str, int]


def flatten_hetero(edge_index_dict, num_nodes_dict) -> FlatHetero:
    """Node type ``t`` gets ids ``offset[t] .. offset[t] + num_nodes_dict[t]``, in dict order;
    relation ``i`` is the ``i``-th key of ``edge_index_dict``.  Every local id is range-checked
    against its own type's count, so the message names the relation and endpoint."""
    if not isinstance(num_nodes_dict, dict) or not num_nodes_dict:
        raise TypeError("num_nodes_dict must be a non-empty dict {node_type: num_nodes}, got "
                        f"{type(num_nodes_dict).__name__}")
    if not isinstance(edge_index_dict, dict):
        raise TypeError("edge_index_dict must be a dict {(src_type, relation, dst_type): "
                        f"edge_index}}, got {type(edge_index_dict).__name__}")
    names = list(num_nodes_dict)
    counts = [C.check_count(num_nodes_dict[t], f"num_nodes_dict[{t!r}]") for t in names]
    offsets, total = {}, 0
    for t, n in zip(names, counts):
        offsets[t], total = total, total + n
    relations, parts, types = [], [], []
    device = None
    for i, (key, ei) in enumerate(edge_index_dict.items()):
        if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, str) for k in key)):
            raise TypeError(f"edge_index_dict keys must be (src_type, relation, dst_type) tuples "
                            f"of str, got {key!r}")
        s, _, d = key
        for t, end in ((s, "source"), (d, "destination")):
            if t not in offsets:
                raise ValueError(f"edge_index_dict[{key!r}] has {end} type {t!r}, which is not "
                                 f"in num_nodes_dict (known: {names})")
        arg = f"edge_index_dict[{key!r}]"
        C.check_edge_index(ei, arg)
        if device is not None and ei.device != device:
            raise ValueError(f"{arg} is on {ei.device} but earlier relations are on {device}; "
                             "all edge indices must be on one device")
        device = ei.device
        C.check_range(ei[0], f"{arg}[0] (source ids)", num_nodes_dict[s], f"num_nodes_dict[{s!r}]")
        C.check_range(ei[1], f"{arg}[1] (destination ids)", num_nodes_dict[d], f"num_nodes_dict[{d!r}]")
        offset = torch.tensor([[offsets[s]], [offsets[d]]], dtype=torch.int64, device=device)
        parts.append(ei.long() + offset)
        types.append(torch.full((ei.shape[1],), i, dtype=torch.int64, device=device))
        relations.append(key)
    device = device or torch.device("cpu")
    edge_index = torch.cat(parts, 1) if parts else torch.zeros(2, 0, dtype=torch.int64, device=device)
    edge_type = torch.cat(types) if types else torch.zeros(0, dtype=torch.int64, device=device)
    node_type = torch.repeat_interleave(torch.arange(len(names), device=device),
                                        torch.tensor(counts, device=device))
    return FlatHetero(edge_index, edge_type, node_type, total, names, relations, offsets)
