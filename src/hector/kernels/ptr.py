"""CSR row pointers, shared by every kernel family's torch reference and index building."""
from __future__ import annotations

from typing import Optional, Tuple

import torch


def rows_of_entries(ptr: torch.Tensor, nnz: Optional[int] = None) -> torch.Tensor:
    """``[nnz]`` int64: the row of each entry of a CSR with row pointer ``ptr`` (on ``ptr``'s
    device).  ``nnz`` (``ptr[-1]``), when the caller knows it, saves a host read."""
    return torch.repeat_interleave(torch.arange(ptr.numel() - 1, device=ptr.device),
                                   ptr[1:] - ptr[:-1], output_size=nnz)


def split_rows(ptr: torch.Tensor, limit: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(``piece_ptr [P + 1]``, ``row_of [P]`` int64): the rows of a CSR cut into pieces of at
    most ``limit`` entries, in order (a row of ``n`` entries into ``ceil(n / limit)``, an
    empty row into none), over the same entry arrays: piece ``j`` holds the entries
    ``piece_ptr[j]:piece_ptr[j + 1]`` of row ``row_of[j]``.  A kernel that walks its rows'
    entries in lockstep (the segment GEMM's CSR prologue and epilogue) then never walks a
    hub alone; where the rows' sums only meet linearly afterwards (added into output rows,
    or into a weight gradient), the pieces give the same result.  One host read (the piece
    count)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    length = ptr[1:] - ptr[:-1]
    pieces = (length + limit - 1) // limit
    row_of = torch.repeat_interleave(torch.arange(length.numel(), device=ptr.device), pieces)
    first = torch.cumsum(pieces, 0) - pieces              # first piece of each row
    k = torch.arange(row_of.numel(), device=ptr.device) - first.index_select(0, row_of)
    start = ptr.index_select(0, row_of) + k * limit
    return torch.cat([start, ptr[-1:]]), row_of
