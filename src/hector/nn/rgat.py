r"""RGAT (Busbridge et al. 2019), PyG ``RGATConv`` semantics (across-relation additive
self-attention), compiled by Hector."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .. import checks as C
from ..compiler import models
from ..compiler.program import Program
from ._common import as_one_graph, check_input, load_from_pyg, program_of, take_rows
from ..compiler.warm import graphed
from .rgcn import compiler_options, glorot_, relational_graph, unsupported


class RGATConv(nn.Module):
    r"""Relational graph attention, per head:

    .. math::
        z^r_j = x_j W_r, \quad e_{ij} = \mathrm{LeakyReLU}(z^r_i Q + z^r_j K), \quad
        \alpha_{ij} = \mathrm{softmax}_{j \in N(i)} e_{ij}, \quad
        x_i' = \sum_{j \in N(i)} \alpha_{ij} z^r_j

    heads concatenated or averaged, then bias.  Compiled from :func:`hector.compiler.models.rgat`:
    the score becomes ``x_j (W_r K)`` (weight-first), computed once per unique (node,
    relation) pair, and score, softmax and aggregation run as one attention traversal.

    Args:
        in_channels, out_channels, num_relations, num_bases, num_blocks, heads, concat,
        negative_slope, bias: as in PyG.  ``mod``, ``attention_mechanism`` other than
        'across-relation', ``attention_mode`` other than 'additive-self-attention',
        ``dim`` > 1, ``dropout`` > 0 and ``edge_dim`` raise ``NotImplementedError``.
        reorder, compact, fuse, backend, autodiff: see :func:`hector.compile`.

    Shapes:
        x ``[N, in_channels]``, edge_index ``[2, E]`` + edge_type ``[E]`` or a
        ``hector.Graph`` -> ``[N, heads * out_channels]`` (concat) or ``[N, out_channels]``;
        on a block (``hector.loader``) or with ``x = (x_src, x_dst)``: ``num_dst`` rows.
    """

    def __init__(self, in_channels: int, out_channels: int, num_relations: int,
                 num_bases: Optional[int] = None, num_blocks: Optional[int] = None,
                 mod: Optional[str] = None, attention_mechanism: str = "across-relation",
                 attention_mode: str = "additive-self-attention", heads: int = 1, dim: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0,
                 edge_dim: Optional[int] = None, bias: bool = True, **compiler):
        super().__init__()
        unsupported("RGATConv", mod=(mod, mod is None),
                    attention_mechanism=(attention_mechanism, attention_mechanism == "across-relation"),
                    attention_mode=(attention_mode, attention_mode == "additive-self-attention"),
                    dim=(dim, dim == 1), dropout=(dropout, dropout == 0.0),
                    edge_dim=(edge_dim, edge_dim is None))
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels),
                        ("num_relations", num_relations), ("heads", heads)):
            C.check_size(v, name)
        C.check_size(num_bases, "num_bases", allow_none=True)
        C.check_size(num_blocks, "num_blocks", allow_none=True)
        if num_bases is not None and num_blocks is not None:
            raise ValueError("Can not apply both basis-decomposition and "
                             "block-diagonal-decomposition at the same time.")
        if num_blocks is not None and (in_channels % num_blocks or (heads * out_channels) % num_blocks):
            raise ValueError(f"num_blocks={num_blocks} must divide in_channels={in_channels} and "
                             f"heads * out_channels={heads * out_channels}")
        self.in_channels, self.out_channels, self.num_relations = in_channels, out_channels, num_relations
        self.heads, self.concat, self.negative_slope = heads, concat, negative_slope
        self.num_bases, self.num_blocks, self.dim = num_bases, num_blocks, 1
        HC = heads * out_channels
        self.q = nn.Parameter(torch.empty(HC, heads))
        self.k = nn.Parameter(torch.empty(HC, heads))
        self.bias = nn.Parameter(torch.empty(HC if concat else out_channels)) if bias else None
        if num_bases is not None:
            self.att = nn.Parameter(torch.empty(num_relations, num_bases))
            self.basis = nn.Parameter(torch.empty(num_bases, in_channels, HC))
        elif num_blocks is not None:
            self.weight = nn.Parameter(torch.empty(num_relations, num_blocks,
                                                   in_channels // num_blocks, HC // num_blocks))
        else:
            self.weight = nn.Parameter(torch.empty(num_relations, in_channels, HC))
        # PyG's parameters of the ``mod`` variants: unused here, kept so state dicts match.
        self.w = nn.Parameter(torch.ones(out_channels))
        self.l1 = nn.Parameter(torch.ones(1, out_channels))
        self.b1 = nn.Parameter(torch.zeros(1, out_channels))
        self.l2 = nn.Parameter(torch.empty(out_channels, out_channels))
        self.b2 = nn.Parameter(torch.zeros(1, out_channels))
        self._compiler = compiler_options(**compiler)
        self.reset_parameters()
        self.program        # (compiled now: bad compiler options fail at construction)

    @property
    def program(self) -> Program:
        """The compiled :func:`hector.compiler.models.rgat` for the layer's settings now (a
        negative slope set after construction included)."""
        return program_of(self, (self.negative_slope,), lambda: Program(
            models.rgat, in_dim=self.in_channels, out_dim=self.out_channels,
            heads=self.heads, negative_slope=self.negative_slope, concat=self.concat,
            bias=self.bias is not None, num_bases=self.num_bases, num_blocks=self.num_blocks,
            num_relations=self.num_relations, **self._compiler))

    def reset_parameters(self) -> None:
        for name in ("basis", "att", "weight", "q", "k"):
            glorot_(getattr(self, name, None))
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        nn.init.constant_(self.l2, 1.0 / self.out_channels)

    def _weights(self):
        names = ("att", "basis") if self.num_bases is not None else ("weight",)
        out = {n: getattr(self, n) for n in names + ("q", "k")}
        if self.bias is not None:
            out["bias"] = self.bias
        return out

    @graphed
    def forward(self, x: torch.Tensor, edge_index, edge_type: Optional[torch.Tensor] = None,
                edge_attr=None, size=None, return_attention_weights=None):
        if edge_attr is not None or size is not None or return_attention_weights is not None:
            raise NotImplementedError("RGATConv: edge_attr, size and return_attention_weights "
                                      "are not supported; leave them None")
        x, edge_index, edge_type, rows, _ = as_one_graph(x, edge_index, edge_type,
                                                         num_relations=self.num_relations)
        check_input(self, x, width=self.in_channels)
        graph = relational_graph(x, edge_index, edge_type, self.num_relations)
        return take_rows(self.program(graph, {"x": x}, self._weights())[0], rows)

    @classmethod
    def from_pyg(cls, module, **compiler) -> "RGATConv":
        """An RGATConv with the hyper-parameters and parameters of a PyG ``RGATConv``."""
        ours = cls(module.in_channels, module.out_channels, module.num_relations,
                   module.num_bases, module.num_blocks, module.mod, module.attention_mechanism,
                   module.attention_mode, module.heads, module.dim, module.concat,
                   module.negative_slope, module.dropout, module.edge_dim,
                   bias=module.bias is not None, **compiler)
        return load_from_pyg(ours, module)

    def __repr__(self) -> str:
        return f"RGATConv({self.in_channels}, {self.out_channels}, heads={self.heads})"
