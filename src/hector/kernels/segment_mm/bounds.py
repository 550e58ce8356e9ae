"""Segment bounds the host never reads: a batch's per-relation row counts kept in device
memory, so that one CUDA graph replays the segment GEMM for every batch.

A segment GEMM's bounds are usually Python ints (``seg_ptr`` read once on the host): the
tile map gives each segment ``ceil(M_s / block)`` programs and the output has ``M`` rows.
:class:`~hector.kernels.sizes.DeviceBounds` instead keeps ``seg_ptr`` on the device next
to a *capacity*, a static bound on ``seg_ptr[-1]``: the grid is sized for the worst case
(``ceil(capacity / block) + S`` programs: each segment wastes less than one tile), the tile
map is built on the device from ``seg_ptr`` with no host read, and the programs past the
batch's tiles get empty tiles (no rows), so they store nothing.  Output rows past
``seg_ptr[-1]`` are zero.

At the custom operators' boundary (``int[]`` bounds in their schemas) device bounds travel as
``bounds = [capacity]`` plus the ``seg_ptr`` tensor; :func:`layout` turns the pair back into
a :class:`DeviceBounds`.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from ..sizes import DeviceBounds, cdiv

Bounds = Union[Tuple[int, ...], DeviceBounds]


def as_bounds(bounds: Union[Sequence[int], Bounds]) -> Bounds:
    """Device bounds as they are; host bounds (any sequence of ints) as a tuple of ints."""
    if isinstance(bounds, DeviceBounds):
        return bounds
    return tuple(int(b) for b in bounds)


def layout(bounds: Sequence[int], seg_ptr: Optional[torch.Tensor]) -> Bounds:
    """The bounds a custom operator was called with: host ints, or with ``seg_ptr`` the
    device bounds whose capacity is ``bounds[0]``."""
    if seg_ptr is None:
        return as_bounds(bounds)
    return DeviceBounds(seg_ptr, int(bounds[-1]))


def op_args(bounds: Bounds) -> Tuple[List[int], Optional[torch.Tensor]]:
    """``layout``'s inverse: (``bounds``, ``seg_ptr`` or None) for a custom operator."""
    if isinstance(bounds, DeviceBounds):
        return [bounds.capacity], bounds.ptr
    return list(bounds), None


def total_rows(bounds: Bounds) -> int:
    """Logical rows the launches are sized for: ``seg_ptr[-1]``, or the capacity."""
    return bounds.capacity if isinstance(bounds, DeviceBounds) else bounds[-1]


def num_segments(bounds: Bounds) -> int:
    return bounds.num_segments if isinstance(bounds, DeviceBounds) else len(bounds) - 1


def device_tile_map(bounds: DeviceBounds, block: int) -> torch.Tensor:
    """``[ceil(capacity / block) + S, 3]`` int64 (segment, first row, end row) per program,
    the layout of :func:`.launch.tile_map` built from ``bounds.ptr`` by a few device ops:
    segment ``s``'s tiles come in order, then empty tiles ``(0, 0, 0)`` fill the grid."""
    ptr = bounds.ptr.long()
    s = bounds.num_segments
    if s == 0:
        return torch.zeros(cdiv(bounds.capacity, block), 3, dtype=torch.int64,
                           device=ptr.device)
    count = torch.div(ptr[1:] - ptr[:-1] + (block - 1), block, rounding_mode="floor")
    ends = torch.cumsum(count, 0)                       # each segment's last tile + 1
    t = torch.arange(cdiv(bounds.capacity, block) + s, device=ptr.device)
    seg = torch.searchsorted(ends, t, right=True)       # == S past the batch's tiles
    live = seg < s
    seg = seg.clamp(max=max(s - 1, 0))
    start = ptr[seg] + (t - (ends[seg] - count[seg])) * block
    end = torch.minimum(start + block, ptr[seg + 1])
    zero = torch.zeros((), dtype=torch.int64, device=ptr.device)
    return torch.stack([torch.where(live, seg, zero), torch.where(live, start, zero),
                        torch.where(live, end, zero)], 1)
