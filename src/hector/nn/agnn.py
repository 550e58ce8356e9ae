r"""AGNN (Thekumparampil et al. 2018), PyG ``AGNNConv`` semantics, compiled by Hector."""
from __future__ import annotations

import torch
from torch import nn

from ..compiler import models
from ..compiler.program import Program
from ._common import (as_one_graph, check_backend, check_input, check_strategy, load_from_pyg,
                      program_of, resolve_graph, take_rows)
from ..compiler.warm import graphed


class AGNNConv(nn.Module):
    r"""Attention-based propagation:

    .. math::
        \alpha_{ij} = \mathrm{softmax}_j\big(\beta \cos(x_i, x_j)\big), \qquad
        x_i' = \sum_{j \in N(i)} \alpha_{ij} x_j

    compiled from :func:`hector.compiler.models.agnn` (one program per feature width, made on
    its first call): the normalisation is one kernel each way, and score, softmax and
    aggregation one fused attention that forms each key from the value row it gathers.

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

    def program_for(self, features: int) -> Program:
        """The compiled :func:`hector.compiler.models.agnn` for ``features``-wide inputs and
        the layer's settings now (made once for each)."""
        return program_of(self, (features, self.strategy, self.backend), lambda: Program(
            models.agnn, in_dim=features, backend=self.backend, strategy=self.strategy))

    @graphed
    def forward(self, x, edge_index):
        x, edge_index, _, rows, loops = as_one_graph(x, edge_index,
                                                     add_self_loops=self.add_self_loops)
        check_input(self, x)
        graph = resolve_graph(x, edge_index, loops)
        out = self.program_for(int(x.shape[1]))(graph, {"x": x}, {"beta": self.beta})
        return take_rows(out[0], rows)

    @classmethod
    def from_pyg(cls, module, strategy: str = "auto", backend: str = "auto") -> "AGNNConv":
        ours = cls(module.requires_grad, module.add_self_loops, strategy, backend)
        return load_from_pyg(ours, module)

    def __repr__(self) -> str:
        return "AGNNConv()"
