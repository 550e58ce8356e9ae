"""Merging per-group softmax states into their destination node: RGAT's attention.

RGAT's destination term depends on the relation, so its fused attention runs on a graph whose
destination rows are (dst, relation) groups (``hector.compiler.steps_triton``): each group
``g`` gets its own softmax output ``o_g`` and log-sum-exp ``l_g``.  The softmax over all of a
node's edges is then a merge of its groups' states -- the same rescaling FlashDecoding uses
for split rows:

    lse_v = log sum_g exp(l_g),    out_v = sum_g exp(l_g - lse_v) o_g

``hector::attention_merge_groups`` does that in one pass over group-sized rows (one program per
node, reading its groups through ``order[ptr[v]:ptr[v+1]]``).  Its autograd (only reached when
torch autograd records the forward; the IR autodiff differentiates the whole attention as one
operator) is, with ``w_g = exp(l_g - lse_v)``: ``do_g = w_g dout_v`` and
``dl_g = w_g (<dout_v, o_g - out_v> + dlse_v)``.
"""
from __future__ import annotations

from typing import Tuple

import torch

from .. import registry
from ..eager import call
from ..sizes import next_pow2

#: Largest head block x feature block one merge program holds.
_MAX_TILE = 8192


def merge_groups(ptr: torch.Tensor, order: torch.Tensor, node: torch.Tensor, o: torch.Tensor,
                 lse: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out ``[N, H, D]``, lse ``[N, H]`` fp32) of the nodes from their groups' (``o [G, H,
    D]``, ``lse [G, H]``).  ``node [G]``: each group's node; ``order``: the groups sorted by
    node, node ``v``'s at ``order[ptr[v]:ptr[v+1]]`` (on the compiler's side
    ``GraphIndex.grouped(NODE, CDST, "dst")``)."""
    return call(merge_groups_op, ptr, order, node, o.contiguous(), lse.contiguous().float())


@torch.library.custom_op("hector::attention_merge_groups", mutates_args=())
def merge_groups_op(ptr: torch.Tensor, order: torch.Tensor, node: torch.Tensor,
                    o: torch.Tensor, lse: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    n = ptr.numel() - 1
    heads, dim = o.shape[1], o.shape[2]
    out = o.new_empty((n, heads, dim))
    lse_n = lse.new_empty((n, heads))
    if n > 0:
        block_dv = next_pow2(dim)
        block_h = min(next_pow2(heads), max(1, _MAX_TILE // block_dv))
        registry.kernel("merge_groups")[(n, -(-heads // block_h))](
            ptr, order, o, lse, out, lse_n, heads, dim, BLOCK_H=block_h, BLOCK_DV=block_dv)
    return out, lse_n


@merge_groups_op.register_fake
def _(ptr, order, node, o, lse):
    n = ptr.shape[0] - 1
    return o.new_empty((n,) + tuple(o.shape[1:])), lse.new_empty((n, o.shape[1]))


def _setup_context(ctx, inputs, output):
    _, _, node, o, lse = inputs
    ctx.save_for_backward(node, o, lse, *output)


def _backward(ctx, dout, dlse):
    node, o, lse_g, out, lse = ctx.saved_tensors
    w = torch.exp(lse_g - lse.index_select(0, node))                       # [G, H]
    d = torch.zeros_like(out) if dout is None else dout.float()
    d_g = d.index_select(0, node)
    dl = (d_g * (o.float() - out.float().index_select(0, node))).sum(-1)
    if dlse is not None:
        dl = dl + dlse.index_select(0, node)
    return None, None, None, (w[..., None] * d_g).to(o.dtype), w * dl


merge_groups_op.register_autograd(_backward, setup_context=_setup_context)
