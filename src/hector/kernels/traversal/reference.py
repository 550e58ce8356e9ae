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


def edge_softmax_torch(dst: torch.Tensor, num_nodes: int, s: torch.Tensor,
                       negative_slope: Optional[float] = None) -> torch.Tensor:
    """Softmax of ``s [E, ...]`` over the edges sharing a destination (``dst [E]``), fp32."""
    x = s.float()
    if negative_slope is not None:
        x = torch.nn.functional.leaky_relu(x, negative_slope)
    idx = dst.view((-1,) + (1,) * (x.dim() - 1)).expand_as(x)
    mx = x.new_full((num_nodes,) + x.shape[1:], float("-inf"))
    mx = mx.scatter_reduce(0, idx, x.detach(), "amax")   # (a shift: no gradient needed)
    e = torch.exp(x - mx.index_select(0, dst))
    den = x.new_zeros((num_nodes,) + x.shape[1:]).index_add(0, dst, e)
    return (e / den.index_select(0, dst)).to(s.dtype)
