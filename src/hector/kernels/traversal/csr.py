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
from typing import Optional

import warnings

import torch

from .schedule import RowBins, row_bins


@dataclass(frozen=True, eq=False)
class WeightedCSR:
    """``rows x cols`` sparse matrix: ``ptr [rows + 1]`` (int64), ``col [nnz]`` (int32 when it
    fits), ``val [nnz]`` (fp32); ``bins``: its rows split by length for the kernels
    (:mod:`.schedule`), found when it is built so that a launch reads nothing on the host."""
    ptr: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor
    rows: int
    cols: int
    bins: Optional[RowBins] = None

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
        counts = self.ptr[1:] - self.ptr[:-1]
        row = torch.repeat_interleave(torch.arange(self.rows, device=self.ptr.device), counts)
        return from_coo(self.col.long(), row, self.val, self.cols, self.rows)

    def to_sparse(self) -> torch.Tensor:
        counts = self.ptr[1:] - self.ptr[:-1]
        row = torch.repeat_interleave(torch.arange(self.rows, device=self.ptr.device), counts)
        return torch.sparse_coo_tensor(torch.stack([row, self.col.long()]), self.val,
                                       (self.rows, self.cols), check_invariants=True).coalesce()


def from_coo(row: torch.Tensor, col: torch.Tensor, val: Optional[torch.Tensor],
             rows: int, cols: int) -> WeightedCSR:
    """CSR of the entries ``(row[j], col[j], val[j])``; duplicates summed, ``val`` None = 1."""
    if val is None:
        val = torch.ones(row.shape[0], dtype=torch.float32, device=row.device)
    sp = torch.sparse_coo_tensor(torch.stack([row.long(), col.long()]), val.float(),
                                 (rows, cols), check_invariants=True).coalesce()
    return _from_sparse(sp)


def _from_sparse(sp: torch.Tensor) -> WeightedCSR:
    rows, cols = sp.shape
    idx = sp.indices()
    counts = torch.bincount(idx[0], minlength=rows)
    ptr = torch.zeros(rows + 1, dtype=torch.int64, device=idx.device)
    torch.cumsum(counts, 0, out=ptr[1:])
    col_dtype = torch.int32 if cols < 2 ** 31 else torch.int64
    return WeightedCSR(ptr, idx[1].to(col_dtype).contiguous(), sp.values().float().contiguous(),
                       rows, cols, row_bins(ptr))


def compose(outer: WeightedCSR, inner: WeightedCSR) -> WeightedCSR:
    """``outer @ inner`` (apply ``inner`` first)."""
    if outer.cols != inner.rows:
        raise ValueError(f"cannot compose a {outer.rows}x{outer.cols} movement after a "
                         f"{inner.rows}x{inner.cols} one")
    with warnings.catch_warnings():   # torch notes that its sparse product is "beta"
        warnings.simplefilter("ignore", UserWarning)
        product = torch.sparse.mm(outer.to_sparse(), inner.to_sparse())
    return _from_sparse(product.coalesce())


def scaled(m: WeightedCSR, factor: float) -> WeightedCSR:
    return WeightedCSR(m.ptr, m.col, m.val * factor, m.rows, m.cols, m.bins)
