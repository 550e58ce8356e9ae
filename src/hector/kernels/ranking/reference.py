"""Filtered ranks in plain torch ops: the CPU's path and the kernel's reference.

:func:`scores_torch` is the one definition of a score kind over every entity (the decoders of
:mod:`hector.nn.kge` form their all-entity tables through it); :func:`ranks_from_scores`
ranks the truth in a dense score table, filtered entities left out; :func:`filtered_ranks_torch`
joins them a chunk of queries at a time, so no more than about :data:`CHUNK_ELEMENTS` scores
exist at once.
"""
from __future__ import annotations

import torch

from ..ptr import rows_of_entries

#: Score kinds: ``q . e``, ``-|q - e|_1``, ``-|q - e|_2``.
KINDS = ("dot", "l1", "l2")
#: Scores a reference chunk holds at most (its queries times the entities).
CHUNK_ELEMENTS = 1 << 22


def scores_torch(q: torch.Tensor, entities: torch.Tensor, kind: str) -> torch.Tensor:
    """``[B, N]`` scores of query rows ``q`` ``[B, D]`` against every row of ``entities``
    ``[N, D]``, in their dtype and differentiable: ``q @ entities.T`` ("dot") or minus the L1 /
    L2 distance ("l1", "l2").  Distances are summed over the differences, never through
    ``|q|^2 + |e|^2 - 2 q.e`` (which cancels: equal rows would not score exactly 0)."""
    if kind == "dot":
        return q @ entities.t()
    p = 1.0 if kind == "l1" else 2.0
    return -torch.cdist(q, entities, p=p, compute_mode="donot_use_mm_for_euclid_dist")


def ranks_from_scores(scores: torch.Tensor, truth: torch.Tensor, filt_ptr: torch.Tensor,
                      filt_col: torch.Tensor) -> torch.Tensor:
    """``[B]`` float64 ranks of ``truth`` (``[B]`` entity ids) in each row of ``scores``
    ``[B, N]``: ``1 + #greater + #equal / 2`` over the entities other than the truth and the
    row's filtered ones (row ``i``'s are ``filt_col[filt_ptr[i]:filt_ptr[i + 1]]``; the truth
    among them changes nothing)."""
    return _ranks(scores, truth, rows_of_entries(filt_ptr, filt_col.numel()), filt_col)


def _ranks(scores: torch.Tensor, truth: torch.Tensor, rows: torch.Tensor,
           cols: torch.Tensor) -> torch.Tensor:
    """:func:`ranks_from_scores` with the filtered entities as (row, entity) pairs, where row
    ``B`` (one past the last) marks a pair to ignore."""
    b, n = scores.shape
    at = torch.arange(b, device=scores.device)
    truth = truth.long()
    mine = scores[at, truth].unsqueeze(1)
    keep = torch.ones(b + 1, n, dtype=torch.bool, device=scores.device)
    keep[at, truth] = False
    keep[rows, cols.long()] = False
    keep = keep[:b]
    greater = ((scores > mine) & keep).sum(1)
    equal = ((scores == mine) & keep).sum(1)
    return 1.0 + greater.double() + equal.double() / 2


def filtered_ranks_torch(q: torch.Tensor, entities: torch.Tensor, kind: str,
                         truth: torch.Tensor, filt_ptr: torch.Tensor,
                         filt_col: torch.Tensor) -> torch.Tensor:
    """:func:`hector.kernels.ranking.filtered_ranks` (arguments as there, already checked),
    a chunk of queries at a time.  16-bit rows are scored in fp32, as the kernel does."""
    if q.dtype in (torch.float16, torch.bfloat16):
        q, entities = q.float(), entities.float()
    b, n = q.shape[0], entities.shape[0]
    step = max(1, CHUNK_ELEMENTS // max(n, 1))
    rows = rows_of_entries(filt_ptr, filt_col.numel())
    out = []
    for lo in range(0, b, step):
        hi = min(b, lo + step)
        # The chunk's own filtered pairs; the others go to the ignored row (no host read).
        local = torch.where((rows >= lo) & (rows < hi), rows - lo, hi - lo)
        out.append(_ranks(scores_torch(q[lo:hi], entities, kind), truth[lo:hi], local,
                          filt_col))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64, device=q.device)
