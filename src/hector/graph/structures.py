"""The index structures a ``Graph`` holds, as small frozen records.

Every edge-indexed array refers to the graph's *canonical* edge order: edges sorted by
(relation, destination), ties kept in input order.  Per-relation segments of that order are
what the segment GEMM template walks; the CSRs and compact maps point back into it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Iterator, List

import torch

from ..kernels.stats import degree_facts


def _tensors(record) -> Iterator[torch.Tensor]:
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, torch.Tensor):
            yield value


def nbytes_of(*records) -> int:
    return sum(t.numel() * t.element_size() for r in records for t in _tensors(r))


def move(record, device):
    return type(record)(**{f.name: (getattr(record, f.name).to(device)
                                    if isinstance(getattr(record, f.name), torch.Tensor)
                                    else getattr(record, f.name)) for f in fields(record)})


@dataclass(frozen=True, eq=False)
class CSR:
    """Compressed rows over one endpoint of the edges.

    Row ``v`` holds entries ``ptr[v]:ptr[v+1]``; ``col`` is the other endpoint of each entry
    and ``eid`` the entry's position in the canonical edge order (so an edge-wise tensor stored
    canonically is read as ``values[eid]``).  Within a row, entries are ordered by relation,
    then by input order.
    """
    ptr: torch.Tensor   # [num_nodes + 1]
    col: torch.Tensor   # [num_edges]
    eid: torch.Tensor   # [num_edges]

    def degrees(self) -> torch.Tensor:
        return self.ptr[1:] - self.ptr[:-1]


@dataclass(frozen=True, eq=False)
class CompactMap:
    """Unique (node, relation) pairs among one endpoint of the edges (compact materialization).

    A value that depends only on (src, relation) is computed once per row here instead of once
    per edge.  Rows are sorted by (relation, node); relation ``r`` owns rows
    ``rel_ptr[r]:rel_ptr[r+1]``, and ``edge_row[e]`` is the row of canonical edge ``e``.
    """
    node: torch.Tensor      # [num_rows]
    rel: torch.Tensor       # [num_rows]
    rel_ptr: torch.Tensor   # [num_relations + 1]
    edge_row: torch.Tensor  # [num_edges]

    @property
    def num_rows(self) -> int:
        return int(self.node.shape[0])

    def narrowed(self, idx: torch.dtype) -> "CompactMap":
        """The same map with ids in ``idx`` (a graph's index dtype), relations in int32."""
        return CompactMap(node=self.node.to(idx), rel=self.rel.to(torch.int32),
                          rel_ptr=self.rel_ptr.to(idx), edge_row=self.edge_row.to(idx))


@dataclass(frozen=True)
class DegreeStats:
    """Summary of one degree distribution (in- or out-degree), as Python numbers.

    ``cv`` is the coefficient of variation (std / mean), DF-GNN's measure of skew; a *super
    node* is one whose degree is at least ``super_threshold``.
    """
    max: int
    mean: float
    cv: float
    num_isolated: int
    num_super: int
    super_threshold: int

    @staticmethod
    def of(degrees: torch.Tensor, super_threshold: int) -> "DegreeStats":
        return DegreeStats.of_each([degrees], super_threshold)[0]

    @staticmethod
    def of_each(degree_arrays: List[torch.Tensor], super_threshold: int) -> List["DegreeStats"]:
        """The statistics of each array, read back in one host round trip (each read is a
        device sync on CUDA, and every mini-batch block and derived graph pays them); the
        counts and sums are exact integers."""
        parts = [DegreeStats.parts(d, super_threshold) for d in degree_arrays if d.numel()]
        values = torch.cat(parts).tolist() if parts else []
        return DegreeStats.from_values(degree_arrays, values, super_threshold)

    @staticmethod
    def parts(degrees: torch.Tensor, super_threshold: int) -> torch.Tensor:
        """The ``[5]`` int64 device tensor a :class:`DegreeStats` of a non-empty ``degrees``
        is made of (its sum, sum of squares, max, nonzero and super-node counts), for a
        caller that reads it with other values at once: one generated kernel on CUDA
        (:func:`hector.kernels.stats.degree_facts`; seven torch reductions, eight launches,
        before), every mini-batch block and derived attention graph running it twice."""
        return degree_facts(degrees, super_threshold)

    @staticmethod
    def from_values(degree_arrays: List[torch.Tensor], values: List[int],
                    super_threshold: int) -> List["DegreeStats"]:
        """The statistics of each array from the host values of their :meth:`parts`, in order
        (none for an empty array).  Mean and population standard deviation from the exact
        integer sums: ``var = (n * sum_sq - sum^2) / n^2``, in Python's integers."""
        out = []
        for degrees in degree_arrays:
            n = degrees.numel()
            if n == 0:
                out.append(DegreeStats(0, 0.0, 0.0, 0, 0, super_threshold))
                continue
            (total, sum_sq, mx, nonzero, sup), values = (int(v) for v in values[:5]), values[5:]
            mean = total / n
            std = math.sqrt(max(n * sum_sq - total * total, 0)) / n
            out.append(DegreeStats(mx, mean, std / mean if mean > 0 else 0.0, n - nonzero, sup,
                                   super_threshold))
        return out
