r"""GAT (Veličković et al. 2018), PyG ``GATConv`` semantics, on hector's fused attention."""
from __future__ import annotations

import torch
from torch import nn

from .. import checks as C
from ..kernels.attention.op import edge_attention
from ..kernels.attention.spec import AttentionSpec
from ._bias import linear_of
from ._common import (as_one_graph, check_backend, check_input, check_strategy,
                      load_from_pyg, no_edge_features, resolve_graph, take_rows)


class GATConv(nn.Module):
    r"""Graph attention:

    .. math::
        \alpha_{ij} = \mathrm{softmax}_j\big(\mathrm{LeakyReLU}(a_s^\top \Theta x_j +
        a_t^\top \Theta x_i)\big), \qquad x_i' = \sum_{j \in N(i)} \alpha_{ij} \Theta x_j

    per head; heads concatenated (``concat=True``) or averaged, then bias.  Score, softmax and
    aggregation run as one fused kernel (node- or edge-parallel, see ``strategy``).

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
        # (a constant: the heads' block structure in _scores; not a parameter, not saved)
        self.register_buffer("_eye", torch.eye(heads), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in (self.lin.weight, self.att_src, self.att_dst) + (
                (self.res.weight,) if self.res is not None else ()):
            nn.init.xavier_uniform_(w)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @property
    def bias_in_kernel(self) -> bool:
        """Whether the attention kernels add the output bias as they store each row (heads
        concatenated: no broadcast pass over [N, H*C]); averaged heads add it after."""
        return self.bias is not None and self.concat

    def forward(self, x, edge_index, edge_attr=None):
        no_edge_features(edge_attr, "GATConv")
        x, edge_index, _, rows, loops = as_one_graph(x, edge_index,
                                                     add_self_loops=self.add_self_loops)
        check_input(self, x, width=self.in_channels)
        graph = resolve_graph(x, edge_index, loops)
        H, C = self.heads, self.out_channels
        z = self.lin(x).view(-1, H, C)
        a_src, a_dst = self._scores(z)
        fold = self.bias_in_kernel
        epilogue = self.bias if fold else None
        # On a whole graph with the heads concatenated, the residual and the bias are one
        # product (x W_res^T + b) added by the attention's store, row by row: no pass over
        # the output.
        fold_res = self.res is not None and rows is None and self.concat
        if fold_res:
            epilogue = linear_of(x, self.res.weight, self.bias).view(-1, H, C)
        out = edge_attention(graph, z, a_src=a_src, a_dst=a_dst, negative_slope=self.negative_slope,
                             dropout=self.dropout, training=self.training, strategy=self.strategy,
                             backend=self.backend, bias=epilogue)
        out = take_rows(out, rows)      # a block's destination rows only
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if self.res is not None and not fold_res:
            out = out + self.res(take_rows(x, rows))
        return out + self.bias if self.bias is not None and not fold else out

    def _scores(self, z):
        """(a_src, a_dst) ``[N, H]``: ``<z_h, a_h>`` for both vectors as one ``[N, H*C] x
        [H*C, 2H]`` product with a block-diagonal matrix (rows ``h*C .. h*C+C-1`` hold head
        ``h``'s two vectors): the products of ``(z * a).sum(-1)``, summed in one GEMM that
        reads ``z`` once, instead of two elementwise products and reductions over ``[N, H,
        C]`` (a quarter of the layer's GPU time on a 169k-node graph).  The gradient reaches
        ``x`` through ``z`` as in PyG's layer (folding ``a`` into the projection instead,
        ``x (Theta^T a)``, moved the input gradient by 8e-4 relative to PyG's on github-musae
        with 4 heads; why so much was not traced)."""
        H, C = self.heads, self.out_channels
        att = torch.stack([self.att_src[0], self.att_dst[0]], 2)             # [H, C, 2]
        blocks = (att.unsqueeze(-1) * self._eye[:, None, None, :]).reshape(H * C, 2 * H)
        a = (z.reshape(-1, H * C) @ blocks).view(-1, 2, H)
        return a.unbind(1)           # (its backward: one stack of the two gradients)

    def attention_spec(self, dtype=torch.float32, features=None):
        """What this layer asks of the fused attention op (for ``hector.explain``)."""
        return AttentionSpec(self.heads, 0, self.out_channels, False, True, True,
                             self.negative_slope, self.dropout > 0, dtype)

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
