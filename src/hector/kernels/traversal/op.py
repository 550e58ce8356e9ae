"""``traverse``: the public entry of the traversal kernels (checks, then a backend)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ...checks import check_tensor
from ...device import choose_backend
from .csr import WeightedCSR
from .launch import edge_softmax_triton, traverse_triton
from .reference import edge_softmax_torch, traverse_torch
from .spec import MAX_ADDENDS


def traverse(m: WeightedCSR, x: torch.Tensor, addends: Sequence[torch.Tensor] = (),
             coefs: Optional[Sequence[float]] = None, bias: Optional[torch.Tensor] = None,
             backend: str = "auto") -> torch.Tensor:
    """``out[r] = sum_{j in row r of m} m.val[j] * x[m.col[j]] + sum_i coefs[i] * addends[i][r]
    + bias``: rows of ``x`` gathered, weighted and summed per output row by one node-parallel
    kernel (fp32 accumulation, output in ``x``'s dtype).

    ``m``: a :class:`~hector.kernels.traversal.csr.WeightedCSR` ``[rows, x.shape[0]]``;
    ``addends``: tensors shaped like the output; ``coefs``: one float each (default 1);
    ``bias``: as many elements as one output row."""
    if not isinstance(m, WeightedCSR):
        raise TypeError(f"m must be a WeightedCSR, got {type(m).__name__}")
    x = check_tensor(x, "x")
    if x.dim() < 2 or x.shape[0] != m.cols:
        raise ValueError(f"x must be [{m.cols}, ...] (one row per column of m), "
                         f"got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor, got {x.dtype}")
    addends = tuple(addends)
    coefs = tuple(1.0 for _ in addends) if coefs is None else tuple(float(c) for c in coefs)
    if len(coefs) != len(addends):
        raise ValueError(f"coefs must have one entry per addend ({len(addends)}), "
                         f"got {len(coefs)}")
    if len(addends) > MAX_ADDENDS:
        raise ValueError(f"addends: at most {MAX_ADDENDS}, got {len(addends)}")
    out_shape = (m.rows,) + tuple(x.shape[1:])
    for i, a in enumerate(addends):
        a = check_tensor(a, f"addends[{i}]")
        if tuple(a.shape) != out_shape or a.device != x.device:
            raise ValueError(f"addends[{i}] must be {out_shape} on {x.device}, "
                             f"got {tuple(a.shape)} on {a.device}")
    width = int(torch.Size(x.shape[1:]).numel())
    if bias is not None:
        bias = check_tensor(bias, "bias")
        if bias.numel() != width or bias.device != x.device:
            raise ValueError(f"bias must have {width} elements on {x.device}, "
                             f"got {tuple(bias.shape)} on {bias.device}")
    if m.ptr.device != x.device:
        raise ValueError(f"m is on {m.ptr.device} but x on {x.device}")
    if choose_backend(backend, x, "x") == "torch":
        return traverse_torch(m, x, addends, coefs, bias)
    return traverse_triton(m, x, addends, coefs, bias)


def edge_softmax(graph, s: torch.Tensor, negative_slope: Optional[float] = None,
                 backend: str = "auto") -> torch.Tensor:
    """Softmax of the edge scores ``s [E, H, 1]`` (canonical edge order) over each
    destination's incoming edges, after ``leaky_relu(negative_slope)`` when given; on the
    Triton backend node-parallel kernels over ``graph.csr_in`` (the ``hector::edge_softmax``
    custom op, differentiable in ``s``)."""
    from ...graph import Graph   # (lazy: the graph package imports the kernels)
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a hector.Graph, got {type(graph).__name__}")
    s = check_tensor(s, "s")
    if s.device != graph.device:
        raise ValueError(f"s is on {s.device} but the graph on {graph.device}")
    if s.dim() < 2 or s.shape[0] != graph.num_edges:
        raise ValueError(f"s must be [num_edges={graph.num_edges}, ...], got {tuple(s.shape)}")
    if not s.is_floating_point():
        raise TypeError(f"s must be a floating tensor, got {s.dtype}")
    if negative_slope is not None and not isinstance(negative_slope, (int, float)):
        raise TypeError(f"negative_slope must be a number or None, got {negative_slope!r}")
    if choose_backend(backend, s, "s") == "torch":
        return edge_softmax_torch(graph.dst.long(), graph.num_nodes, s, negative_slope)
    return edge_softmax_triton(graph, s, negative_slope)
