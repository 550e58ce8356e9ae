"""The count facts in plain torch ops (the CPU's path and the kernel's reference)."""
from __future__ import annotations

import torch


def _long(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 else t.long()


def bin_facts_torch(ptr: torch.Tensor, short_max: int, chunk: int) -> torch.Tensor:
    counts = torch.diff(_long(ptr))
    is_short = counts <= short_max
    # Each long row's length (0 for a short one) serves the long total, the short rows'
    # lengths (what it leaves) and the chunk count (a short row makes none).
    long_len = counts.masked_fill(is_short, 0)
    return torch.stack([is_short.sum(), (counts - long_len).max(), long_len.sum(),
                        counts.max(), ((long_len + (chunk - 1)) // chunk).sum()])


def degree_facts_torch(degrees: torch.Tensor, threshold: int) -> torch.Tensor:
    d = _long(degrees)
    return torch.stack([d.sum(), torch.dot(d, d), d.max(), torch.count_nonzero(d),
                        (d >= threshold).sum()])
