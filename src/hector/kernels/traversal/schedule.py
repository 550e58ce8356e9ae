"""How a traversal walks its rows: decided on the host, once per CSR, from the row lengths.

A lowered traversal can be anything from a pure gather (edge-sized rows, one entry each) to an
aggregation over a power-law in-degree (most rows short, a few hubs with 10^5 entries).  One
program per row serves neither end: a gather wastes 15 of 16 entry lanes and launches one tiny
program per edge, and a hub row serialises a whole kernel behind one program.  So the rows
are split into bins when the CSR is built (the only host reads; a launch reads nothing):

* **short** rows (at most :data:`SHORT_MAX` entries, empty rows included): the *multi-row*
  kernel, ``BLOCK_R`` rows per program, one entry of every row per step;
* **long** rows: the *row* kernel, one program per row walking ``BLOCK_E`` entries per step;
* rows longer than :data:`CHUNK` entries are cut into chunks of ``CHUNK`` entries: the row
  kernel sums each chunk into an fp32 partial row, and the multi-row kernel sums each long
  row's partials in chunk order and runs the epilogue (two passes, no atomics: the result is
  bitwise the same on every run).

All bins are walked in a fixed order, so results are deterministic; bins differ only in how
the fp32 sums are associated.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from ..sizes import next_pow2
from ..stats import bin_facts

#: Rows with at most this many entries go to the multi-row kernel.
SHORT_MAX = 8
#: Rows with more entries than this are summed in chunks of this many (hub rows).
CHUNK = 1024


@dataclass(frozen=True, eq=False)
class RowBins:
    """The rows of a CSR split by length (see the module docstring).

    ``short`` / ``long``: int32 row ids of each bin, or None when the bin holds every row (no
    row list is read) or none (nothing is launched: see ``num_short`` / ``num_long``);
    ``short_max`` / ``long_mean``: the bins' longest row and mean length (tile choices).
    Hub rows, when some row exceeds :data:`CHUNK` entries: every long row is cut into chunks
    of ``CHUNK`` entries, ``chunk_start`` / ``chunk_end`` ``[chunks]`` their entry bounds (in
    long-row order), ``chunk_of`` ``[num_long + 1]`` the bounds of each long row's chunks."""
    num_short: int
    num_long: int
    short: Optional[torch.Tensor]
    long: Optional[torch.Tensor]
    short_max: int
    long_mean: float
    chunk_start: Optional[torch.Tensor] = None
    chunk_end: Optional[torch.Tensor] = None
    chunk_of: Optional[torch.Tensor] = None

    @property
    def num_chunks(self) -> int:
        return 0 if self.chunk_start is None else int(self.chunk_start.numel())


def one_long_bin(rows: int, nnz: int) -> RowBins:
    """Every row in the long bin, none cut into chunks, known without a read: what a CSR of
    a capacity block gets (its lengths vary per batch, its launches may not).  Right for any
    row lengths; a hub row is walked by one program."""
    return RowBins(0, rows, None, None, 0, nnz / max(rows, 1))


def row_bins(ptr: torch.Tensor, short_max: int = SHORT_MAX,
             chunk: Optional[int] = CHUNK) -> RowBins:
    """Bins of the rows of ``ptr`` (the host reads happen here, once per CSR); ``chunk`` None:
    long rows are never cut (edge softmax)."""
    pending = PendingBins.of(ptr, short_max, chunk)
    return pending.finish(pending.facts.tolist() if pending.facts is not None else [])


@dataclass(frozen=True, eq=False)
class PendingBins:
    """:func:`row_bins` up to its one host read: ``facts`` (a ``[5]`` device tensor, None for
    no rows) is what must be read; a caller with other values to read reads them together
    and calls :meth:`finish` with the facts' host values."""
    ptr: torch.Tensor
    facts: Optional[torch.Tensor]
    chunk: Optional[int]
    short_max: int = SHORT_MAX

    @staticmethod
    def of(ptr: torch.Tensor, short_max: int = SHORT_MAX,
           chunk: Optional[int] = CHUNK) -> "PendingBins":
        if ptr.numel() < 2:
            return PendingBins(ptr, None, chunk, short_max)
        # Every host fact in one read (each read is a device sync on CUDA, paid per CSR of
        # every new mini-batch block): the short count, the short rows' longest, the long
        # rows' total and longest, and how many chunks the long rows make (chunk None:
        # chunks of one entry, i.e. the long total).  One generated kernel on CUDA
        # (hector.kernels.stats; twelve torch ops before).
        return PendingBins(ptr, bin_facts(ptr, short_max, chunk if chunk is not None else 1),
                           chunk, short_max)

    def finish(self, facts: list) -> RowBins:
        """The bins, given the host values of ``facts`` (empty for no rows)."""
        ptr, chunk = self.ptr, self.chunk
        rows = ptr.numel() - 1
        if rows <= 0:
            return RowBins(0, 0, None, None, 0, 0.0)
        num_short, short_mx, total, longest, num_chunks = (int(v) for v in facts)
        num_long = rows - num_short
        if num_long == 0:
            return RowBins(rows, 0, None, None, short_mx, 0.0)
        split = num_short > 0     # a bin that holds every row needs no row list
        chunked = chunk is not None and longest > chunk
        # (the lengths again, on the device: only for row lists or chunks)
        counts = torch.diff(ptr) if split or chunked else None
        short_ids = long_ids = None
        if split:
            # Short row ids, then long ones, each ascending: sizes known, so no nonzero (a
            # sync).
            by_bin = torch.sort((counts > self.short_max).to(torch.uint8), stable=True).indices
            short_ids, long_ids = by_bin[:num_short], by_bin[num_short:]
        starts = ends = chunk_of = None
        if chunked:
            longs = long_ids if split else torch.arange(rows, device=ptr.device)
            per_row = (counts.index_select(0, longs) + (chunk - 1)) // chunk
            chunk_of = torch.zeros(num_long + 1, dtype=torch.int64, device=ptr.device)
            torch.cumsum(per_row, 0, out=chunk_of[1:])
            owner = torch.repeat_interleave(torch.arange(num_long, device=ptr.device),
                                            per_row, output_size=num_chunks)
            k = (torch.arange(owner.numel(), device=ptr.device)
                 - chunk_of[:-1].index_select(0, owner))
            row_end = ptr[1:].index_select(0, longs).index_select(0, owner)
            starts = ptr[:-1].index_select(0, longs).index_select(0, owner) + k * chunk
            ends = torch.minimum(starts + chunk, row_end)
        return RowBins(num_short, num_long,
                       short_ids.to(torch.int32) if split else None,
                       long_ids.to(torch.int32) if split else None,
                       short_mx, float(total) / num_long, starts, ends, chunk_of)


#: fp32 accumulator elements a program holds (``BLOCK_R x BLOCK_F`` or ``BLOCK_E x BLOCK_F``
#: tiles): 4096 is 32 registers a thread at 4 warps, room for the loads in flight.
TILE = 4096


@dataclass(frozen=True)
class Tiles:
    """Launch tiles of one traversal: ``block_f`` feature columns per program; ``block_r``
    rows per program of the multi-row kernel; ``block_e`` entries per step of the row kernel."""
    block_f: int
    block_r: int
    block_e: int
    num_warps: int


def pick_tiles(bins: RowBins, width: int) -> Tiles:
    """Tiles from the row bins and the row width (host facts; nothing read on the device).
    Wide tiles for wide rows; the row kernel's entry step follows the long rows' mean length
    (16 to 64 entries) within the same register budget."""
    block_f = min(next_pow2(width), 128)
    block_r = max(1, min(256, TILE // block_f))
    block_e = max(16, min(64, next_pow2(int(bins.long_mean)), TILE // block_f))
    return Tiles(block_f, block_r, block_e, 4)


def tile_configs(t: Tiles, multi: bool) -> tuple:
    """The autotuner's list around the heuristic ``t`` (first: the untimed default): half and
    twice the rows a program (multi-row kernel) or the entry step (row kernel), 8 warps."""
    if multi:
        alts = [replace(t, block_r=max(1, t.block_r // 2)), replace(t, block_r=t.block_r * 2)]
    else:
        alts = [replace(t, block_e=max(16, t.block_e // 2)), replace(t, block_e=t.block_e * 2)]
    out = [t]
    for c in alts + [replace(t, num_warps=8)]:
        if c not in out:
            out.append(c)
    return tuple(out)
