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


#: Past this many segments the pointers are found by binary search in chunks: on the H200
#: (torch 2.11) bincount + cumsum over 2^31 + 10 segments returned a wrong last pointer (1
#: instead of 3 edges), and chunks also bound the temporary memory.
SEARCH_SEGMENTS = INT32_LIMIT
SEARCH_CHUNK = 2 ** 28


def ptr_of(keys: torch.Tensor, n: int) -> torch.Tensor:
    """Segment pointers [n + 1] for keys in [0, n) (sorted or not: only the counts matter)."""
    if n + 1 <= SEARCH_SEGMENTS:
        return counts_to_ptr(torch.bincount(keys, minlength=n)[:n])
    # ptr[i] = number of keys < i: a binary search of each i in the sorted keys.
    ordered = torch.sort(keys.to(torch.int64)).values
    ptr = torch.empty(n + 1, dtype=torch.int64, device=keys.device)
    for start in range(0, n + 1, SEARCH_CHUNK):        # a loop over chunks, not over nodes
        stop = min(start + SEARCH_CHUNK, n + 1)
        bounds = torch.arange(start, stop, dtype=torch.int64, device=keys.device)
        ptr[start:stop] = torch.searchsorted(ordered, bounds)
    return ptr


def sorted_ptr(keys: torch.Tensor, n: int) -> torch.Tensor:
    """:func:`ptr_of` for non-decreasing ``keys``.  Off the CPU a binary search of every
    bound: ``bincount`` reads its input's largest key back to size its output (a host sync
    per call, a dozen per mini-batch block); on the CPU the count is faster."""
    if keys.device.type == "cpu" or n + 1 > SEARCH_SEGMENTS:
        return ptr_of(keys, n)
    return search_ptr(keys, n)


def search_ptr(keys: torch.Tensor, n: int) -> torch.Tensor:
    """``ptr[i]`` = how many of the sorted ``keys`` are below ``i``, for ``i <= n < 2^31``."""
    return torch.searchsorted(keys, torch.arange(n + 1, device=keys.device, dtype=keys.dtype))


def take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[index]`` for 1-D tensors; index_select is ~1.8x faster than advanced indexing
    on CPUs for tens of millions of random reads (measured in docs/perf-notes.md)."""
    return torch.index_select(values, 0, index)


def stable_argsort(keys: torch.Tensor) -> torch.Tensor:
    return torch.sort(keys, stable=True).indices


def sort_key(key: torch.Tensor, bound: int) -> torch.Tensor:
    """``key`` (values in ``[0, bound)``) as int32 where that holds them: sorting 32-bit keys
    is ~3x faster than 64-bit ones on the CPU (80K keys, torch 2.13) and cheaper on CUDA; the
    permutation of a stable sort is the same."""
    return key.to(torch.int32) if bound <= INT32_LIMIT else key


def canonical_order(src: torch.Tensor, dst: torch.Tensor, etype: torch.Tensor,
                    num_nodes: int, num_relations: int) -> torch.Tensor:
    """Permutation sorting edges by (relation, destination), ties in input order."""
    del src  # the order does not depend on the source; kept in the signature for clarity
    n = max(num_nodes, 1)
    return stable_argsort(sort_key(etype * n + dst, max(num_relations, 1) * n))


def csr(row: torch.Tensor, col: torch.Tensor, num_nodes: int) -> CSR:
    """CSR over ``row`` of edges given in canonical order (a stable sort keeps relation order
    inside each row)."""
    ordered, order = torch.sort(sort_key(row, num_nodes), stable=True)
    return CSR(ptr=sorted_ptr(ordered, num_nodes), col=take(col, order), eid=order)


def compact_map(node: torch.Tensor, etype: torch.Tensor, num_nodes: int, num_relations: int,
                keys_sorted: bool) -> CompactMap:
    """Unique (node, relation) pairs.  ``keys_sorted``: the key ``etype * N + node`` is already
    non-decreasing (true for destinations in canonical order), so a consecutive unique does."""
    key = sort_key(etype * max(num_nodes, 1) + node, max(num_relations, 1) * max(num_nodes, 1))
    if keys_sorted:
        uniq, edge_row = torch.unique_consecutive(key, return_inverse=True)
    else:
        uniq, edge_row = torch.unique(key, sorted=True, return_inverse=True)
    rel = torch.div(uniq, max(num_nodes, 1), rounding_mode="floor")
    return CompactMap(node=uniq - rel * max(num_nodes, 1), rel=rel,
                      rel_ptr=sorted_ptr(rel, num_relations), edge_row=edge_row)


def type_grouping(node_type: torch.Tensor, num_node_types: int):
    """(ptr [T+1], perm [N] grouping nodes by type, contiguous?) for a node-type array."""
    contiguous = bool((node_type[1:] >= node_type[:-1]).all()) if node_type.numel() > 1 else True
    ptr = sorted_ptr(node_type, num_node_types) if contiguous else ptr_of(node_type, num_node_types)
    perm = None if contiguous else stable_argsort(node_type)
    return ptr, perm, contiguous


# -- memory planning ------------------------------------------------------------------------
#: Set to a byte count to cap the memory a Graph build may plan for (overrides the check
#: against available memory, in either direction).
ENV_MAX_BUILD_BYTES = "HECTOR_MAX_GRAPH_BYTES"


def build_nbytes(num_nodes: int, num_edges: int, num_relations: int) -> int:
    """An estimate, on the low side, of the peak bytes a ``Graph`` build holds at once.

    Per node: int64 degree counts and CSR pointers while building, their narrowed copies, the
    degree statistics' float64 copy, the node-type arrays; per edge: int64 src/dst/relation
    arrays, sort keys, permutations and CSR columns.  The constants are measured peaks (CPU,
    torch 2.13: 42 bytes per node with int32 indices, 139 per edge), rounded down so a build
    that fits is never refused; the point is to refuse the impossible up front (2^31 nodes
    with 2 edges: ~100 GiB) instead of failing deep inside an allocation."""
    idx = 4 if index_dtype(num_nodes, num_edges) == torch.int32 else 8
    return num_nodes * (32 + 2 * idx) + num_edges * 120 + num_relations * 16


def available_bytes(device: torch.device):
    """Free memory on ``device`` (CUDA: the driver's free count; CPU: MemAvailable from
    /proc/meminfo), or None where it cannot be read."""
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_build_memory(num_nodes: int, num_edges: int, num_relations: int,
                       device: torch.device) -> None:
    """Refuse, before allocating anything, a build that needs more memory than
    ``$HECTOR_MAX_GRAPH_BYTES`` allows or, when that is unset, than ``device`` has free."""
    import os
    need = build_nbytes(num_nodes, num_edges, num_relations)
    text = os.environ.get(ENV_MAX_BUILD_BYTES)
    if text:
        try:
            cap, what = int(text), f"${ENV_MAX_BUILD_BYTES}={text}"
        except ValueError:
            raise ValueError(f"${ENV_MAX_BUILD_BYTES} must be an integer byte count, got "
                             f"{text!r}") from None
    else:
        cap, what = available_bytes(device), f"the {device} memory available now"
    if cap is not None and need > cap:
        raise ValueError(
            f"building a Graph with num_nodes={num_nodes:,}, {num_edges:,} edges needs about "
            f"{need / 2**30:.1f} GiB on {device}, more than {what} ({cap / 2**30:.1f} GiB); "
            f"pass the true num_nodes (memory grows with it even without edges) or set "
            f"${ENV_MAX_BUILD_BYTES} to allow it")
