"""Link prediction's pieces: negative sampling by corruption and the filtered ranking metrics
(MRR, Hits@k) over every entity, both directions, computed on the device in batches.

Ranks are *filtered* (Bordes et al. 2013): when ranking the true tail of ``(h, r, t)``, every
other entity ``t'`` with ``(h, r, t')`` a known triple (train, valid or test) is left out, and
the same for heads.  Ties count half (the "realistic" rank: the mean of the optimistic and the
pessimistic one, ``1 + #greater + #equal / 2``), so a model scoring every entity alike ranks
the truth in the middle rather than first.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

from .. import checks as C
from ..kernels import ranking
from ..kernels.ranking.reference import ranks_from_scores

#: Hits@k reported by :func:`link_metrics`.
HITS = (1, 3, 10)


def _check_triples(triples: torch.Tensor, name: str, num_entities: int,
                   num_relations: Optional[int] = None) -> None:
    C.check_index(triples, name, 2)
    if triples.shape[0] != 3:
        raise ValueError(f"{name} must be [3, T] (head, relation, tail rows), got "
                         f"{tuple(triples.shape)}")
    if C.debug_enabled() and triples.numel():
        C.check_range(triples[[0, 2]].reshape(-1), name + " entities", num_entities,
                      "num_entities")
        if num_relations is not None:
            C.check_range(triples[1], name + " relations", num_relations, "num_relations")


def corrupt(triples: torch.Tensor, num_entities: int, k: int,
            generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``[3, T * k]`` negatives, ``k`` per positive (positive ``i``'s are columns
    ``i * k .. i * k + k - 1``): each replaces the head or the tail (a fair coin per negative)
    by an entity drawn uniformly from the *others*, so a negative never equals its positive.
    Known triples are not filtered out (they are rare among random corruptions).  Seeded by
    ``generator`` (on the triples' device)."""
    _check_triples(triples, "triples", num_entities)
    C.check_size(k, "k")
    if num_entities < 2:
        raise ValueError(f"num_entities must be >= 2 to corrupt a triple, got {num_entities}")
    dev = triples.device
    rep = triples.repeat_interleave(k, dim=1)
    n = rep.shape[1]
    tail = torch.randint(0, 2, (n,), generator=generator, device=dev).bool()
    draw = torch.randint(0, num_entities - 1, (n,), generator=generator, device=dev)
    old = torch.where(tail, rep[2], rep[0])
    new = draw + (draw >= old).long()          # [0, N) without ``old``
    out = rep.clone()
    out[0] = torch.where(tail, rep[0], new)
    out[2] = torch.where(tail, new, rep[2])
    return out


class KnownTriples:
    """Every known triple as two sorted keys, ``(h * R + r) * N + t`` and ``(t * R + r) * N +
    h``: a query's known answers are one contiguous range of each (two binary searches), found
    on the device for a whole batch of queries."""

    def __init__(self, triples: torch.Tensor, num_entities: int, num_relations: int):
        _check_triples(triples, "triples", num_entities, num_relations)
        self.num_entities, self.num_relations = num_entities, num_relations
        h, r, t = triples.long()
        n, rr = num_entities, num_relations
        self.by_tail = torch.sort((h * rr + r) * n + t).values
        self.by_head = torch.sort((t * rr + r) * n + h).values

    def answers(self, query: torch.Tensor, tails: bool):
        """(query position, answer entity) pairs: every known answer of each query key
        ``[B]`` (``h * R + r`` for tails, ``t * R + r`` for heads)."""
        keys = self.by_tail if tails else self.by_head
        n = self.num_entities
        lo = torch.searchsorted(keys, query * n)
        hi = torch.searchsorted(keys, (query + 1) * n)
        count = hi - lo
        which = torch.repeat_interleave(torch.arange(query.numel(), device=query.device),
                                        count)
        start = torch.repeat_interleave(lo - torch.cumsum(count, 0) + count, count)
        at = start + torch.arange(which.numel(), device=query.device)
        return which, keys[at] - query[which] * n

    def filters(self, query: torch.Tensor, tails: bool):
        """``(ptr, col)``: :meth:`answers` as a CSR over the ``[B]`` queries (query ``i``'s
        known answers, sorted, are ``col[ptr[i]:ptr[i + 1]]``), the filter of
        :func:`hector.kernels.ranking.filtered_ranks`; built on the device from the pairs,
        with no host read of its own."""
        which, answer = self.answers(query, tails)
        # ``which`` is sorted: row i's pairs start where the first row >= i stands.
        ptr = torch.searchsorted(which, torch.arange(query.numel() + 1, device=query.device))
        return ptr, answer


def filtered_ranks(scores: torch.Tensor, truth: torch.Tensor, query: torch.Tensor,
                   known: KnownTriples, tails: bool) -> torch.Tensor:
    """``[B]`` float ranks of ``truth`` (``[B]`` entity ids) in each row of ``scores``
    ``[B, N]``, the query's other known answers left out, ties counting half."""
    return ranks_from_scores(scores, truth, *known.filters(query, tails))


def link_metrics(entity: torch.Tensor, decoder, triples: torch.Tensor, known: KnownTriples,
                 batch_size: int = 512, progress: Optional[Callable[[int], None]] = None,
                 backend: str = "auto") -> Dict[str, float]:
    """Filtered ``mrr`` and ``hits1``/``hits3``/``hits10`` of ``triples`` ``[3, T]`` over every
    entity, both directions (tails of ``(h, r, ?)`` and heads of ``(?, r, t)``, 2T ranks),
    ``entity`` ``[N, dim]`` the encoder's rows and ``decoder`` a :mod:`hector.nn.kge` one.
    Ranks ``batch_size`` queries against all entities at a time: on CUDA (``backend``
    "auto", fp32/fp16/bf16 rows) with the fused kernel of
    :func:`hector.kernels.ranking.filtered_ranks`, which never forms the ``[batch, N]`` score
    table; elsewhere, or with ``backend="torch"``, through that table; ``backend="triton"``
    runs the kernel on any device (Triton's interpreter on the CPU).  ``progress(n)`` is
    called with each batch's query count.  One host read at the end."""
    _check_triples(triples, "triples", known.num_entities, known.num_relations)
    C.check_size(batch_size, "batch_size")
    if backend not in ranking.BACKENDS:
        raise ValueError(f"backend must be one of {ranking.BACKENDS}, got {backend!r}")
    if entity.dim() != 2 or entity.shape[0] != known.num_entities:
        raise ValueError(f"entity must be [num_entities={known.num_entities}, dim], got "
                         f"{tuple(entity.shape)}")
    ranks = []
    rr = known.num_relations
    with torch.no_grad():
        for lo in range(0, triples.shape[1], batch_size):
            h, r, t = triples[:, lo:lo + batch_size].long()
            # tails of (h, r, ?), then heads of (?, r, t)
            for tails, given, truth in ((True, h, t), (False, t, h)):
                q, kind = decoder.ranking_rows(entity[given], r, tails)
                ptr, col = known.filters(given * rr + r, tails)
                ranks.append(ranking.filtered_ranks(q, entity, kind, truth, ptr, col,
                                                    backend=backend))
            if progress is not None:
                progress(h.numel())
    rank = torch.cat(ranks) if ranks else torch.zeros(0, dtype=torch.float64)
    if rank.numel() == 0:
        return {"mrr": 0.0, **{f"hits{k}": 0.0 for k in HITS}}
    values = torch.stack([rank.reciprocal().mean()] + [(rank <= k).double().mean()
                                                        for k in HITS]).tolist()
    return dict(zip(["mrr"] + [f"hits{k}" for k in HITS], values))
