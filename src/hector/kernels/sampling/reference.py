"""Floyd's algorithm over groups in torch ops: the reference of the ``floyd`` kernel, and what
runs on the CPU."""
from __future__ import annotations

from typing import Tuple

import torch


def floyd_table_torch(deg: torch.Tensor, k: torch.Tensor, width: int,
                      generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """See :func:`hector.kernels.sampling.floyd_table`; the random numbers are ``generator``'s."""
    n, dev = deg.numel(), deg.device
    picks = torch.zeros(n, width, dtype=torch.int64, device=dev)
    u = torch.rand(n, width, generator=generator, dtype=torch.float64, device=dev)
    for i in range(width):
        # (only rows with d > k and i < k keep these picks; j >= 0 there)
        j = deg - k + i
        t = (u[:, i] * (j + 1)).long()
        t = torch.minimum(t, j)           # (a product rounded up to j + 1)
        taken = (picks[:, :i] == t[:, None]).any(dim=1)
        picks[:, i] = torch.where(taken, j, t)
    lanes = torch.arange(width, device=dev)
    valid = lanes[None, :] < torch.minimum(deg, k)[:, None]
    # Rows with d > k sort their k picks (the lanes past k, unused, sort last as d);
    # rows with d <= k take every candidate in order.
    picks = torch.where(valid, picks, deg[:, None]).sort(dim=1).values
    picks = torch.where((deg <= k)[:, None], lanes.expand(n, width), picks)
    return picks, valid
