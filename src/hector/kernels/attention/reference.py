"""Plain-PyTorch twin of the fused attention kernels: the CPU path and the reference every
Triton kernel is tested against.

On the CPU the attention matrix of each head is a sparse CSR matrix (:mod:`.csr`): the
aggregation is one sparse-dense product, the q.k scores and the gradient of the weights are
sampled dense-dense products (SDDMM), and the backward is written by hand from the forward's
weights, so no ``[E, H, D]`` message tensor is ever built (that is where the edge-wise
version spent its time).  Off the CPU the edge-wise version (per-edge gathers, scatter-based segment softmax,
autograd from torch) remains: the sparse kernels there are untested."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from . import csr

_MASK32 = 0xFFFFFFFF
#: Multipliers of the "lowbias32" integer finaliser (C. Wellons); shared with the Triton code.
HASH_MUL1 = 0x7FEB352D
HASH_MUL2 = 0x846CA68B


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2^32 without int64 overflow: torch has no wrapping uint32 multiply, and
    # x * c can reach 2^64, so split c into 16-bit halves (each product stays below 2^48).
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, HASH_MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, HASH_MUL2)
    return x ^ (x >> 16)


def dropout_threshold(p: float) -> int:
    """Keep an (edge, head) when its 24-bit hash is >= this; integer so that both backends
    compare exactly the same numbers (no float rounding of ``p`` in two places)."""
    return min(int(round(p * (1 << 24))), 1 << 24)


def dropout_keep(seed, eid: torch.Tensor, heads: int, p: float) -> torch.Tensor:
    """``[len(eid), heads]`` bool keep-mask of canonical edges ``eid``: a counter-based hash of
    (seed, edge id, head), so forward, backward and both backends draw the same mask without
    storing it.  Bit-identical to ``dropout_keep`` in kernels/templates/_macros.py.j2.
    ``seed``: an int, or a one-element integer tensor (read on the device, no sync)."""
    h = torch.arange(heads, device=eid.device, dtype=torch.int64)
    x = (eid.to(torch.int64)[:, None] * heads + h[None, :]) & _MASK32
    if isinstance(seed, torch.Tensor):
        seed = seed.to(device=eid.device, dtype=torch.int64).reshape(())
    x = _mix32(_mix32(x) ^ (seed & 0x7FFFFFFF))
    return (x >> 8) >= dropout_threshold(p)


def edge_scores(graph, heads: int, q=None, k=None, a_src=None, a_dst=None, scale: float = 1.0,
                negative_slope: Optional[float] = None, dtype=torch.float32) -> torch.Tensor:
    """``[E, H]`` scores in canonical edge order (before the softmax); all zero (a plain mean
    over each row) when no term is given."""
    src, dst = graph.src.long(), graph.dst.long()
    s = torch.zeros(graph.num_edges, heads, dtype=dtype, device=graph.device)
    if q is not None:
        s = s + scale * (q.to(dtype)[dst] * k.to(dtype)[src]).sum(-1)
    if a_src is not None:
        s = s + a_src.to(dtype)[src]
    if a_dst is not None:
        s = s + a_dst.to(dtype)[dst]
    if negative_slope is not None:
        s = F.leaky_relu(s, negative_slope)
    return s


def segment_softmax(scores: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Softmax of ``scores`` [E, H] over the edges sharing a destination."""
    heads = scores.shape[1]
    idx = dst[:, None].expand(-1, heads)
    # The row max only stabilises exp(); softmax does not depend on it, so no gradient.
    row_max = torch.full((num_nodes, heads), float("-inf"), dtype=scores.dtype,
                         device=scores.device).scatter_reduce(0, idx, scores.detach(), "amax")
    p = torch.exp(scores - row_max[dst])
    denom = torch.zeros(num_nodes, heads, dtype=scores.dtype, device=scores.device)
    denom = denom.index_add(0, dst, p)
    return p / denom[dst]


def edge_attention_torch(graph, v: torch.Tensor, q=None, k=None, a_src=None, a_dst=None,
                         scale: float = 1.0, negative_slope: Optional[float] = None,
                         dropout: float = 0.0, seed: Optional[int] = None) -> torch.Tensor:
    """Reference for :func:`hector.kernels.attention.op.edge_attention` (inputs already validated).
    Accumulates in float32 (float64 for float64 inputs) and returns ``v.dtype``."""
    acc = torch.float64 if v.dtype == torch.float64 else torch.float32
    # Under torch.compile the edge-wise form is traced instead (dynamo cannot create sparse
    # tensors, and inductor fuses the gathers and scatters itself); a graph without nodes
    # too (the sparse layout's [0, -1] views are undefined).
    if v.device.type != "cpu" or v.shape[0] == 0 or torch.compiler.is_compiling():
        return _edge_attention_gather(graph, v, q, k, a_src, a_dst, scale, negative_slope,
                                      dropout, seed, acc)
    heads = v.shape[1]
    layout = csr.layout(graph, heads)
    drop_scale = None
    if dropout > 0.0:
        keep = dropout_keep(seed, torch.arange(graph.num_edges), heads, dropout)
        drop_scale = keep.reshape(-1).index_select(0, layout.keep_index).to(acc) / (1.0 - dropout)
    cast = [None if t is None else t.to(acc) for t in (v, q, k, a_src, a_dst)]
    out = csr.CsrAttention.apply(layout, *cast, float(scale), negative_slope, drop_scale)
    return out.to(v.dtype)


def _edge_attention_gather(graph, v, q, k, a_src, a_dst, scale, negative_slope, dropout, seed,
                           acc):
    """The edge-wise formulation: ``[E, H]`` scores by gathers, softmax by scatters,
    ``[E, H, Dv]`` messages summed by ``index_add``; torch's autograd does the backward."""
    n, heads, dim_v = v.shape
    src, dst = graph.src.long(), graph.dst.long()
    s = edge_scores(graph, heads, q, k, a_src, a_dst, scale, negative_slope, acc)
    alpha = segment_softmax(s, dst, n)
    if dropout > 0.0:
        eid = torch.arange(graph.num_edges, device=v.device)
        keep = dropout_keep(seed, eid, heads, dropout)
        alpha = torch.where(keep, alpha / (1.0 - dropout), torch.zeros_like(alpha))
    out = torch.zeros(n, heads, dim_v, dtype=acc, device=v.device)
    out = out.index_add(0, dst, alpha[:, :, None] * v.to(acc)[src])
    return out.to(v.dtype)
