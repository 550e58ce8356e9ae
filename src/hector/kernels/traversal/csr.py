"""Weighted CSRs of data movements, and their composition.

A gather (``out[m] = x[idx[m]]``), a scatter (``out[o] = sum_{idx[m] = o} x[m]``), their mean
variants and a constant scale are each a sparse matrix with one entry per row moved.  A chain
of them is their product: composed once per graph, it becomes one CSR whose entries are the
distinct (output row, input row) pairs with their summed weights -- RGCN's gather to edges,
mean per (dst, relation) and sum per destination become one entry per (dst, compact source
row), and no edge-sized intermediate is ever formed at run time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ...graph.build import sort_key, sorted_ptr
from ..ptr import rows_of_entries
from .schedule import PendingBins, RowBins, row_bins


@dataclass(frozen=True, eq=False)
class WeightedCSR:
    """``rows x cols`` sparse matrix: ``ptr [rows + 1]`` (int64), ``col [nnz]`` (int32 when it
    fits), ``val [nnz]`` (fp32); ``bins``: its rows split by length for the kernels
    (:mod:`.schedule`), found when it is built so that a launch reads nothing on the host;
    ``partition``: every column is in exactly one entry (a scatter), which composition uses
    to know its size without reading it."""
    ptr: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor
    rows: int
    cols: int
    bins: Optional[RowBins] = None
    partition: bool = False

    @property
    def layout(self) -> RowBins:
        """``bins``, or for a CSR built by hand, made on first use and kept."""
        if self.bins is None:
            object.__setattr__(self, "bins", row_bins(self.ptr))
        return self.bins

    @property
    def nnz(self) -> int:
        return int(self.col.numel())

    def transpose(self) -> "WeightedCSR":
        """The transposed CSR (by source for the backward), built with torch ops once."""
        return from_coo(self.col.long(), self.row_ids(), self.val, self.cols, self.rows,
                        distinct=True, col_sorted=True)

    def row_ids(self) -> torch.Tensor:
        """``[nnz]`` int64 row of each entry."""
        return rows_of_entries(self.ptr, self.nnz)

    def to_sparse(self) -> torch.Tensor:
        return torch.sparse_coo_tensor(torch.stack([self.row_ids(), self.col.long()]), self.val,
                                       (self.rows, self.cols), check_invariants=True).coalesce()


def resolve_layouts(csrs: Sequence[WeightedCSR]) -> None:
    """Give every CSR of ``csrs`` without row bins its bins, with ONE host read for all
    (:attr:`WeightedCSR.layout` reads once per CSR, a device sync each on CUDA): what a plan
    calls with the CSRs its traversal steps will launch, before the first of them runs."""
    todo = list({id(m): m for m in csrs if m.bins is None}.values())
    pending = [PendingBins.of(m.ptr) for m in todo]
    facts = [p.facts for p in pending if p.facts is not None]
    values = torch.cat(facts).tolist() if facts else []
    for m, p in zip(todo, pending):
        n = 0 if p.facts is None else p.facts.numel()
        object.__setattr__(m, "bins", p.finish(values[:n]))
        values = values[n:]


def from_coo(row: torch.Tensor, col: torch.Tensor, val: Optional[torch.Tensor],
             rows: int, cols: int, distinct: bool = False,
             col_sorted: bool = False) -> WeightedCSR:
    """CSR of the entries ``(row[j], col[j], val[j])``, ``val`` None = 1; entries of one row
    ordered by column.  Duplicates are summed in input order (a sequential fp32 sum, the same
    on every device and run); ``distinct``: the caller knows no (row, col) repeats, which
    saves the duplicate search (one host read); ``col_sorted``: the caller knows ``col`` is
    non-decreasing (a transpose's, a scatter's ``arange``), so a stable sort by row alone
    orders the entries by (row, col), on a narrower key.  Ids are trusted (they come from a
    validated ``Graph``): nothing is read back to check them.

    One stable sort of the (row, col) key, no sparse tensor: torch's ``coalesce`` under
    ``check_invariants`` read every index back to validate it and sorted again (the largest
    host cost of a new mini-batch's first step)."""
    if row.dim() != 1 or col.shape != row.shape:
        raise ValueError(f"row and col must be 1-D of one length, got {tuple(row.shape)} and "
                         f"{tuple(col.shape)}")
    if val is not None and val.shape != row.shape:
        raise ValueError(f"val must have the shape of row {tuple(row.shape)}, got "
                         f"{tuple(val.shape)}")
    if rows < 0 or cols < 0:
        raise ValueError(f"rows and cols must be >= 0, got {rows} and {cols}")
    dev = row.device
    val = (torch.ones(row.shape[0], dtype=torch.float32, device=dev) if val is None
           else val.float())
    row, col = row.long(), col.long()
    if col_sorted:
        order = torch.sort(sort_key(row, rows), stable=True).indices
    else:
        order = _sort_by_row_col(row, col, rows, cols)
    row, col, val = (t.index_select(0, order) for t in (row, col, val))
    if not distinct and row.numel() > 1:
        return _merged(row, col, val, rows, cols)
    return _csr(row, col, val, rows, cols)


def from_groups(ptr: torch.Tensor, perm: torch.Tensor, val: Optional[torch.Tensor],
                rows: int, cols: int) -> WeightedCSR:
    """The scatter of ``cols`` rows into ``rows`` rows given as groups: row ``i`` holds the
    entries ``(i, perm[p], val[perm[p]])`` for ``p`` in ``ptr[i]:ptr[i + 1]`` (``perm``
    ascending within each group; ``val`` None = 1).  What :func:`from_coo` of ``(row of each
    column, arange(cols), val)`` with ``distinct`` gives, without its sort, for a caller
    that holds the grouping (a graph's CSR, or a sort kept per graph)."""
    if ptr.shape != (rows + 1,) or perm.shape != (cols,):
        raise ValueError(f"ptr must be [rows + 1] = [{rows + 1}] and perm [cols] = [{cols}], "
                         f"got {tuple(ptr.shape)} and {tuple(perm.shape)}")
    val = (torch.ones(cols, dtype=torch.float32, device=perm.device) if val is None
           else val.float().index_select(0, perm))
    return WeightedCSR(ptr, narrow_cols(perm, cols), val.contiguous(), rows, cols,
                       partition=True)


def one_per_row(col: torch.Tensor, val: Optional[torch.Tensor], cols: int) -> WeightedCSR:
    """The CSR with exactly one entry per row, ``(j, col[j], val[j])`` (a gather): what
    :func:`from_coo` gives for rows ``0..n-1``, without its sort."""
    n = col.numel()
    ptr = torch.arange(n + 1, device=col.device)
    val = torch.ones(n, dtype=torch.float32, device=col.device) if val is None else val.float()
    # Every row is short, of one entry: the bins are known without reading the device.
    bins = RowBins(n, 0, None, None, min(n, 1), 0.0)
    return WeightedCSR(ptr, narrow_cols(col, cols), val.contiguous(), n, cols, bins)


def _sort_by_row_col(row: torch.Tensor, col: torch.Tensor, rows: int,
                     cols: int) -> torch.Tensor:
    """Stable permutation ordering entries by (row, col): one sort of ``row * cols + col``
    when that key fits int64 (any ``rows * cols < 2^63``), else two stable sorts."""
    span = rows * max(cols, 1)
    if span < 2 ** 63:
        return torch.sort(sort_key(row * max(cols, 1) + col, span), stable=True).indices
    by_col = torch.sort(col, stable=True).indices
    return by_col.index_select(0, torch.sort(row.index_select(0, by_col), stable=True).indices)


def _merged(row: torch.Tensor, col: torch.Tensor, val: torch.Tensor, rows: int,
            cols: int) -> WeightedCSR:
    """The CSR of entries sorted by (row, col) with equal neighbours merged, each run of
    equal keys summed left to right (sequentially, in the order given).  Its one host read
    also takes the row bins: a merged CSR is a chain's product, the one a launch reads."""
    n, dev = row.numel(), row.device
    new = torch.ones(n, dtype=torch.bool, device=dev)
    new[1:] = (row[1:] != row[:-1]) | (col[1:] != col[:-1])
    seen = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    torch.cumsum(new, 0, out=seen[1:])                  # seen[p]: runs among the first p
    run = seen[1:] - 1                                  # each entry's run of equal keys
    at = torch.arange(n, device=dev)
    first = torch.cummax(torch.where(new, at, 0), 0).values     # where that run starts
    # The merged rows' pointers before their count is known: the runs begun before each
    # row's first entry.  So the sizes and the bins' facts are one read (a device sync).
    ptr = seen.index_select(0, sorted_ptr(row, rows))
    bins = PendingBins.of(ptr)
    sizes = torch.stack([seen[-1], (at - first).max() + 1])
    values = torch.cat([sizes, bins.facts]).tolist()    # (rows > 0: row has entries)
    distinct, longest = values[:2]
    if distinct < n:
        starts = torch.full((distinct,), n, device=dev).scatter_reduce_(0, run, at, "amin")
        counts = torch.diff(starts, append=torch.full((1,), n, device=dev))  # (no copy)
        total = val.index_select(0, starts)
        # One pass per repeat: O(distinct x longest run), with no atomics (a fixed order on
        # every device); runs are short in practice (parallel edges, paths between two rows).
        last = n - 1
        for k in range(1, longest):
            more = val.index_select(0, (starts + k).clamp_(max=last))
            total = torch.where(counts > k, total + more, total)
        row, col, val = row.index_select(0, starts), col.index_select(0, starts), total
    return WeightedCSR(ptr, narrow_cols(col, cols), val.contiguous(), rows, cols,
                       bins.finish(values[2:]))


def _csr(row: torch.Tensor, col: torch.Tensor, val: torch.Tensor, rows: int,
         cols: int) -> WeightedCSR:
    """The CSR of entries already sorted by (row, col) and distinct.  Its row bins (a host
    read) are found on first use (:attr:`WeightedCSR.layout`): a factor that is only composed
    into a longer chain is never launched, so never pays that read."""
    ptr = sorted_ptr(row, rows)
    return WeightedCSR(ptr, narrow_cols(col, cols), val.contiguous(), rows, cols)


def narrow_cols(col: torch.Tensor, cols: int) -> torch.Tensor:
    """Column ids as the kernels read them: int32 when they fit."""
    return col.to(torch.int32 if cols < 2 ** 31 else torch.int64).contiguous()


def compose(outer: WeightedCSR, inner: WeightedCSR) -> WeightedCSR:
    """``outer @ inner`` (apply ``inner`` first): every path ``i -> k -> j`` of the two CSRs
    as an entry ``(i, j, outer[i, k] * inner[k, j])``, listed by ``i``, then ``k``, then
    ``j``, and merged by :func:`from_coo` (so each entry sums its paths in ``k`` order: what
    torch's CPU sparse product does, bit for bit)."""
    if outer.cols != inner.rows:
        raise ValueError(f"cannot compose a {outer.rows}x{outer.cols} movement after a "
                         f"{inner.rows}x{inner.cols} one")
    if outer.partition and inner.partition:
        return _compose_scatters(outer, inner)
    dev = outer.ptr.device
    k = outer.col.long()
    if _one_per_row(inner):      # a gather first: each outer entry is one path, through k
        val = outer.val * inner.val.index_select(0, k)
        return from_coo(outer.row_ids(), inner.col.long().index_select(0, k), val,
                        outer.rows, inner.cols)
    first = inner.ptr.index_select(0, k)
    per = inner.ptr.index_select(0, k + 1) - first          # paths through each outer entry
    ends = torch.cumsum(per, 0)
    n = int(ends[-1]) if ends.numel() else 0                # (one host read: the path count)
    which = torch.repeat_interleave(torch.arange(k.numel(), device=dev), per, output_size=n)
    at = (torch.arange(n, device=dev) - (ends - per).index_select(0, which)
          + first.index_select(0, which))                    # entry of inner on each path
    row = outer.row_ids().index_select(0, which)
    val = outer.val.index_select(0, which) * inner.val.index_select(0, at)
    return from_coo(row, inner.col.long().index_select(0, at), val, outer.rows, inner.cols)


def _compose_scatters(outer: WeightedCSR, inner: WeightedCSR) -> WeightedCSR:
    """:func:`compose` of two scatters (RGCN's mean per (destination, relation), then the
    sum per destination): each column reaches one row by one path, so the product is a
    scatter with an entry per column, sized without a read and with nothing to merge (what
    a capacity block's traversal needs; an ordinary graph saves the read too)."""
    first = _entry_of_col(inner)                        # the inner entry of each column
    entry = _entry_of_col(outer).index_select(0, inner.row_ids().index_select(0, first))
    val = outer.val.index_select(0, entry) * inner.val.index_select(0, first)
    m = from_coo(outer.row_ids().index_select(0, entry), torch.arange(inner.cols,
                 device=inner.ptr.device), val, outer.rows, inner.cols, distinct=True,
                 col_sorted=True)
    return WeightedCSR(m.ptr, m.col, m.val, m.rows, m.cols, m.bins, partition=True)


def _entry_of_col(m: WeightedCSR) -> torch.Tensor:
    """``[cols]`` int64: the entry holding each column of a partition (one each)."""
    out = torch.empty(m.cols, dtype=torch.int64, device=m.ptr.device)
    return out.index_copy_(0, m.col.long(), torch.arange(m.nnz, device=m.ptr.device))


def _one_per_row(m: WeightedCSR) -> bool:
    """Whether every row of ``m`` holds exactly one entry, from host facts only: bins already
    known (a gather's are, see :func:`one_per_row`) with no row over one entry, and as many
    entries as rows."""
    b = m.bins
    return b is not None and b.num_long == 0 and b.short_max <= 1 and m.nnz == m.rows


def scaled(m: WeightedCSR, factor: float) -> WeightedCSR:
    return WeightedCSR(m.ptr, m.col, m.val * factor, m.rows, m.cols, m.bins, m.partition)
