"""Build-once cache: layers called again and again with the same ``edge_index`` tensor (the
PyG calling convention) get the same ``Graph`` instead of re-sorting every forward."""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Optional

import torch

from .graph import Graph

_CACHE_SIZE = 8
_cache: "OrderedDict[tuple, tuple]" = OrderedDict()


def _key(t: Optional[torch.Tensor]):
    if t is None:
        return None
    # id + data pointer + version counter: an in-place edit or a new tensor is a miss.
    return (id(t), t.data_ptr(), t._version, tuple(t.shape), t.dtype, str(t.device))


def graph_of(edge_index: torch.Tensor, edge_type: Optional[torch.Tensor] = None,
             num_nodes: Optional[int] = None, num_relations: Optional[int] = None) -> Graph:
    """The ``Graph`` for these tensors, built on first use and reused while they live unchanged."""
    if isinstance(edge_index, Graph):
        return edge_index
    key = (_key(edge_index), _key(edge_type), num_nodes, num_relations)
    hit = _cache.get(key)
    if hit is not None:
        refs, graph = hit
        if all(r() is not None for r in refs):
            _cache.move_to_end(key)
            return graph
    graph = Graph(edge_index, edge_type=edge_type, num_nodes=num_nodes, num_relations=num_relations)
    refs = tuple(weakref.ref(t) for t in (edge_index, edge_type) if t is not None)
    _cache[key] = (refs, graph)
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return graph
