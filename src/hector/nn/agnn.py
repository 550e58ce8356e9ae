r"""AGNN (Thekumparampil et al. 2018), PyG ``AGNNConv`` semantics, on hector's fused attention."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..device import choose_backend
from ..kernels.attention.cosine import cosine_qk
from ..kernels.attention.op import edge_attention
from ..kernels.attention.spec import AttentionSpec
from ._common import (as_one_graph, check_backend, check_input, check_strategy, load_from_pyg,
                      resolve_graph, take_rows)
from ..compiler.warm import graphed


class AGNNConv(nn.Module):
    r"""Attention-based propagation:

    .. math::
        \alpha_{ij} = \mathrm{softmax}_j\big(\beta \cos(x_i, x_j)\big), \qquad
        x_i' = \sum_{j \in N(i)} \alpha_{ij} x_j

    Args:
        requires_grad: learn :math:`\beta` (else fixed at 1).
        add_self_loops: replace self loops by exactly one per node, as PyG does.
        strategy: ``"auto"``, ``"node"`` or ``"edge"``; backend: ``"auto"``, ``"triton"`` or ``"torch"``.

    Shapes: x ``[N, F]``, edge_index ``[2, E]`` or a ``hector.Graph`` -> ``[N, F]``; on a
    block (``hector.loader``) or with ``x = (x_src, x_dst)``: ``[num_dst, F]``.
    """

    def __init__(self, requires_grad: bool = True, add_self_loops: bool = True,
                 strategy: str = "auto", backend: str = "auto"):
        super().__init__()
        self.requires_grad, self.add_self_loops = requires_grad, add_self_loops
        self.strategy = check_strategy(strategy)
        self.backend = check_backend(backend)
        if requires_grad:
            self.beta = nn.Parameter(torch.ones(1))
        else:
            self.register_buffer("beta", torch.ones(1))

    def reset_parameters(self) -> None:
        if self.requires_grad:
            self.beta.data.fill_(1)

    @graphed
    def forward(self, x, edge_index):
        x, edge_index, _, rows, loops = as_one_graph(x, edge_index,
                                                     add_self_loops=self.add_self_loops)
        check_input(self, x)
        graph = resolve_graph(x, edge_index, loops)
        beta = self.beta.to(x.dtype)
        norm = None
        if choose_backend(self.backend, x, "x") == "triton":
            # One kernel each way instead of ~12 torch ops; the norm lets the attention form
            # each key from x's row, which it gathers per edge anyway (k = x / norm): one
            # row gathered per edge instead of two.
            q, k, norm = cosine_qk(x, beta, with_norm=True)
        else:
            k = F.normalize(x, p=2.0, dim=-1)
            q = k * beta
        out = edge_attention(graph, x.unsqueeze(1), q=q.unsqueeze(1), k=k.unsqueeze(1),
                             strategy=self.strategy, backend=self.backend, k_norm=norm)
        return take_rows(out.squeeze(1), rows)

    def attention_spec(self, dtype=torch.float32, features=None):
        """What this layer asks of the fused attention op (``features``: the width of x)."""
        f = features or 1
        return AttentionSpec(1, f, f, True, False, False, None, False, dtype)

    @classmethod
    def from_pyg(cls, module, strategy: str = "auto", backend: str = "auto") -> "AGNNConv":
        ours = cls(module.requires_grad, module.add_self_loops, strategy, backend)
        return load_from_pyg(ours, module)

    def __repr__(self) -> str:
        return "AGNNConv()"
