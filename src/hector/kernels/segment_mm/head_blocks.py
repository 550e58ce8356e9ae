"""Per-head column weights ``a_i [H, C, 1]`` as one block-diagonal ``[H*C, k*H]`` matrix
(``hector::head_blocks``) and its gradient (``hector::head_blocks_backward``), one kernel
each way.

The matrix is the weight of one product that forms every per-head score ``<z_h, a_i[h]>`` of
``z [N, H, C]`` at once (GAT's two score terms, in the projection GEMM's epilogue:
``segment_mm(..., extra_weight=)``).  Built with torch ops it costs a stack and a broadcast
product forward and as many again backward, launches a small graph's step pays for next to
the GEMM the matrix saves; here the kernel writes every element (zeros included, so the
output needs no fill) and the backward reads the blocks back out into one ``[k, H, C]``
buffer whose slices are the parts' gradients.  Triton on CUDA or under ``TRITON_INTERPRET=1``,
the same copies in torch ops elsewhere (:func:`head_blocks_torch`, also the tests'
reference).
"""
from __future__ import annotations

from typing import List, Sequence

import torch

from ...device import triton_available
from .. import registry
from ..sizes import next_pow2

#: Most parts one kernel takes (the registry renders one kernel per count).
MAX_PARTS = 8
_BLOCK_R = 64


def head_blocks_torch(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The block-diagonal matrix in torch ops (differentiable): ``[H*C, k*H]`` with
    ``out[h*C + c, i*H + h] = parts[i][h, c, 0]``."""
    H, C, _ = parts[0].shape
    if H == 1:                       # one head: the columns side by side, no zeros
        return torch.cat([p.reshape(C, 1) for p in parts], 1)
    stacked = torch.stack([p[..., 0] for p in parts], 1)                 # [H, k, C]
    eye = torch.eye(H, dtype=stacked.dtype, device=stacked.device)
    return torch.einsum("hkc,hg->hckg", stacked, eye).reshape(H * C, len(parts) * H)


def _check(parts: Sequence[torch.Tensor]) -> None:
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"head_blocks: 1 to {MAX_PARTS} parts, got {len(parts)}")
    shape, dtype, device = parts[0].shape, parts[0].dtype, parts[0].device
    if len(shape) != 3 or shape[2] != 1 or any(
            p.shape != shape or p.dtype != dtype or p.device != device for p in parts):
        raise ValueError(f"head_blocks: parts must be [H, C, 1] of one dtype and device, got "
                         f"{[(tuple(p.shape), p.dtype, str(p.device)) for p in parts]}")


def head_blocks(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The block-diagonal matrix of ``parts`` (each ``[H, C, 1]``), differentiable: one
    kernel forward, one backward where Triton runs; torch ops elsewhere."""
    parts = list(parts)
    _check(parts)
    return head_blocks_op(parts)


@torch.library.custom_op("hector::head_blocks", mutates_args=())
def head_blocks_op(parts: List[torch.Tensor]) -> torch.Tensor:
    if not triton_available(parts[0].device):
        return head_blocks_torch(parts).contiguous()
    H, C, _ = parts[0].shape
    k = len(parts)
    out = torch.empty(H * C, k * H, dtype=parts[0].dtype, device=parts[0].device)
    strides = [s for p in parts for s in (p.stride(0), p.stride(1))]
    registry.kernel("head_blocks", parts=k)[(-(-H * C // _BLOCK_R),)](
        *parts, out, H, C, *strides, BLOCK_R=_BLOCK_R, BLOCK_J=next_pow2(k * H))
    return out


@head_blocks_op.register_fake
def _(parts):
    H, C, _ = parts[0].shape
    return parts[0].new_empty(H * C, len(parts) * H)


@torch.library.custom_op("hector::head_blocks_backward", mutates_args=())
def head_blocks_backward_op(grad: torch.Tensor, parts: int) -> torch.Tensor:
    """``[parts, H, C]``: each part's blocks out of the matrix's gradient ``grad``."""
    rows, cols = grad.shape
    H = cols // parts
    C = rows // H
    if not triton_available(grad.device):
        blocks = grad.reshape(H, C, parts, H).diagonal(dim1=0, dim2=3)     # [C, k, H]
        return blocks.permute(1, 2, 0).contiguous()
    out = torch.empty(parts, H, C, dtype=grad.dtype, device=grad.device)
    registry.kernel("head_blocks_bwd", parts=parts)[(-(-rows // _BLOCK_R),)](
        grad, out, H, C, grad.stride(0), grad.stride(1), BLOCK_R=_BLOCK_R)
    return out


@head_blocks_backward_op.register_fake
def _(grad, parts):
    rows, cols = grad.shape
    H = cols // parts
    return grad.new_empty(parts, H, rows // H)


def _setup_context(ctx, inputs, output):
    ctx.parts = len(inputs[0])


def _backward(ctx, grad):
    blocks = head_blocks_backward_op(grad, ctx.parts)
    # (slices of one contiguous buffer: each a dense [H, C, 1] gradient, stolen as it is by
    # the parameters' .grad)
    return [b.unsqueeze(-1) for b in blocks.unbind(0)]


head_blocks_op.register_autograd(_backward, setup_context=_setup_context)
