r"""Graph transformer (Shi et al. 2021), PyG ``TransformerConv`` semantics, on hector's fused
attention."""
from __future__ import annotations

import math

import torch
from torch import nn

from .. import checks as C
from ..kernels.attention.op import edge_attention
from ..kernels.attention.spec import AttentionSpec
from ._bias import linear, linear_of
from ._common import (as_one_graph, check_backend, check_input, check_strategy,
                      load_from_pyg, no_edge_features, resolve_graph, take_rows)


class TransformerConv(nn.Module):
    r"""Multi-head dot-product attention over each node's incoming edges:

    .. math::
        \alpha_{ij} = \mathrm{softmax}_j\Big(\frac{(W_q x_i)^\top (W_k x_j)}{\sqrt{d}}\Big),
        \qquad x_i' = W_r x_i + \sum_{j \in N(i)} \alpha_{ij} W_v x_j

    with the optional gate :math:`\beta_i = \sigma(w^\top [m_i, W_r x_i, m_i - W_r x_i])`
    (``beta=True``) mixing root and message.

    Args: in_channels, out_channels, heads, concat, beta, dropout, bias, root_weight: as in
    PyG's ``TransformerConv``; strategy: ``"auto"``, ``"node"`` or ``"edge"``; backend:
    ``"auto"``, ``"triton"`` or ``"torch"``.

    Shapes: x ``[N, in_channels]`` -> ``[N, heads * out_channels]`` (concat) or
    ``[N, out_channels]``; on a block (``hector.loader``) or with ``x = (x_src, x_dst)``:
    ``num_dst`` rows.
    """

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
                 beta: bool = False, dropout: float = 0.0, edge_dim=None, bias: bool = True,
                 root_weight: bool = True, strategy: str = "auto", backend: str = "auto"):
        super().__init__()
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

    def forward(self, x, edge_index, edge_attr=None):
        no_edge_features(edge_attr, "TransformerConv")
        x, edge_index, _, rows, _ = as_one_graph(x, edge_index)
        check_input(self, x, width=self.in_channels)
        graph = resolve_graph(x, edge_index, add_self_loops=False)
        H, C = self.heads, self.out_channels
        if rows is None:
            k, v, q, x_r = self._projections(x)
        else:       # a block: the skip of its destination rows only, four products
            k = linear(x, self.lin_key)
            v = linear(x, self.lin_value)
            q = linear(x, self.lin_query)
            x_r = None if self.lin_skip is None else linear(take_rows(x, rows), self.lin_skip)
        out = edge_attention(graph, v.view(-1, H, C), q=q.view(-1, H, C), k=k.view(-1, H, C),
                             scale=1.0 / math.sqrt(C), dropout=self.dropout,
                             training=self.training, strategy=self.strategy,
                             backend=self.backend)
        out = take_rows(out, rows)      # a block's destination rows only
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if x_r is not None:
            if self.lin_beta is not None:
                b = torch.sigmoid(self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)))
                out = b * x_r + (1 - b) * out
            else:
                out = out + x_r
        return out

    def _projections(self, x):
        """(k, v, q, skip or None) from ONE product of ``x`` with the four layers' weights
        stacked, whose outputs are column slices of one ``[N, 3HC (+ skip)]`` tensor (q, k
        and v read in place by the attention kernels, which take their row strides).  Its
        backward is one concatenation of the four gradients (``split``'s) and one linear
        backward: three products where the four ``nn.Linear`` s took twelve, plus three
        additions of their input gradients (session 28: the step's launches 6 / 17 -> 5 / 9
        on the test graph).  The stacked weight is a concatenation of the parameters on
        every call (weight-sized), so the parameters and their names stay PyG's."""
        lins = [self.lin_key, self.lin_value, self.lin_query] + (
            [self.lin_skip] if self.lin_skip is not None else [])
        weight = torch.cat([lin.weight for lin in lins])
        bias = (torch.cat([lin.bias for lin in lins]) if lins[0].bias is not None else None)
        parts = linear_of(x, weight, bias).split([lin.out_features for lin in lins], dim=1)
        return (*parts[:3], parts[3] if len(parts) > 3 else None)

    def attention_spec(self, dtype=torch.float32, features=None):
        """What this layer asks of the fused attention op (for ``hector.explain``)."""
        c = self.out_channels
        return AttentionSpec(self.heads, c, c, True, False, False, None, self.dropout > 0, dtype)

    @classmethod
    def from_pyg(cls, module, strategy: str = "auto", backend: str = "auto") -> "TransformerConv":
        if module.lin_edge is not None:
            raise NotImplementedError("TransformerConv.from_pyg: edge_dim is not supported yet")
        ours = cls(module.in_channels, module.out_channels, module.heads, module.concat,
                   module.beta, module.dropout, bias=module.lin_key.bias is not None,
                   root_weight=module.root_weight, strategy=strategy, backend=backend)
        # PyG builds lin_skip (and lin_beta with beta=True) even when root_weight=False, and
        # then never calls them: nothing of theirs to take over.
        unused = () if module.root_weight else ("lin_skip.", "lin_beta.")
        return load_from_pyg(ours, module, unused)

    def __repr__(self) -> str:
        return f"TransformerConv({self.in_channels}, {self.out_channels}, heads={self.heads})"
