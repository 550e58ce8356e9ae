"""``floyd_table``: per group, a uniform ``min(d, k)``-subset of its ``d`` candidates.

On CUDA (and under Triton's interpreter when a device seed is given) one generated kernel
draws every group's picks in registers, one program per ``BLOCK_R`` groups: one launch where
the torch version is ``width`` steps of ~8 ops each.  Its random numbers come from Philox
keyed by a seed in device memory (``seed``), which the caller advances in place after each
call, so a captured CUDA graph draws anew at every replay.  Elsewhere the torch reference
(:mod:`.reference`) runs with a ``torch.Generator``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .. import registry
from ...device import interpreting
from ..sizes import cdiv
from .reference import floyd_table_torch

#: Groups a program draws for.
BLOCK_R = 32
#: The widest table the kernel keeps in registers (lanes per group).
MAX_WIDTH = 256


def floyd_table(deg: torch.Tensor, k: torch.Tensor, width: int,
                generator: Optional[torch.Generator] = None,
                seed: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """A ``[groups, width]`` int64 table (``width`` >= every ``k`` where ``deg > k``) whose row
    ``g`` holds, ascending in its first ``min(deg[g], k[g])`` lanes, a uniform ``k[g]``-subset
    of ``[0, deg[g])`` (all of it where ``deg[g] <= k[g]``), and the mask of those lanes.  No
    host read.

    ``seed``: a 1-element int64 device tensor keying the kernel's random numbers, advanced by
    one in place (the kernel runs where it is given, on CUDA or under Triton's interpreter,
    and ``width <= MAX_WIDTH``); otherwise ``generator`` draws them through the torch path."""
    if seed is not None and width <= MAX_WIDTH and (deg.is_cuda or interpreting()):
        picks = launch_floyd(deg, k, width, seed)
        seed.add_(1)
        lanes = torch.arange(width, device=deg.device)
        return picks, lanes[None, :] < torch.minimum(deg, k)[:, None]
    if generator is None:
        raise ValueError("floyd_table needs a generator where the kernel does not run "
                         "(no seed given, the CPU, or width > MAX_WIDTH)")
    return floyd_table_torch(deg, k, width, generator)


def launch_floyd(deg: torch.Tensor, k: torch.Tensor, width: int,
                 seed: torch.Tensor) -> torch.Tensor:
    """The generated kernel's table (its mask is the caller's)."""
    n = deg.numel()
    if n * max(width, 1) >= 2 ** 31:
        raise ValueError(f"floyd_table: {n} groups x width {width} exceed the kernel's int32 "
                         "random-stream offsets")
    out = torch.empty(n, width, dtype=torch.int64, device=deg.device)
    if n and width:
        kernel = registry.kernel("floyd")
        w = 1 << (width - 1).bit_length()
        kernel[(cdiv(n, BLOCK_R),)](deg.contiguous(), k.contiguous(), n, width, seed, out,
                                    W=w, BLOCK_R=BLOCK_R)
    return out
