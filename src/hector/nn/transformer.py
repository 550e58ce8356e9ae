r"""Graph transformer (Shi et al. 2021), PyG ``TransformerConv`` semantics, compiled by
Hector from :func:`hector.compiler.models.transformer`."""
from __future__ import annotations

import torch
from torch import nn

from .. import checks as C
from ..compiler import models
from ..compiler.passes.common import Decision
from ..compiler.passes.reorder_attention import WHAT
from ..compiler.program import Program
from ._common import (as_one_graph, check_backend, check_input, check_strategy,
                      load_from_pyg, no_edge_features, param_dtype, program_of, resolve_graph,
                      take_rows)
from ..compiler.warm import graphed


class TransformerConv(nn.Module):
    r"""Multi-head dot-product attention over each node's incoming edges:

    .. math::
        \alpha_{ij} = \mathrm{softmax}_j\Big(\frac{(W_q x_i)^\top (W_k x_j)}{\sqrt{d}}\Big),
        \qquad x_i' = W_r x_i + \sum_{j \in N(i)} \alpha_{ij} W_v x_j

    with the optional gate :math:`\beta_i = \sigma(w^\top [m_i, W_r x_i, m_i - W_r x_i])`
    (``beta=True``) mixing root and message.

    Compiled from :func:`hector.compiler.models.transformer`: score, softmax and aggregation
    as one fused attention, the root added by its store (``hector explain transformer``
    prints each decision).

    Args: in_channels, out_channels, heads, concat, beta, dropout, bias, root_weight: as in
    PyG's ``TransformerConv``; strategy: ``"auto"``, ``"node"`` or ``"edge"``; backend:
    ``"auto"``, ``"triton"`` or ``"torch"``; reorder: ``"auto"`` (the compiler's cost model
    per graph), True (wherever it holds) or False: move the key and value projections
    across the attention (Hector's linear operator reordering,
    :mod:`hector.compiler.passes.reorder_attention`: one head, no attention dropout in the
    call, every node with an incoming edge); the attention then gathers each source's input
    row once instead of its key and value rows, and ``lin_key.bias`` (which the softmax
    cancels) gets no gradient.

    Shapes: x ``[N, in_channels]`` -> ``[N, heads * out_channels]`` (concat) or
    ``[N, out_channels]``; on a block (``hector.loader``) or with ``x = (x_src, x_dst)``:
    ``num_dst`` rows.
    """

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
                 beta: bool = False, dropout: float = 0.0, edge_dim=None, bias: bool = True,
                 root_weight: bool = True, strategy: str = "auto", backend: str = "auto",
                 reorder="auto"):
        super().__init__()
        if reorder not in ("auto", True, False):
            raise ValueError(f"reorder must be 'auto', True or False, got {reorder!r}")
        if not isinstance(in_channels, int):
            raise NotImplementedError("TransformerConv: only int in_channels is supported")
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels),
                        ("heads", heads)):
            C.check_size(v, name)
        if edge_dim is not None:
            no_edge_features(edge_dim, "TransformerConv")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.dropout, self.root_weight = concat, dropout, root_weight
        self.beta = beta and root_weight
        self.strategy = check_strategy(strategy)
        self.backend = check_backend(backend)
        self.reorder = reorder
        hc = heads * out_channels
        self.lin_key = nn.Linear(in_channels, hc, bias=bias)
        self.lin_query = nn.Linear(in_channels, hc, bias=bias)
        self.lin_value = nn.Linear(in_channels, hc, bias=bias)
        skip = hc if concat else out_channels
        self.lin_skip = nn.Linear(in_channels, skip, bias=bias) if root_weight else None
        self.lin_beta = nn.Linear(3 * skip, 1, bias=False) if self.beta else None

    def reset_parameters(self) -> None:
        for lin in (self.lin_key, self.lin_query, self.lin_value, self.lin_skip, self.lin_beta):
            if lin is not None:
                lin.reset_parameters()

    @property
    def program(self) -> Program:
        """The compiled :func:`hector.compiler.models.transformer` for the layer's settings
        now."""
        key = (self.dropout, self.strategy, self.backend, self.reorder)
        return program_of(self, key, lambda: Program(
            models.transformer, in_dim=self.in_channels, out_dim=self.out_channels,
            heads=self.heads, concat=self.concat, beta=self.beta, dropout=self.dropout,
            bias=self.lin_key.bias is not None, root_weight=self.root_weight,
            reorder={True: "always", False: False}.get(self.reorder, True),
            backend=self.backend, strategy=self.strategy))

    def weights(self) -> dict:
        """The program's weights as views of the layer's (PyG's) parameters."""
        out = {}
        for name in ("query", "key", "value"):
            lin = getattr(self, "lin_" + name)
            out[name] = lin.weight
            if lin.bias is not None:
                out[name + "_bias"] = lin.bias
        if self.lin_skip is not None:
            out["skip"] = self.lin_skip.weight
            if self.lin_skip.bias is not None:
                out["skip_bias"] = self.lin_skip.bias
        if self.lin_beta is not None:       # [1, 3 width]: out, root, out - root
            out["beta_out"], out["beta_root"], out["beta_diff"] = \
                self.lin_beta.weight.chunk(3, dim=1)
        return out

    @graphed
    def forward(self, x, edge_index, edge_attr=None):
        no_edge_features(edge_attr, "TransformerConv")
        x, edge_index, _, rows, _ = as_one_graph(x, edge_index)
        check_input(self, x, width=self.in_channels)
        graph = resolve_graph(x, edge_index, add_self_loops=False)
        out = self.program(graph, {"x": x}, self.weights(), training=self.training)[0]
        return take_rows(out, rows)      # a block's destination rows only

    def reordering(self, graph) -> Decision:
        """The compiler's decision on moving this layer's key and value projections across
        its attention on ``graph`` (:mod:`hector.compiler.passes.reorder_attention`), for a
        call in the layer's mode now (a training call with attention dropout declines)."""
        if self.reorder is False:
            return Decision("reorder", WHAT, False, "reorder=False")
        prog = self.program
        if self.training and prog.training_program is not None:
            prog = prog.training_program
        dtype = param_dtype(self) or torch.float32
        cp = prog.compiled_for(graph, dtype, backward=False)
        return next((d for rec in cp.log for d in rec.decisions if d.what == WHAT),
                    Decision("reorder", WHAT, False, "no attention of this form in the IR"))

    @classmethod
    def from_pyg(cls, module, strategy: str = "auto", backend: str = "auto",
                 reorder="auto") -> "TransformerConv":
        if module.lin_edge is not None:
            raise NotImplementedError("TransformerConv.from_pyg: edge_dim is not supported yet")
        ours = cls(module.in_channels, module.out_channels, module.heads, module.concat,
                   module.beta, module.dropout, bias=module.lin_key.bias is not None,
                   root_weight=module.root_weight, strategy=strategy, backend=backend,
                   reorder=reorder)
        # PyG builds lin_skip (and lin_beta with beta=True) even when root_weight=False, and
        # then never calls them: nothing of theirs to take over.
        unused = () if module.root_weight else ("lin_skip.", "lin_beta.")
        return load_from_pyg(ours, module, unused)

    def __repr__(self) -> str:
        return f"TransformerConv({self.in_channels}, {self.out_channels}, heads={self.heads})"
