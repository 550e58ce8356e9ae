"""AGNN's score inputs, ``k = x / max(||x||, eps)`` and ``q = beta k``, as one kernel each way.

Written with torch ops (``F.normalize``, a broadcast product and their autograd), these cost
one norm reduction and two broadcast elementwise passes forward, and about ten elementwise
and reduction kernels backward: on a 169K x 128 fp32 graph that glue took 1.17 ms of a 2.40 ms
AGNN training step (H200), more than the three attention kernels.  Here each direction reads the
rows once more than it must (a second pass over a row, from L1/L2) and writes them once:

* ``hector::cosine_qk(x, beta) -> (q, k, norm)``, ``norm [N]`` fp32 (the clamped norm the
  backward needs; it carries no gradient);
* ``hector::cosine_qk_backward(dq, dk, x, norm, beta) -> (dx, dbeta)``.

Both are custom operators (opaque to torch.compile, capturable in CUDA graphs); they run the
Triton kernels (``templates/cosine.py.j2``) on CUDA or under ``TRITON_INTERPRET=1`` and the
same math in torch ops elsewhere (:func:`cosine_qk_torch`, :func:`cosine_qk_backward_torch`,
also the tests' and the compiler's torch backend's reference).
"""
from __future__ import annotations

from typing import Tuple

import torch

from ...device import triton_available
from .. import registry
from ..eager import call
from ..sizes import next_pow2

#: ``F.normalize``'s default floor on the norm.
EPS = 1e-12
#: Rows per program and the widest feature tile a program loads at once.
_BLOCK_R, _MAX_BLOCK_D = 16, 128


def cosine_qk(x: torch.Tensor, beta: torch.Tensor, with_norm: bool = False):
    """``(beta * k, k)`` with ``k = F.normalize(x, dim=-1)``, for ``x [N, D]`` and a
    one-element ``beta`` (differentiable in both); ``with_norm``: also the clamped norm ``[N]``
    fp32 that divided each row (no gradient; the attention's ``k_norm``, which forms k from
    x's rows instead of gathering k)."""
    if x.dim() != 2:
        raise ValueError(f"x must be [num_nodes, features], got {tuple(x.shape)}")
    if beta.numel() != 1 or beta.dtype != x.dtype or beta.device != x.device:
        raise ValueError(f"beta must be one element of x's dtype and device ({x.dtype}, "
                         f"{x.device}), got {tuple(beta.shape)} {beta.dtype} {beta.device}")
    q, k, norm = call(cosine_qk_op, x.contiguous(), beta.reshape(1))
    # Features that need no gradient (a first layer's inputs): k then needs none either, so
    # the attention backward skips its source-side kernel (dk), the costliest of the three.
    k = k if x.requires_grad else k.detach()
    return (q, k, norm.detach()) if with_norm else (q, k)


def cosine_qk_torch(x: torch.Tensor, beta: torch.Tensor):
    """(q, k, norm) in torch ops: the reference of the kernel and its CPU path.  Computed in
    fp32 at least, as the kernel does; a float64 ``x`` in float64, its norm too (the
    compiler's torch backend, a float64 reference: the op returns the norm in fp32)."""
    work = torch.promote_types(x.dtype, torch.float32)
    norm = torch.linalg.vector_norm(x.to(work), dim=-1).clamp_min(EPS)
    k = (x.to(work) / norm[:, None]).to(x.dtype)
    return (k.to(work) * beta.to(work)).to(x.dtype), k, norm


def cosine_qk_backward_torch(dq: torch.Tensor, dk: torch.Tensor, x: torch.Tensor,
                             norm: torch.Tensor, beta: torch.Tensor):
    """(dx, dbeta) in torch ops: the reference of the backward kernel and its CPU path, in
    the precision of :func:`cosine_qk_torch`.  ``dx = (g - k <g, k>) / norm`` with ``g = dk
    + beta dq`` (``g / eps`` where the norm is clamped), ``dbeta = <dq, k>``."""
    work = torch.promote_types(x.dtype, torch.float32)
    n = norm.to(work)[:, None]
    k = x.to(work) / n
    g = dk.to(work) + beta.to(work) * dq.to(work)
    gk = torch.where(norm > EPS, (g * k).sum(-1), 0.0)[:, None]
    return ((g - k * gk) / n).to(x.dtype), (dq.to(work) * k).sum().reshape(1).to(beta.dtype)


def _grid(rows: int):
    return (max(1, -(-rows // _BLOCK_R)),)


def _block_d(dim: int) -> int:
    return min(next_pow2(dim), _MAX_BLOCK_D)


@torch.library.custom_op("hector::cosine_qk", mutates_args=())
def cosine_qk_op(x: torch.Tensor, beta: torch.Tensor
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not triton_available(x.device):
        q, k, norm = cosine_qk_torch(x, beta)
        return q, k, norm.float()
    rows, dim = x.shape
    q, k = torch.empty_like(x), torch.empty_like(x)
    norm = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        registry.kernel("cosine_qk")[_grid(rows)](x, beta, q, k, norm, rows, dim, EPS,
                                                  BLOCK_R=_BLOCK_R, BLOCK_D=_block_d(dim))
    return q, k, norm


@cosine_qk_op.register_fake
def _(x, beta):
    return torch.empty_like(x), torch.empty_like(x), x.new_empty(x.shape[0], dtype=torch.float32)


@torch.library.custom_op("hector::cosine_qk_backward", mutates_args=())
def cosine_qk_backward_op(dq: torch.Tensor, dk: torch.Tensor, x: torch.Tensor,
                          norm: torch.Tensor, beta: torch.Tensor
                          ) -> Tuple[torch.Tensor, torch.Tensor]:
    if not triton_available(x.device):
        return cosine_qk_backward_torch(dq, dk, x, norm, beta)
    rows, dim = x.shape
    dx = torch.empty_like(x)
    grid = _grid(rows)
    part = (torch.empty if rows else torch.zeros)(grid[0], dtype=torch.float32, device=x.device)
    if rows:
        registry.kernel("cosine_qk_bwd")[grid](dq, dk, x, norm, beta, dx, part, rows, dim, EPS,
                                               BLOCK_R=_BLOCK_R, BLOCK_D=_block_d(dim))
    return dx, part.sum().reshape(1).to(beta.dtype)


@cosine_qk_backward_op.register_fake
def _(dq, dk, x, norm, beta):
    return torch.empty_like(x), torch.empty_like(beta)


def _setup_context(ctx, inputs, output):
    x, beta = inputs
    # k is saved by the attention that reads it anyway: keeping it here costs no memory.
    ctx.save_for_backward(x, output[1], output[2], beta)
    ctx.set_materialize_grads(False)       # norm's gradient (always) and k's (x without
    #                                        gradient) stay None instead of zeros to fill


def _backward(ctx, dq, dk, _dnorm):
    x, k, norm, beta = ctx.saved_tensors
    if dq is None and dk is None:
        return None, None
    if not ctx.needs_input_grad[0]:            # beta's gradient alone: <dq, k>, one launch
        if dq is None:
            return None, torch.zeros_like(beta)
        return None, torch.dot(dq.reshape(-1), k.reshape(-1)).reshape(1).to(beta.dtype)
    dq = torch.zeros_like(x) if dq is None else dq.contiguous()
    dk = torch.zeros_like(x) if dk is None else dk.contiguous()
    dx, dbeta = call(cosine_qk_backward_op, dq, dk, x, norm, beta)
    return dx, dbeta


cosine_qk_op.register_autograd(_backward, setup_context=_setup_context)
