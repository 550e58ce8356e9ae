"""The traversal op in plain PyTorch (CPU, and the tests' reference)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .csr import WeightedCSR


def traverse_torch(m: WeightedCSR, x: torch.Tensor, addends: Sequence[torch.Tensor] = (),
                   coefs: Sequence[float] = (), bias: Optional[torch.Tensor] = None
                   ) -> torch.Tensor:
    """``out = m @ x + sum_i coefs[i] * addends[i] + bias`` with fp32 accumulation, stored in
    ``x``'s dtype; ``x`` is ``[cols, ...]`` and the output ``[rows, ...]``."""
    flat = x.reshape(x.shape[0], -1).float()
    out = torch.sparse.mm(m.to_sparse(), flat) if m.nnz else flat.new_zeros(m.rows, flat.shape[1])
    for a, c in zip(addends, coefs):
        out = out + c * a.reshape(m.rows, -1).float()
    if bias is not None:
        out = out + bias.reshape(1, -1).float()
    return out.to(x.dtype).reshape((m.rows,) + tuple(x.shape[1:]))
