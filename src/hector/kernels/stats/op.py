"""``bin_facts`` and ``degree_facts``: five int64 facts of a count array, as a ``[5]`` device
tensor that the caller reads back with its other host values (one sync).

On CUDA one generated kernel (``count_facts``, behind the ``hector::count_facts`` custom op)
computes all five in one pass, plus the zero fill of its output: two launches, where the torch
reductions they replace were 7 (degrees) and 12 (row bins) launches an array, paid by every
new mini-batch block (two degree arrays a block, two or three row-binned CSRs a layer's
forward and backward).  Elsewhere (the CPU, where a reduction launches nothing) the torch
reference in :mod:`.reference` runs; both give the same integers.
"""
from __future__ import annotations

import torch

from .. import registry
from ..eager import call
from ..sizes import cdiv
from .reference import bin_facts_torch, degree_facts_torch

#: Counts a program folds (one atomic per fact per program).
BLOCK = 4096
#: The facts' count (each kind's output length).
NUM_FACTS = 5


def bin_facts(ptr: torch.Tensor, short_max: int, chunk: int) -> torch.Tensor:
    """``[5]`` int64 facts of the row lengths ``ptr[1:] - ptr[:-1]`` (at least one row):
    [rows with at most ``short_max`` entries, their longest, the other rows' total entries,
    the longest row, the chunks of ``chunk`` entries the other rows make]."""
    _check(ptr, "ptr", 2)
    if ptr.is_cuda:
        return call(count_facts_op, ptr, True, "bins", int(short_max), int(chunk))
    return bin_facts_torch(ptr, short_max, chunk)


def degree_facts(degrees: torch.Tensor, threshold: int) -> torch.Tensor:
    """``[5]`` int64 facts of ``degrees`` (at least one): [sum, sum of squares, max, nonzero
    count, count >= ``threshold``]."""
    _check(degrees, "degrees", 1)
    if degrees.is_cuda:
        return call(count_facts_op, degrees, False, "degrees", int(threshold), 1)
    return degree_facts_torch(degrees, threshold)


def _check(t: torch.Tensor, name: str, least: int) -> None:
    if t.dim() != 1 or t.numel() < least or t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be a 1-D int32/int64 tensor of at least {least} "
                         f"entries, got {tuple(t.shape)} {t.dtype}")


def launch_count_facts(values: torch.Tensor, from_ptr: bool, kind: str, limit: int,
                       chunk: int) -> torch.Tensor:
    """The generated kernel (CUDA, or Triton's interpreter in tests)."""
    values = values.contiguous()       # (the kernel reads consecutive entries)
    n = values.numel() - 1 if from_ptr else values.numel()
    out = torch.zeros(NUM_FACTS, dtype=torch.int64, device=values.device)
    if n > 0:
        kernel = registry.kernel("count_facts", from_ptr=from_ptr, kind=kind)
        kernel[(cdiv(n, BLOCK),)](values, n, out, limit, chunk, BLOCK=BLOCK)
    return out


@torch.library.custom_op("hector::count_facts", mutates_args=())
def count_facts_op(values: torch.Tensor, from_ptr: bool, kind: str, limit: int,
                   chunk: int) -> torch.Tensor:
    return launch_count_facts(values, from_ptr, kind, limit, chunk)


@count_facts_op.register_fake
def _(values, from_ptr, kind, limit, chunk):
    return values.new_empty(NUM_FACTS, dtype=torch.int64)
