"""Build-once cache: layers called again and again with the same ``edge_index`` tensor (the
PyG calling convention) get the same ``Graph`` instead of re-sorting every forward.

The key (id, data pointer, version counter, shape, dtype, device) is only a fast filter: some
edits change a tensor's values without bumping its version counter (writing into the numpy
array behind ``torch.from_numpy``, writing through ``tensor.data``, foreign writers via DLPack).
So every entry keeps a private copy of the tensors it was built from, and a hit is used only
when ``torch.equal`` says the tensors still hold exactly those values; otherwise the Graph is
rebuilt.  That check reads the E ids once, which is cheap next to what it guards (a Graph build
sorts them several times, and a layer call does far more work per edge).

Trade-off on CUDA: ``torch.equal`` on a CUDA tensor waits for the device (one host sync per
cached call).  Correctness is the default.  Callers who need a sync-free hot path have two
options: pass a ``Graph`` (built once, e.g. ``hector.Graph(edge_index)``) instead of the tensor,
which skips the cache entirely, or set ``HECTOR_GRAPH_CACHE_VERIFY=cpu`` to check contents only
for CPU tensors and trust the key for CUDA ones (the edits above that it then misses are
``.data`` writes and foreign writers; numpy-backed tensors are CPU-only).
"""
from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from typing import Callable, Optional, Sequence, Tuple, TypeVar

import torch

from .graph import Graph

_CACHE_SIZE = 8
_cache: "OrderedDict[tuple, tuple]" = OrderedDict()
ENV_VERIFY = "HECTOR_GRAPH_CACHE_VERIFY"
T = TypeVar("T")


def _key(t: Optional[torch.Tensor]):
    if t is None:
        return None
    # id + data pointer + version counter: an in-place edit or a new tensor is a miss.
    return (id(t), t.data_ptr(), t._version, tuple(t.shape), t.dtype, str(t.device))


def _verify(t: torch.Tensor) -> bool:
    """Whether a hit on ``t`` must be confirmed by comparing contents (see the module doc)."""
    mode = os.environ.get(ENV_VERIFY, "always").strip().lower()
    if mode not in ("always", "cpu"):
        raise ValueError(f"${ENV_VERIFY} must be 'always' or 'cpu', got {mode!r}")
    return mode == "always" or t.device.type == "cpu"


def _unchanged(tensors: Tuple[torch.Tensor, ...], copies: Tuple[torch.Tensor, ...]) -> bool:
    return all(not _verify(t) or torch.equal(t, c) for t, c in zip(tensors, copies))


@torch.compiler.disable
def cached(tensors: Sequence[Optional[torch.Tensor]], extra: tuple, build: Callable[[], T]) -> T:
    """What ``build()`` makes from ``tensors`` (None entries allowed) and the hashable ``extra``
    (sizes, a tag), reused while the tensors live and hold the same values: a Graph, or any
    other structure derived from raw index tensors.  Shared by every layer that derives
    something from raw tensors, so all get the same guarantee.

    Run eagerly under ``torch.compile`` (one graph break): traced, dynamo guarded on the
    cache's own entries, and a guard on a tensor whose weak reference had died failed the
    compilation (seen once in a long CPU test run)."""
    given = tuple(t for t in tensors if t is not None)
    key = tuple(_key(t) for t in tensors) + tuple(extra)
    hit = _cache.get(key)
    if hit is not None:
        refs, copies, graph = hit
        if all(r() is not None for r in refs) and _unchanged(given, copies):
            _cache.move_to_end(key)
            return graph
        del _cache[key]
    graph = build()
    refs = tuple(weakref.ref(t) for t in given)
    # detach().clone(): a copy no later write to the caller's tensor (whatever path) reaches.
    copies = tuple(t.detach().clone() for t in given)
    _cache[key] = (refs, copies, graph)
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return graph


def graph_of(edge_index: torch.Tensor, edge_type: Optional[torch.Tensor] = None,
             num_nodes: Optional[int] = None, num_relations: Optional[int] = None) -> Graph:
    """The ``Graph`` for these tensors, built on first use and reused while they hold the same
    values (checked on every hit; see the module docstring for the cost and the CUDA option)."""
    if isinstance(edge_index, Graph):
        return edge_index
    return cached((edge_index, edge_type), ("graph_of", num_nodes, num_relations),
                  lambda: Graph(edge_index, edge_type=edge_type, num_nodes=num_nodes,
                                num_relations=num_relations))
