r"""GAT (Veličković et al. 2018), PyG ``GATConv`` semantics, on hector's fused attention."""
from __future__ import annotations

import torch
from torch import nn

from .. import checks as C
from ..device import resolve_backend
from ..kernels.attention.op import edge_attention
from ..kernels.attention.spec import AttentionSpec
from ..kernels.segment_mm.op import segment_mm
from ._bias import linear_of
from ._common import (as_one_graph, check_backend, check_input, check_strategy,
                      load_from_pyg, no_edge_features, resolve_graph, take_rows)
from ..compiler.warm import graphed


#: Several heads' scores come from the projection's epilogue only on graphs of at most this
#: many rows: on the H200 four heads of 16 gained on cora (2,708 rows) and lost on synthetic
#: arxiv (169,343), presumably because each of the 2H extra columns is a row reduction over
#: the whole row, mostly the block matrix's zeros (docs/perf-notes.md, "Attention layers",
#: 2026-11-28).  Between the two sizes it is unmeasured; 16384 rows (a few waves of 64-row
#: tiles, where launches still dominate) is a guess.
EPILOGUE_SCORES_MAX_ROWS = 16384


def scores_in_epilogue(rows: int, heads: int) -> bool:
    """Whether GAT's inference forms its scores in the projection GEMM's epilogue."""
    return heads == 1 or rows <= EPILOGUE_SCORES_MAX_ROWS


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
        # (a constant: the heads' block structure in _project; not a parameter, not saved)
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

    @graphed
    def forward(self, x, edge_index, edge_attr=None):
        no_edge_features(edge_attr, "GATConv")
        x, edge_index, _, rows, loops = as_one_graph(x, edge_index,
                                                     add_self_loops=self.add_self_loops)
        check_input(self, x, width=self.in_channels)
        graph = resolve_graph(x, edge_index, loops)
        H, C = self.heads, self.out_channels
        z, a_src, a_dst = self._project(x)
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

    def _project(self, x):
        """``(z [N, H, C], a_src [N, H], a_dst [N, H])``: the projection ``z = x Theta^T``
        and both scores ``<z_h, a_h>``, the scores as one ``[N, H*C] x [H*C, 2H]`` product
        with a block-diagonal matrix (rows ``h*C .. h*C+C-1`` hold head ``h``'s two
        vectors): the products of ``(z * a).sum(-1)``, summed in one GEMM that reads ``z``
        once, instead of two elementwise products and reductions over ``[N, H, C]`` (a
        quarter of the layer's GPU time on a 169k-node graph).

        Without autograd on the Triton backend the block product is the epilogue of the
        projection itself (``segment_mm``'s ``extra_weight``: each fp32 row of ``z`` times
        the blocks before it is stored), one launch where cuBLAS ran two GEMMs and a split-K
        reduction (on cora the score product cost more than the projection); several heads
        only on small graphs (:func:`scores_in_epilogue`).  Training keeps the two
        products: the segment GEMM's weight gradient is slower than cuBLAS's on these dense
        shapes (docs/perf-notes.md, "Segment GEMM", 2026-11-28).  The gradient reaches
        ``x`` through ``z`` as in PyG's layer (folding ``a`` into the projection instead,
        ``x (Theta^T a)``, moved the input gradient by 8e-4 relative to PyG's on
        github-musae with 4 heads; why so much was not traced)."""
        H, C = self.heads, self.out_channels
        att = torch.stack([self.att_src[0], self.att_dst[0]], 2)             # [H, C, 2]
        blocks = (att.reshape(C, 2) if H == 1 else       # (one head: no block structure)
                  (att.unsqueeze(-1) * self._eye[:, None, None, :]).reshape(H * C, 2 * H))
        w = self.lin.weight
        if (not torch.is_grad_enabled() and x.dtype == w.dtype == blocks.dtype
                and scores_in_epilogue(x.shape[0], H)
                and resolve_backend(self.backend, x.device, x.dtype) == "triton"):
            z, a = segment_mm(x, w.t().unsqueeze(0), [0, x.shape[0]],
                              extra_weight=blocks, backend="triton")
        else:
            z = self.lin(x)
            a = z @ blocks
        # (the split's backward: one stack of the two gradients)
        return (z.view(-1, H, C), *a.view(-1, 2, H).unbind(1))

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
