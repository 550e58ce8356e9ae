"""CSR row pointers, shared by every kernel family's torch reference and index building."""
from __future__ import annotations

from typing import Optional

import torch


def rows_of_entries(ptr: torch.Tensor, nnz: Optional[int] = None) -> torch.Tensor:
    """``[nnz]`` int64: the row of each entry of a CSR with row pointer ``ptr`` (on ``ptr``'s
    device).  ``nnz`` (``ptr[-1]``), when the caller knows it, saves a host read."""
    return torch.repeat_interleave(torch.arange(ptr.numel() - 1, device=ptr.device),
                                   ptr[1:] - ptr[:-1], output_size=nnz)
