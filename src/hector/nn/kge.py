r"""Knowledge-graph decoders: score (head, relation, tail) triples from entity embeddings (an
encoder's output rows, e.g. R-GCN's) and a relation table of their own.

* :class:`DistMult` (Yang et al. 2015, R-GCN's decoder): :math:`f(h, r, t) = \langle e_h,
  w_r, e_t\rangle = \sum_i e_{h,i} w_{r,i} e_{t,i}`;
* :class:`TransE` (Bordes et al. 2013): :math:`f(h, r, t) = -\lVert e_h + w_r - e_t
  \rVert_p`;
* :class:`ComplEx` (Trouillon et al. 2016): :math:`f(h, r, t) = \mathrm{Re}\langle e_h, w_r,
  \bar e_t\rangle` with the first half of a row its real part and the second its imaginary.

Each scores given triples (``forward``) and, for link prediction's ranking, one side of a
batch of queries against every entity at once (``score_tails`` for ``(h, r, ?)``,
``score_heads`` for ``(?, r, t)``): one ``[B, D] x [D, N]`` product for DistMult and ComplEx,
``torch.cdist`` for TransE, with no ``[B, N, D]`` intermediate.  Each forms that table from one
query row per query scored against the entity rows as they are (``ranking_rows``: the row and
its score kind), so link prediction's ranking kernel can rank every entity without it
(:mod:`hector.kernels.ranking`).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .. import checks as C
from ..kernels.ranking.reference import scores_torch


class _Decoder(nn.Module):
    """The shared relation table and checks; subclasses define the scores."""

    def __init__(self, num_relations: int, dim: int, even: bool = False):
        super().__init__()
        C.check_size(num_relations, "num_relations")
        C.check_size(dim, "dim")
        if even and dim % 2:
            raise ValueError(f"dim must be even (real and imaginary halves), got {dim}")
        self.num_relations, self.dim = num_relations, dim
        self.rel = nn.Parameter(torch.empty(num_relations, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = math.sqrt(6.0 / (self.num_relations + self.dim))
        nn.init.uniform_(self.rel, -bound, bound)

    def _check(self, rel: torch.Tensor, *rows: torch.Tensor) -> None:
        C.check_index(rel, "rel", 1)
        for name, t in zip(("head or tail rows", "tail rows"), rows):
            if t.dim() != 2 or t.shape[1] != self.dim:
                raise ValueError(f"{name} must be [B, dim={self.dim}], got {tuple(t.shape)}")
        if len(rows) == 2 and rows[0].shape[0] != rows[1].shape[0]:
            raise ValueError(f"head and tail rows must be as many, got {rows[0].shape[0]} "
                             f"and {rows[1].shape[0]}")
        if rows and rel.shape[0] != rows[0].shape[0]:
            raise ValueError(f"rel must hold one relation per row ({rows[0].shape[0]}), got "
                             f"{rel.shape[0]}")
        if C.debug_enabled():
            C.check_range(rel, "rel", self.num_relations, "num_relations")

    def forward(self, head: torch.Tensor, rel: torch.Tensor, tail: torch.Tensor):
        """``[B]`` scores of triples: ``head``, ``tail`` ``[B, dim]`` entity rows, ``rel``
        ``[B]`` relation ids."""
        self._check(rel, head, tail)
        return self._score(head, self.rel[rel], tail)

    def score_tails(self, head: torch.Tensor, rel: torch.Tensor, entities: torch.Tensor):
        """``[B, N]``: the query ``(head, rel, ?)`` scored against every row of ``entities``
        ``[N, dim]`` as its tail."""
        self._check(rel, head)
        return self._all(head, self.rel[rel], entities, tails=True)

    def score_heads(self, rel: torch.Tensor, tail: torch.Tensor, entities: torch.Tensor):
        """``[B, N]``: the query ``(?, rel, tail)`` scored against every row of ``entities``
        as its head."""
        self._check(rel, tail)
        return self._all(tail, self.rel[rel], entities, tails=False)

    def ranking_rows(self, known: torch.Tensor, rel: torch.Tensor, tails: bool):
        """``(q, kind)``: the all-entity scores of the queries ``(known, rel, ?)`` (``tails``)
        or ``(?, rel, known)`` are ``scores_torch(q, entities, kind)``
        (:func:`hector.kernels.ranking.scores_torch`), ``q`` ``[B, D']`` one row per query
        and ``kind`` "dot", "l1" or "l2"; ``known`` ``[B, dim]`` entity rows."""
        self._check(rel, known)
        return self._rows(known, self.rel[rel], tails)

    def _all(self, known, w, entities, tails: bool):
        q, kind = self._rows(known, w, tails)
        return scores_torch(q, entities, kind)


class DistMult(_Decoder):
    r"""DistMult: :math:`\sum_i e_{h,i} w_{r,i} e_{t,i}` (diagonal relation matrices,
    symmetric in head and tail), R-GCN's link-prediction decoder.

    Args:
        num_relations: relation ids in ``[0, num_relations)``.
        dim: the entity rows' width.
    """

    def _score(self, h, w, t):
        return (h * w * t).sum(1)

    def _rows(self, known, w, tails: bool):
        return known * w, "dot"


class TransE(_Decoder):
    r"""TransE: :math:`-\lVert e_h + w_r - e_t\rVert_p` (a relation is a translation).

    Args:
        num_relations, dim: as in :class:`DistMult`.
        p: the norm, 1 or 2.
    """

    def __init__(self, num_relations: int, dim: int, p: int = 1):
        if p not in (1, 2):
            raise ValueError(f"p must be 1 or 2, got {p!r}")
        super().__init__(num_relations, dim)
        self.p = p

    def _score(self, h, w, t):
        return -torch.linalg.vector_norm(h + w - t, ord=self.p, dim=1)

    def _rows(self, known, w, tails: bool):
        # tails: |(h + w) - e|; heads: |e + w - t| = |e - (t - w)|
        return (known + w if tails else known - w), ("l1" if self.p == 1 else "l2")


class ComplEx(_Decoder):
    r"""ComplEx: :math:`\mathrm{Re}\langle e_h, w_r, \bar e_t\rangle`, rows holding the real
    parts in their first half and the imaginary parts in the second.

    Args:
        num_relations, dim: as in :class:`DistMult` (``dim`` even).
    """

    def __init__(self, num_relations: int, dim: int):
        super().__init__(num_relations, dim, even=True)

    @staticmethod
    def _parts(x):
        return x.chunk(2, dim=-1)

    def _score(self, h, w, t):
        (hr, hi), (wr, wi), (tr, ti) = self._parts(h), self._parts(w), self._parts(t)
        return (hr * wr * tr + hi * wr * ti + hr * wi * ti - hi * wi * tr).sum(1)

    def _rows(self, known, w, tails: bool):
        (kr, ki), (wr, wi) = self._parts(known), self._parts(w)
        if tails:      # Re((h w) conj(t)): coefficients of t's real and imaginary parts
            a, b = kr * wr - ki * wi, ki * wr + kr * wi
        else:          # Re(h (w conj(t))): coefficients of h's real and imaginary parts
            a, b = wr * kr + wi * ki, wr * ki - wi * kr
        return torch.cat([a, b], 1), "dot"
