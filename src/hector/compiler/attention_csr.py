"""The torch backend's attention on CPU tensors as sparse-CSR products, for a fused attention
whose every operand is a node row (GAT, AGNN, Transformer programs): the steps of
``kernels.attention.csr`` (the op's torch path uses them too), every head's weights in one
block-diagonal CSR matrix kept on the graph: no ``[E, H, D]`` gather or ``index_add``, which
made the edge-by-edge form far slower on the CPU (docs/perf-notes.md, "Attention layers on
the CPU").

Same math as ``steps_torch.attention_torch_lse`` / ``attention_bwd_torch`` (which stay the
reference and the path everywhere else): the forward returns the output and the
log-sum-exp, the backward recomputes the weights from them.  Never under autograd (the IR
autodiff's plans run in the autograd Function's forward and backward, without grad)."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ..kernels.attention import csr
from ..kernels.attention.reference import dropout_keep
from ..kernels.reduce import accumulating
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


_acc = accumulating


def _scores(att, roles, lay):
    """(activated score, pre-activation score) per CSR entry ``[N*H*deg]``."""
    got = {r: _acc(roles[r][1]) for r in ("q", "k", "a_src", "a_dst") if r in roles}
    return csr.scores(lay, got.get("q"), got.get("k"), got.get("a_src"), got.get("a_dst"),
                      att.attr("scale"), att.attr("slope"), _acc(roles["v"][1]).dtype)


def _kept(att, roles, lay, heads: int, n_edges: int) -> Optional[torch.Tensor]:
    """Per CSR entry: 0 for a dropped (edge, head), ``1 / (1 - p)`` for a kept one (the
    kernels' mask, a hash of the seed and the canonical edge id); None without dropout."""
    p = att.attr("dropout", 0.0)
    if p == 0:
        return None
    keep = dropout_keep(roles["seed"][1], torch.arange(n_edges), heads, p)
    return keep.reshape(-1).index_select(0, lay.keep_index).to(torch.float32) / (1.0 - p)


def forward(att, roles: dict, graph):
    """``(out [N, H, Dv], lse [N, H])`` of the attention, without its epilogue term."""
    value = roles["v"][1]
    heads = value.shape[1]
    lay = csr.layout(graph, heads)
    t, _ = _scores(att, roles, lay)
    alpha, lse = csr.softmax(lay, t)
    z = _kept(att, roles, lay, heads, graph.num_edges)
    weights = alpha if z is None else alpha * z.to(alpha.dtype)
    out = csr.spmm(lay, weights, _acc(value))
    return out.to(value.dtype), lse.view(-1, heads)


def backward(att, roles: dict, graph, grad: torch.Tensor, lse: torch.Tensor,
             needs) -> Dict[str, torch.Tensor]:
    """Role -> gradient on the role's rows, as ``steps_torch.attention_bwd_torch`` forms
    them (the weights recomputed from the forward's log-sum-exp)."""
    value = roles["v"][1]
    heads = value.shape[1]
    lay = csr.layout(graph, heads)
    t, s = _scores(att, roles, lay)
    alpha = torch.exp(t - _acc(lse).reshape(-1).index_select(0, lay.row))
    z = _kept(att, roles, lay, heads, graph.num_edges)
    g = _acc(grad).contiguous()
    weights = alpha if z is None else alpha * z
    ds = None
    if any(r != "v" for r in needs):
        d_alpha = csr.sddmm(lay, g, _acc(value))
        ds = csr.score_grad(lay, alpha, d_alpha if z is None else d_alpha * z, s,
                            att.attr("slope"))
    q, k = (_acc(roles[r][1]) if r in roles else None for r in ("q", "k"))
    got = csr.role_grads(lay, needs, ds, weights, g, q, k, att.attr("scale"))
    return {role: grad.reshape(roles[role][1].shape).to(roles[role][1].dtype)
            for role, grad in got.items()}
