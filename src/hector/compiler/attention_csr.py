"""The torch backend's attention on CPU tensors as sparse-CSR products, for a fused attention
whose every operand is a node row (GAT, AGNN, Transformer programs): every head's weights in
one block-diagonal CSR matrix (``kernels.attention.reference``'s layout, kept on the graph),
the scores and the value gradient's weights by SDDMM, the aggregation and the row gradients
by sparse-dense products (MKL), the softmax over contiguous rows: no ``[E, H, D]`` gather
or ``index_add``, which made the edge-by-edge form far slower on the CPU (docs/perf-notes.md,
"Attention layers on the CPU").

Same math as ``steps_torch.attention_torch_lse`` / ``attention_bwd_torch`` (which stay the
reference and the path everywhere else): the forward returns the output and the
log-sum-exp, the backward recomputes the weights from them.  Never under autograd (the IR
autodiff's plans run in the autograd Function's forward and backward, without grad)."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ..kernels.attention.reference import _layout, _sddmm, _spmm, dropout_keep
from .ir import NODE

#: The roles a fused attention's node operands play (``p``, a per-relation prior, is not a
#: node row: such attentions take the edge-wise path).
_NODE_ROLES = ("q", "k", "v", "a_src", "a_dst")


def applies(roles: dict, graph) -> bool:
    """Whether this attention (role -> (value, tensor)) runs as CSR products here."""
    if graph.device.type != "cpu" or graph.num_nodes == 0 or graph.num_edges == 0:
        return False
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or "p" in roles:
        return False
    # (plain tensors only: the fake or functional tensors of a traced call, which sparse
    # layouts do not support, take the edge-wise form)
    return all(roles[r][0].kind == NODE and type(roles[r][1]) is torch.Tensor
               for r in _NODE_ROLES if r in roles)


def _acc(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64 if t.dtype == torch.float64 else torch.float32)


def _scores(att, roles, layout):
    """(activated score, pre-activation score) per CSR entry ``[N*H*deg]``."""
    s = None
    if "q" in roles:
        s = _sddmm(layout, _acc(roles["q"][1]), _acc(roles["k"][1]), att.attr("scale"))
    for role, at in (("a_src", layout.col), ("a_dst", layout.row)):
        if role in roles:
            term = _acc(roles[role][1]).reshape(-1).index_select(0, at)
            s = term if s is None else s + term
    slope = att.attr("slope")
    return (s if slope is None else torch.where(s > 0, s, s * slope)), s


def _kept(att, roles, layout, heads: int, n_edges: int) -> Optional[torch.Tensor]:
    """Per CSR entry: 0 for a dropped (edge, head), ``1 / (1 - p)`` for a kept one (the
    kernels' mask, a hash of the seed and the canonical edge id); None without dropout."""
    p = att.attr("dropout", 0.0)
    if p == 0:
        return None
    keep = dropout_keep(roles["seed"][1], torch.arange(n_edges), heads, p)
    return keep.reshape(-1).index_select(0, layout.keep_index).to(torch.float32) / (1.0 - p)


def forward(att, roles: dict, graph):
    """``(out [N, H, Dv], lse [N, H])`` of the attention, without its epilogue term."""
    value = roles["v"][1]
    heads = value.shape[1]
    layout = _layout(graph, heads)
    t, _ = _scores(att, roles, layout)
    top = torch.segment_reduce(t, "max", offsets=layout.crow)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)     # (rows without edges)
    p = torch.exp(t - top.index_select(0, layout.row))
    total = layout.segment_sum(p)
    lse = top + torch.log(torch.where(total > 0, total, torch.ones_like(total)))
    alpha = p / total.index_select(0, layout.row)
    z = _kept(att, roles, layout, heads, graph.num_edges)
    weights = alpha if z is None else alpha * z.to(alpha.dtype)
    out = _spmm(layout, weights, _acc(value))
    return out.to(value.dtype), lse.view(-1, heads)


def backward(att, roles: dict, graph, grad: torch.Tensor, lse: torch.Tensor,
             needs) -> Dict[str, torch.Tensor]:
    """Role -> gradient on the role's rows, as ``steps_torch.attention_bwd_torch`` forms
    them."""
    value = roles["v"][1]
    heads = value.shape[1]
    layout = _layout(graph, heads)
    t, s = _scores(att, roles, layout)
    alpha = torch.exp(t - _acc(lse).reshape(-1).index_select(0, layout.row))
    z = _kept(att, roles, layout, heads, graph.num_edges)
    g = _acc(grad).contiguous()
    d_alpha = _sddmm(layout, g, _acc(value))
    if z is not None:
        d_alpha = d_alpha * z
    # <g_v, out_v> as the row sum of alpha d_alpha: E*H products rather than N*H*D
    delta = layout.segment_sum(alpha * d_alpha).index_select(0, layout.row)
    ds = alpha * (d_alpha - delta)
    slope = att.attr("slope")
    if slope is not None:
        ds = torch.where(s > 0, ds, ds * slope)
    scale = att.attr("scale")
    made = {
        "v": lambda: _spmm(layout, alpha if z is None else alpha * z, g, transpose=True),
        "a_src": lambda: ds.new_zeros(layout.rows).index_add_(0, layout.col, ds),
        "a_dst": lambda: layout.segment_sum(ds),
        "q": lambda: _spmm(layout, ds * scale, _acc(roles["k"][1])),
        "k": lambda: _spmm(layout, ds * scale, _acc(roles["q"][1]), transpose=True),
    }
    return {role: made[role]().reshape(roles[role][1].shape).to(roles[role][1].dtype)
            for role in needs}
