r"""GAT (Veličković et al. 2018), PyG ``GATConv`` semantics, compiled by Hector from
:func:`hector.compiler.models.gat`."""
from __future__ import annotations

import torch
from torch import nn

from .. import checks as C
from ..compiler import models
from ..compiler.program import Program
from ._common import (as_one_graph, check_backend, check_input, check_strategy,
                      load_from_pyg, no_edge_features, program_of, resolve_graph, take_rows)
from ..compiler.warm import graphed


class GATConv(nn.Module):
    r"""Graph attention:

    .. math::
        \alpha_{ij} = \mathrm{softmax}_j\big(\mathrm{LeakyReLU}(a_s^\top \Theta x_j +
        a_t^\top \Theta x_i)\big), \qquad x_i' = \sum_{j \in N(i)} \alpha_{ij} \Theta x_j

    per head; heads concatenated (``concat=True``) or averaged, then bias.  Compiled from
    :func:`hector.compiler.models.gat`: score, softmax and aggregation run as one fused
    attention (node- or edge-parallel, see ``strategy``), both scores as one product of the
    projection's rows (in its GEMM's epilogue where that pays), the residual and the bias
    added by the attention's store (``hector explain gat`` prints each decision).

    Args:
        in_channels, out_channels, heads, concat, negative_slope, dropout, add_self_loops,
        bias, residual: as in PyG's ``GATConv`` (``dropout`` applies to the attention
        coefficients).
        strategy: ``"auto"`` (chosen from the graph's degree statistics), ``"node"`` or ``"edge"``.
        backend: ``"auto"`` (Triton on CUDA or under ``TRITON_INTERPRET=1``, else torch),
            ``"triton"`` or ``"torch"``.

    Shapes:
        x ``[N, in_channels]``, edge_index ``[2, E]`` or a ``hector.Graph``
        -> ``[N, heads * out_channels]`` (concat) or ``[N, out_channels]``.  Bipartite:
        x ``(x_src, x_dst)`` with a ``[2, E]`` edge_index, or x (destinations first) or
        ``(x_src, x_dst)`` with a block from ``hector.loader`` -> ``[num_dst, ...]``.
    """

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 edge_dim=None, fill_value="mean", bias: bool = True, residual: bool = False,
                 strategy: str = "auto", backend: str = "auto"):
        super().__init__()
        if not isinstance(in_channels, int):
            raise NotImplementedError("GATConv: only int in_channels (one node set) is supported")
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels),
                        ("heads", heads)):
            C.check_size(v, name)
        if edge_dim is not None:
            no_edge_features(edge_dim, "GATConv")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.strategy = add_self_loops, check_strategy(strategy)
        self.backend = check_backend(backend)
        total = out_channels * (heads if concat else 1)
        self.lin = nn.Linear(in_channels, heads * out_channels, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        self.res = nn.Linear(in_channels, total, bias=False) if residual else None
        self.bias = nn.Parameter(torch.empty(total)) if bias else None
        self.reset_parameters()

    @property
    def program(self) -> Program:
        """The compiled :func:`hector.compiler.models.gat` for the layer's settings now."""
        key = (self.negative_slope, self.dropout, self.strategy, self.backend)
        return program_of(self, key, lambda: Program(
            models.gat, in_dim=self.in_channels, out_dim=self.out_channels, heads=self.heads,
            negative_slope=self.negative_slope, concat=self.concat,
            bias=self.bias is not None, dropout=self.dropout, residual=self.res is not None,
            backend=self.backend, strategy=self.strategy))

    def reset_parameters(self) -> None:
        for w in (self.lin.weight, self.att_src, self.att_dst) + (
                (self.res.weight,) if self.res is not None else ()):
            nn.init.xavier_uniform_(w)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @graphed
    def forward(self, x, edge_index, edge_attr=None):
        no_edge_features(edge_attr, "GATConv")
        x, edge_index, _, rows, loops = as_one_graph(x, edge_index,
                                                     add_self_loops=self.add_self_loops)
        check_input(self, x, width=self.in_channels)
        graph = resolve_graph(x, edge_index, loops)
        H, C = self.heads, self.out_channels
        weights = {"lin": self.lin.weight, "att_src": self.att_src.view(H, C, 1),
                   "att_dst": self.att_dst.view(H, C, 1)}
        if self.res is not None:
            weights["res"] = self.res.weight
        if self.bias is not None:
            weights["bias"] = self.bias
        out = self.program(graph, {"x": x}, weights, training=self.training)[0]
        return take_rows(out, rows)      # a block's destination rows only

    @classmethod
    def from_pyg(cls, module, strategy: str = "auto", backend: str = "auto") -> "GATConv":
        """A GATConv with the hyper-parameters and parameters of a PyG ``GATConv``."""
        if module.lin is None or module.lin_edge is not None:
            raise NotImplementedError("GATConv.from_pyg: bipartite (tuple in_channels) and "
                                      "edge_dim layers are not supported yet")
        ours = cls(module.in_channels, module.out_channels, module.heads, module.concat,
                   module.negative_slope, module.dropout, module.add_self_loops,
                   bias=module.bias is not None, residual=module.res is not None,
                   strategy=strategy, backend=backend)
        return load_from_pyg(ours, module)

    def __repr__(self) -> str:
        return f"GATConv({self.in_channels}, {self.out_channels}, heads={self.heads})"
