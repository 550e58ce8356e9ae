r"""RGCN (Schlichtkrull et al. 2018), PyG ``RGCNConv`` semantics, compiled by Hector."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from .. import checks as C
from ..compiler import models
from ..compiler.program import Program
from ..graph import Graph, graph_of
from ._common import as_one_graph, check_input, load_from_pyg, take_rows
from ..compiler.warm import graphed


def glorot_(p: Optional[torch.Tensor]) -> None:
    """PyG's glorot: uniform in +-sqrt(6 / (fan_in + fan_out)) over the last two axes."""
    if p is not None:
        bound = math.sqrt(6.0 / (p.size(-2) + p.size(-1)))
        nn.init.uniform_(p, -bound, bound)


def compiler_options(reorder=True, compact=True, fuse=True, backend="auto", autodiff="ir"):
    return dict(reorder=reorder, compact=compact, fuse=fuse, backend=backend, autodiff=autodiff)


def relational_graph(x: torch.Tensor, edge_index, edge_type, num_relations: int) -> Graph:
    """A prebuilt ``Graph``, or PyG's ``edge_index`` + ``edge_type`` (built once, cached)."""
    C.check_tensor(x, "x")
    if x.dim() != 2:
        raise ValueError(f"x must have shape [num_nodes, in_channels], got {tuple(x.shape)}")
    if isinstance(edge_index, Graph):
        graph = edge_index
    else:
        C.check_edge_index(edge_index)
        if edge_type is None:
            raise ValueError("edge_type is required with an edge_index tensor (one relation id "
                             "per edge); or pass a prebuilt hector.Graph as edge_index")
        graph = graph_of(edge_index, edge_type, num_nodes=int(x.shape[0]),
                         num_relations=num_relations)
    if graph.num_relations != num_relations:
        raise ValueError(f"the graph has num_relations={graph.num_relations} but the layer "
                         f"was built for num_relations={num_relations}")
    return graph


def unsupported(layer: str, **options) -> None:
    for name, (value, ok) in options.items():
        if not ok:
            raise NotImplementedError(f"{layer}: {name}={value!r} is not supported")


class RGCNConv(nn.Module):
    r"""Relational graph convolution:

    .. math::
        x_i' = \Theta_{root} x_i + b + \sum_{r} \frac{1}{|N_r(i)|} \sum_{j \in N_r(i)} \Theta_r x_j

    compiled from :func:`hector.compiler.models.rgcn`: the per-relation linear runs once per unique
    (src, relation) or (dst, relation) pair, whichever the graph makes cheaper.

    Args:
        in_channels, out_channels, num_relations, num_bases, num_blocks, aggr ('mean' or
        'add'), root_weight, is_sorted (ignored: hector always sorts), bias: as in PyG.
        reorder, compact, fuse, backend, autodiff: see :func:`hector.compile`.

    Shapes:
        x ``[N, in_channels]``, edge_index ``[2, E]`` + edge_type ``[E]`` or a
        ``hector.Graph`` -> ``[N, out_channels]``; on a block (``hector.loader``) or with
        ``x = (x_src, x_dst)`` -> ``[num_dst, out_channels]`` (computed on the block's
        source nodes, then its destination rows taken).
    """

    def __init__(self, in_channels: int, out_channels: int, num_relations: int,
                 num_bases: Optional[int] = None, num_blocks: Optional[int] = None,
                 aggr: str = "mean", root_weight: bool = True, is_sorted: bool = False,
                 bias: bool = True, **compiler):
        super().__init__()
        unsupported("RGCNConv", in_channels=(in_channels, isinstance(in_channels, int)),
                    aggr=(aggr, aggr in ("mean", "add", "sum")))
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels),
                        ("num_relations", num_relations)):
            C.check_size(v, name)
        C.check_size(num_bases, "num_bases", allow_none=True)
        C.check_size(num_blocks, "num_blocks", allow_none=True)
        if num_bases is not None and num_blocks is not None:
            raise ValueError("Can not apply both basis-decomposition and "
                             "block-diagonal-decomposition at the same time.")
        if num_blocks is not None and (in_channels % num_blocks or out_channels % num_blocks):
            raise ValueError(f"num_blocks={num_blocks} must divide in_channels={in_channels} "
                             f"and out_channels={out_channels}")
        self.in_channels, self.out_channels, self.num_relations = in_channels, out_channels, num_relations
        self.num_bases, self.num_blocks, self.aggr = num_bases, num_blocks, aggr
        if num_bases is not None:
            self.weight = nn.Parameter(torch.empty(num_bases, in_channels, out_channels))
            self.comp = nn.Parameter(torch.empty(num_relations, num_bases))
        elif num_blocks is not None:
            self.weight = nn.Parameter(torch.empty(num_relations, num_blocks, in_channels // num_blocks,
                                                   out_channels // num_blocks))
            self.register_parameter("comp", None)
        else:
            self.weight = nn.Parameter(torch.empty(num_relations, in_channels, out_channels))
            self.register_parameter("comp", None)
        self.root = nn.Parameter(torch.empty(in_channels, out_channels)) if root_weight else None
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.program = Program(models.rgcn, in_dim=in_channels, out_dim=out_channels,
                               num_bases=num_bases, num_blocks=num_blocks, aggr=aggr,
                               root_weight=root_weight, bias=bias, num_relations=num_relations,
                               **compiler_options(**compiler))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot_(self.weight)
        glorot_(self.comp)
        glorot_(self.root)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @graphed
    def forward(self, x: torch.Tensor, edge_index, edge_type: Optional[torch.Tensor] = None):
        x, edge_index, edge_type, rows, _ = as_one_graph(x, edge_index, edge_type,
                                                         num_relations=self.num_relations)
        check_input(self, x, width=self.in_channels)
        graph = relational_graph(x, edge_index, edge_type, self.num_relations)
        weights = {n: p for n, p in (("weight", self.weight), ("comp", self.comp),
                                      ("root", self.root), ("bias", self.bias)) if p is not None}
        return take_rows(self.program(graph, {"x": x}, weights)[0], rows)

    @classmethod
    def from_pyg(cls, module, **compiler) -> "RGCNConv":
        """An RGCNConv with the hyper-parameters and parameters of a PyG ``RGCNConv``."""
        ours = cls(module.in_channels, module.out_channels, module.num_relations,
                   module.num_bases, module.num_blocks, aggr=module.aggr,
                   root_weight=module.root is not None, bias=module.bias is not None, **compiler)
        return load_from_pyg(ours, module)

    def __repr__(self) -> str:
        return (f"RGCNConv({self.in_channels}, {self.out_channels}, "
                f"num_relations={self.num_relations})")
