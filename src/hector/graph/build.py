"""Vectorised builders for the graph structures: sorts, bincounts and cumsums, no Python loop
over nodes or edges.  Everything runs on the device of its inputs and works in int64; the
``Graph`` narrows the results to its index dtype at the end."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .structures import CSR, CompactMap

INT32_LIMIT = 2 ** 31 - 1


def index_dtype(num_nodes: int, num_edges: int) -> torch.dtype:
    """int32 indices where every id and pointer fits (half the bytes, faster gathers)."""
    return torch.int32 if max(num_nodes, num_edges) < INT32_LIMIT else torch.int64


def host_constant(values: Tuple, device: torch.device, dtype=torch.int64) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)``, made once per (values, device,
    dtype) and shared (never write into it): a host-to-device copy from pageable memory waits
    for the stream, and every mini-batch block asking for the same small table (a schema's
    relation endpoint types, each relation's source type) would pay that wait and ~5 aten
    ops.  Inside ``torch.compile`` a graph constant instead (the compiled code holds its
    own)."""
    if torch.compiler.is_compiling():
        return torch.tensor(values, dtype=dtype, device=device)
    return _shared_constant(values, device, dtype)


@functools.lru_cache(maxsize=64)
def _shared_constant(values: Tuple, device: torch.device, dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


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


def counts_of(keys: torch.Tensor, n: int) -> torch.Tensor:
    """How many of ``keys`` (in ``[0, n)``, any order) equal each ``i < n``, int64.  Off the
    CPU by an integer ``index_add_`` (exact in any order): ``bincount`` reads its input's
    largest key back to size its output (a device sync)."""
    if n + 1 > SEARCH_SEGMENTS:
        return torch.diff(ptr_of(keys, n))
    if keys.device.type == "cpu":
        return torch.bincount(keys, minlength=n)[:n]
    return counts_by_add(keys, n)


def counts_by_add(keys: torch.Tensor, n: int) -> torch.Tensor:
    """:func:`counts_of` without ``bincount`` (what runs off the CPU)."""
    ones = torch.ones(keys.numel(), dtype=torch.int64, device=keys.device)
    return torch.zeros(n, dtype=torch.int64, device=keys.device).index_add_(0, keys, ones)


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


def take_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` along dim 0.  Rows of 16 bytes or fewer are read as elements through
    ``torch.take`` on flat positions: on the H200 (torch 2.11) ``index_select``, advanced
    indexing and ``torch.gather`` of such narrow rows each took 1.84 ms for 3.06M fp32 rows of
    4 (HGT's relation prior onto mag's compact rows), where ~0.03 ms was due (0.07 ms in
    bf16); ``torch.take`` took too little to show in the step's profile."""
    width = t[0].numel() if t.dim() > 1 and t.shape[0] else 0
    if t.dim() == 1 or width == 0 or width * t.element_size() > 16:
        return t.index_select(0, index)
    pos = torch.arange(width, device=index.device).add(index.long().view(-1, 1), alpha=width)
    return torch.take(t.reshape(t.shape[0], width), pos).view(
        (index.shape[0],) + tuple(t.shape[1:]))


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


def relation_order(etype: torch.Tensor, num_relations: int) -> torch.Tensor:
    """:func:`canonical_order` of edges given sorted by (destination, relation), as the
    loader's sampler lists them: a stable sort by relation alone then keeps each relation's
    edges by destination, ties in input order."""
    return small_key_order(etype, num_relations)


def small_key_order(key: torch.Tensor, bound: int) -> torch.Tensor:
    """The permutation of a stable sort of ``key`` (values in ``[0, bound)``), sorted in the
    narrowest dtype that holds it: a stable sort of 8-bit keys is ~4x faster than of 32-bit
    ones (CPU, 70K edges), and on CUDA one radix pass instead of four."""
    return stable_argsort(key.to(torch.uint8) if bound <= 256 else sort_key(key, bound))


def csr_of_sorted_input(src: torch.Tensor, dst: torch.Tensor, perm: torch.Tensor,
                        num_nodes: int) -> CSR:
    """The CSR by destination of edges given sorted by (destination, relation) (``src``,
    ``dst`` in input order; ``perm``: canonical position -> input position).  What
    :func:`csr` of the canonical arrays returns, without its sort: a stable sort by
    destination of the canonical order lists each destination's edges by relation, then
    input order, which is the input order itself; so each entry is an input edge, and its
    ``eid`` the edge's canonical position (``perm`` inverted)."""
    eid = torch.empty_like(perm).scatter_(
        0, perm, torch.arange(perm.numel(), dtype=perm.dtype, device=perm.device))
    return CSR(ptr=sorted_ptr(dst, num_nodes), col=src, eid=eid)


def csr(row: torch.Tensor, col: torch.Tensor, num_nodes: int) -> CSR:
    """CSR over ``row`` of edges given in canonical order (a stable sort keeps relation order
    inside each row)."""
    ordered, order = torch.sort(sort_key(row, num_nodes), stable=True)
    return CSR(ptr=sorted_ptr(ordered, num_nodes), col=take(col, order), eid=order)


@dataclass(frozen=True, eq=False)
class CompactRuns:
    """A compact map before its row count is read: the keys ``etype * N + node`` (``ordered``:
    sorted, with ``perm`` sorted position -> edge, or ``perm`` None: sorted already or in edge
    order), each key's row (``run``, int64, aligned with ``ordered``) and the rows per
    relation ``rel_ptr [R + 1]`` (its last entry is the row count), all on the device."""
    ordered: torch.Tensor
    perm: Optional[torch.Tensor]
    run: torch.Tensor
    rel_ptr: torch.Tensor


#: Up to this many possible keys per edge (``R * N / E``), an unsorted compact map is found by
#: marking the keys present in a table of every possible key (a counting pass) instead of a
#: sort: O(R * N + E), against a sort of E keys (CPU, a 70K-edge mini-batch block with R * N
#: = 160K: 0.7 ms against 1.3 ms for the sort alone).
PRESENCE_KEYS_PER_EDGE = 4
#: ... and always up to this many possible keys (small graphs).
PRESENCE_MIN_KEYS = 2 ** 16


def compact_runs(node: torch.Tensor, etype: torch.Tensor, num_nodes: int, num_relations: int,
                 keys_sorted: bool) -> CompactRuns:
    """Everything of a compact map that needs no host read: ``unique`` reads its output size
    back (a device sync per map, two per mini-batch block), so the rows are found as runs of
    equal sorted keys and sized later, with the other sizes of a build, in one read.
    ``keys_sorted``: ``etype * N + node`` is already non-decreasing (true for destinations in
    canonical order), so no sort runs; otherwise, when the key range is small next to the edge
    count, no sort either (see :data:`PRESENCE_KEYS_PER_EDGE`)."""
    n = max(num_nodes, 1)
    bound = max(num_relations, 1) * n
    wide = etype * n + node
    if not keys_sorted and bound < INT32_LIMIT and \
            bound <= max(PRESENCE_KEYS_PER_EDGE * wide.numel(), PRESENCE_MIN_KEYS):
        return _compact_runs_by_presence(wide, n, num_relations, bound)
    key = sort_key(wide, bound)
    ordered, perm = (key, None) if keys_sorted else torch.sort(key)
    new = torch.ones(key.numel(), dtype=torch.int64, device=key.device)
    if key.numel() > 1:
        new[1:] = (ordered[1:] != ordered[:-1]).to(torch.int64)
    seen = torch.zeros(key.numel() + 1, dtype=torch.int64, device=key.device)
    torch.cumsum(new, 0, out=seen[1:])           # seen[p]: distinct keys among the first p
    # Relation r's rows start at the first key >= r * N: the distinct keys before it.
    cut = torch.arange(num_relations + 1, dtype=key.dtype, device=key.device) * n
    rel_ptr = seen.index_select(0, torch.searchsorted(ordered, cut))
    return CompactRuns(ordered, perm, seen[1:] - 1, rel_ptr)


def _compact_runs_by_presence(key: torch.Tensor, n: int, num_relations: int,
                              bound: int) -> CompactRuns:
    """:func:`compact_runs` of unsorted int64 keys in ``[0, bound)`` by a counting pass: mark
    each key present in a ``bound``-entry table; a key's row is the number of present keys
    below it (a cumsum of the table), which is its rank among the distinct keys, as the sort
    would give.  Keys stay in edge order (``perm`` None)."""
    below = torch.zeros(bound + 1, dtype=torch.int64, device=key.device)
    below.index_fill_(0, key + 1, 1)                # below[k + 1] = 1: key k is present
    below = torch.cumsum(below, 0)                  # below[k]: distinct keys < k
    cut = torch.arange(num_relations + 1, dtype=torch.int64, device=key.device) * n
    return CompactRuns(key, None, below.index_select(0, key), below.index_select(0, cut))


def compact_from_runs(runs: CompactRuns, num_rows: int, num_nodes: int,
                      pad_key: Optional[torch.Tensor] = None) -> CompactMap:
    """The compact map of :func:`compact_runs` once its row count is known on the host: what
    ``torch.unique(key, sorted=True, return_inverse=True)`` gives, value for value.  With
    ``pad_key`` (``[num_rows]`` int64 keys, read only), ``num_rows`` is a capacity (a bound on
    the row count, which stays on the device in ``rel_ptr[-1]``): rows past the real ones
    hold their entry of it."""
    n = max(num_nodes, 1)
    # Every key of a run is the same value, so which one lands in the row does not matter.
    uniq = (runs.ordered.new_empty(num_rows) if pad_key is None
            else pad_key.to(runs.ordered.dtype, copy=True)).scatter_(0, runs.run,
                                                                      runs.ordered)
    if runs.perm is None:
        edge_row = runs.run
    else:
        edge_row = torch.empty_like(runs.run).index_copy_(0, runs.perm, runs.run)
    rel = torch.div(uniq, n, rounding_mode="floor")
    return CompactMap(node=uniq - rel * n, rel=rel, rel_ptr=runs.rel_ptr, edge_row=edge_row)


def type_ptr(node_type: torch.Tensor, num_node_types: int):
    """(ptr [T+1], 0-d bool: are the types contiguous id ranges, i.e. non-decreasing?), both
    left on the device so that a build reads them with its other sizes.  ``ptr`` is right
    only when they are (off the CPU it is a binary search of the sorted types, which needs no
    read, where ``bincount`` reads the largest type back); otherwise see
    :func:`regroup_types`."""
    if node_type.numel() > 1:
        contiguous = (node_type[1:] >= node_type[:-1]).all()
    else:
        contiguous = torch.ones((), dtype=torch.bool, device=node_type.device)
    return sorted_ptr(node_type, num_node_types), contiguous


def regroup_types(node_type: torch.Tensor, num_node_types: int):
    """(ptr [T+1], perm [N]) for node types that are not contiguous: the nodes grouped by
    type by one stable sort, whose sorted types give the pointers."""
    ordered, perm = torch.sort(node_type, stable=True)
    return sorted_ptr(ordered, num_node_types), perm


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


#: Without a cap, a build planning at most this many bytes is not checked against the free
#: memory: reading it (/proc/meminfo on the CPU, the driver on CUDA) cost a mini-batch block
#: ~20 us of its ~450 us build (CPU), and a device with less free than this could not run a
#: layer on the graph anyway.
SMALL_BUILD_BYTES = 64 * 2 ** 20


def check_build_memory(num_nodes: int, num_edges: int, num_relations: int,
                       device: torch.device) -> None:
    """Refuse, before allocating anything, a build that needs more memory than
    ``$HECTOR_MAX_GRAPH_BYTES`` allows or, when that is unset, than ``device`` has free."""
    import os
    need = build_nbytes(num_nodes, num_edges, num_relations)
    text = os.environ.get(ENV_MAX_BUILD_BYTES)
    if not text and need <= SMALL_BUILD_BYTES:
        return
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
