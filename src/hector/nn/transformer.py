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
from ._reorder import (has_edges, messages, messages_added, query_key,
                       transformer_reorder)
from ..compiler.warm import graphed


class TransformerConv(nn.Module):
    r"""Multi-head dot-product attention over each node's incoming edges:

    .. math::
        \alpha_{ij} = \mathrm{softmax}_j\Big(\frac{(W_q x_i)^\top (W_k x_j)}{\sqrt{d}}\Big),
        \qquad x_i' = W_r x_i + \sum_{j \in N(i)} \alpha_{ij} W_v x_j

    with the optional gate :math:`\beta_i = \sigma(w^\top [m_i, W_r x_i, m_i - W_r x_i])`
    (``beta=True``) mixing root and message.

    Args: in_channels, out_channels, heads, concat, beta, dropout, bias, root_weight: as in
    PyG's ``TransformerConv``; strategy: ``"auto"``, ``"node"`` or ``"edge"``; backend:
    ``"auto"``, ``"triton"`` or ``"torch"``; reorder: ``"auto"`` (a cost model per graph),
    True or False: move the key and value projections across the attention (Hector's linear
    operator reordering, :mod:`hector.nn._reorder`): the attention then gathers each
    source's input row once (shared by the heads) instead of its key and value rows (no
    attention dropout in training).

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

    @graphed
    def forward(self, x, edge_index, edge_attr=None):
        no_edge_features(edge_attr, "TransformerConv")
        x, edge_index, _, rows, _ = as_one_graph(x, edge_index)
        check_input(self, x, width=self.in_channels)
        graph = resolve_graph(x, edge_index, add_self_loops=False)
        H, C = self.heads, self.out_channels
        if self.reordering(graph).applied:
            return self._reordered(x, graph, rows)
        if rows is None:
            k, v, q, x_r = self._projections(x)
        else:       # a block: the skip of its destination rows only, four products
            k = linear(x, self.lin_key)
            v = linear(x, self.lin_value)
            q = linear(x, self.lin_query)
            x_r = None if self.lin_skip is None else linear(take_rows(x, rows), self.lin_skip)
        # The skip added by the attention's store (its epilogue reads x_r's rows in place,
        # a column slice of the joint projection): one pass over the output less.  Only
        # where it is added as is: a whole graph, heads concatenated, no gate.
        fold = (x_r is not None and rows is None and self.lin_beta is None
                and (self.concat or H == 1))
        out = edge_attention(graph, v.view(-1, H, C), q=q.view(-1, H, C), k=k.view(-1, H, C),
                             scale=1.0 / math.sqrt(C), dropout=self.dropout,
                             training=self.training, strategy=self.strategy,
                             backend=self.backend, bias=x_r.view(-1, H, C) if fold else None)
        out = take_rows(out, rows)      # a block's destination rows only
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        return out if fold else self._with_root(out, x_r)

    def _with_root(self, out, x_r):
        """The message ``out`` joined with the root's ``x_r``: added, or mixed by the gate."""
        if x_r is None:
            return out
        if self.lin_beta is not None:
            b = torch.sigmoid(self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)))
            return b * x_r + (1 - b) * out
        return out + x_r

    def reordering(self, graph):
        """The :class:`~hector.compiler.passes.common.Decision` of this layer's linear
        reordering on ``graph`` (:func:`hector.nn._reorder.transformer_reorder`)."""
        skip = 0 if self.lin_skip is None else self.lin_skip.out_features
        return transformer_reorder(self.in_channels, self.out_channels, self.heads, skip,
                                   graph.num_nodes, graph.num_edges,
                                   self.training and self.dropout > 0, self.reorder)

    def _reordered(self, x, graph, rows):
        """Reordered (:mod:`hector.nn._reorder`): ``q'[h] = x W_q[h]^T W_k[h] + W_k[h]^T
        b_q[h]`` (with the skip in the same product on a whole graph), the attention over
        one row of ``x`` per node as every head's key and value, then ``W_v[h]`` and ``b_v``
        after it.  ``b_v`` joins the skip's bias when every output row has edges; else it is
        added where a row has them."""
        H, C, F = self.heads, self.out_channels, self.in_channels
        w_qk, b_qk = query_key(self.lin_query.weight, self.lin_query.bias, self.lin_key.weight,
                               self.lin_key.bias, H)
        lin_s = self.lin_skip
        w_v, b_v = self._value_weights()
        whole = rows is None and graph.in_degree.num_isolated == 0
        fold = b_v is not None and lin_s is not None and self.lin_beta is None and whole
        x_r = None
        if lin_s is not None:
            b_s = lin_s.bias + b_v if fold else lin_s.bias
            if rows is None:
                weight = torch.cat([w_qk, lin_s.weight])
                bias = None if b_s is None else torch.cat([b_qk, b_s])
                q, x_r = linear_of(x, weight, bias).split([H * F, lin_s.out_features], 1)
            else:
                x_r = linear_of(take_rows(x, rows), lin_s.weight, b_s)
        if x_r is None or rows is not None:
            q = linear_of(x, w_qk, b_qk)
        keys = x.unsqueeze(1).expand(-1, H, F)      # one row per node, read by every head
        agg = edge_attention(graph, keys, q=q.view(-1, H, F), k=keys,
                             scale=1.0 / math.sqrt(C), dropout=self.dropout,
                             training=self.training, strategy=self.strategy,
                             backend=self.backend)
        agg = take_rows(agg, rows)                  # [n, H, F]
        b_v = None if fold else b_v
        mask = None if whole or b_v is None else take_rows(has_edges(graph, agg.dtype), rows)
        addend = x_r if self.lin_beta is None else None
        if H == 1 or not self.concat:               # one product ([n, H*F] x [H*F, C'])
            out = messages(agg.reshape(agg.shape[0], H * F), w_v, addend, b_v, mask)
        else:                                       # per head: [H, n, F] x [H, F, C]
            per_head = torch.bmm(agg.transpose(0, 1), w_v.view(H, C, F).transpose(1, 2))
            out = messages_added(per_head.transpose(0, 1).reshape(-1, H * C), addend, b_v,
                                 mask)
        return out if self.lin_beta is None else self._with_root(out, x_r)

    def _value_weights(self):
        """``W_v`` and ``b_v`` as the reordered value product takes them: per head
        ``[H*C, F]`` (heads concatenated, or one head); with the heads averaged, the mean
        over heads folded into one ``[C, H*F]`` weight and a ``[C]`` bias."""
        w, b, H = self.lin_value.weight, self.lin_value.bias, self.heads
        if H == 1 or self.concat:
            return w, b
        C, F = self.out_channels, self.in_channels
        w_mean = w.view(H, C, F).transpose(0, 1).reshape(C, H * F) / H
        return w_mean, None if b is None else b.view(H, C).mean(0)

    def _projections(self, x):
        """(k, v, q, skip or None) from ONE product of ``x`` with the four layers' weights
        stacked, whose outputs are column slices of one ``[N, 3HC (+ skip)]`` tensor (q, k
        and v read in place by the attention kernels, which take their row strides).  Its
        backward is one concatenation of the four gradients (``split``'s) and one linear
        backward: three products where the four ``nn.Linear`` s took twelve, plus three
        additions of their input gradients (the step's launches 6 / 17 -> 5 / 9 on the test
        graph).  The stacked weight is a concatenation of the parameters on
        every call (weight-sized), so the parameters and their names stay PyG's."""
        lins = [self.lin_key, self.lin_value, self.lin_query] + (
            [self.lin_skip] if self.lin_skip is not None else [])
        weight = torch.cat([lin.weight for lin in lins])
        bias = (torch.cat([lin.bias for lin in lins]) if lins[0].bias is not None else None)
        parts = linear_of(x, weight, bias).split([lin.out_features for lin in lins], dim=1)
        return (*parts[:3], parts[3] if len(parts) > 3 else None)

    def attention_spec(self, dtype=torch.float32, features=None, graph=None):
        """What this layer asks of the fused attention op (for ``hector.explain``); on
        ``graph``, as its reordering decides (keys and values then the input rows, shared by
        the heads)."""
        c, shared = self.out_channels, False
        if graph is not None and self.reordering(graph).applied:
            c, shared = self.in_channels, self.heads > 1
        return AttentionSpec(self.heads, c, c, True, False, False, None, self.dropout > 0, dtype,
                             shared_kv=shared)

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
