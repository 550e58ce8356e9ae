"""Tile-size arithmetic shared by every kernel family (one definition, so that block sizes,
autotuning buckets and launch grids round the same way), and :class:`DeviceBounds`, segment
bounds that a graph keeps on the device and the kernels size their grids for."""
from dataclasses import dataclass

import torch


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (launch grids)."""
    return -(-int(a) // int(b))


@dataclass(frozen=True, eq=False)
class DeviceBounds:
    """Segment bounds the host never reads (a capacity block's per-relation row counts, the
    same CUDA graph replayed for every mini-batch): ``ptr`` ``[S + 1]`` non-decreasing on the
    device, ``ptr[0] == 0``, ``ptr[-1] <= capacity``, a static bound the launches are sized
    for (see :mod:`hector.kernels.segment_mm.bounds`)."""
    ptr: torch.Tensor
    capacity: int

    @property
    def num_segments(self) -> int:
        return self.ptr.numel() - 1
