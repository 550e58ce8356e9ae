"""Vectorised builders for the graph structures: sorts, bincounts and cumsums, no Python loop
over nodes or edges.  Everything runs on the device of its inputs and works in int64; the
``Graph`` narrows the results to its index dtype at the end."""
from __future__ import annotations

import torch

from .structures import CSR, CompactMap

INT32_LIMIT = 2 ** 31 - 1


def index_dtype(num_nodes: int, num_edges: int) -> torch.dtype:
    """int32 indices where every id and pointer fits (half the bytes, faster gathers)."""
    return torch.int32 if max(num_nodes, num_edges) < INT32_LIMIT else torch.int64


def counts_to_ptr(counts: torch.Tensor) -> torch.Tensor:
    ptr = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=counts.device)
    torch.cumsum(counts, 0, out=ptr[1:])
    return ptr


def ptr_of(keys: torch.Tensor, n: int) -> torch.Tensor:
    """Segment pointers [n + 1] for keys in [0, n) (sorted or not: only the counts matter)."""
    return counts_to_ptr(torch.bincount(keys, minlength=n)[:n])


def take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[index]`` for 1-D tensors; index_select is ~1.8x faster than advanced indexing
    on CPUs for tens of millions of random reads (measured in docs/perf-notes.md)."""
    return torch.index_select(values, 0, index)


def stable_argsort(keys: torch.Tensor) -> torch.Tensor:
    return torch.sort(keys, stable=True).indices


def canonical_order(src: torch.Tensor, dst: torch.Tensor, etype: torch.Tensor,
                    num_nodes: int) -> torch.Tensor:
    """Permutation sorting edges by (relation, destination), ties in input order."""
    del src  # the order does not depend on the source; kept in the signature for clarity
    return stable_argsort(etype * max(num_nodes, 1) + dst)


def csr(row: torch.Tensor, col: torch.Tensor, num_nodes: int) -> CSR:
    """CSR over ``row`` of edges given in canonical order (a stable sort keeps relation order
    inside each row)."""
    order = stable_argsort(row)
    return CSR(ptr=ptr_of(row, num_nodes), col=take(col, order), eid=order)


def compact_map(node: torch.Tensor, etype: torch.Tensor, num_nodes: int, num_relations: int,
                keys_sorted: bool) -> CompactMap:
    """Unique (node, relation) pairs.  ``keys_sorted``: the key ``etype * N + node`` is already
    non-decreasing (true for destinations in canonical order), so a consecutive unique does."""
    key = etype * max(num_nodes, 1) + node
    if keys_sorted:
        uniq, edge_row = torch.unique_consecutive(key, return_inverse=True)
    else:
        uniq, edge_row = torch.unique(key, sorted=True, return_inverse=True)
    rel = torch.div(uniq, max(num_nodes, 1), rounding_mode="floor")
    return CompactMap(node=uniq - rel * max(num_nodes, 1), rel=rel,
                      rel_ptr=ptr_of(rel, num_relations), edge_row=edge_row)


def type_grouping(node_type: torch.Tensor, num_node_types: int):
    """(ptr [T+1], perm [N] grouping nodes by type, contiguous?) for a node-type array."""
    ptr = ptr_of(node_type, num_node_types)
    contiguous = bool((node_type[1:] >= node_type[:-1]).all()) if node_type.numel() > 1 else True
    perm = None if contiguous else stable_argsort(node_type)
    return ptr, perm, contiguous
