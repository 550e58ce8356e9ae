"""The index structures a ``Graph`` holds, as small frozen records.

Every edge-indexed array refers to the graph's *canonical* edge order: edges sorted by
(relation, destination), ties kept in input order.  Per-relation segments of that order are
what the segment GEMM template walks; the CSRs and compact maps point back into it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterator, List

import torch


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
        counts are exact in float64."""
        parts = [p for d in degree_arrays for p in DegreeStats.parts(d, super_threshold)]
        values = torch.stack(parts).tolist() if parts else []
        return DegreeStats.from_values(degree_arrays, values, super_threshold)

    @staticmethod
    def parts(degrees: torch.Tensor, super_threshold: int) -> List[torch.Tensor]:
        """The 0-d device tensors a :class:`DegreeStats` of ``degrees`` is made of (none for
        an empty array; float64 and int64, which ``torch.stack`` / ``cat`` promote to
        float64, exact below 2^53), for a caller that reads them with other values at once.
        Seven ops (ten before: two compare-sum-cast triples for the isolated and super
        counts; on CUDA count_nonzero is two kernels, so eight launches against ten):
        every mini-batch block and derived attention graph runs them twice."""
        if not degrees.numel():
            return []
        d = degrees.to(torch.float64)
        # (the isolated count is the array's length less its nonzero count)
        return [d.mean(), d.std(unbiased=False), degrees.max(), torch.count_nonzero(degrees),
                (degrees >= super_threshold).sum()]

    @staticmethod
    def from_values(degree_arrays: List[torch.Tensor], values: List[float],
                    super_threshold: int) -> List["DegreeStats"]:
        """The statistics of each array from the host values of their :meth:`parts`, in order."""
        out = []
        for degrees in degree_arrays:
            if degrees.numel() == 0:
                out.append(DegreeStats(0, 0.0, 0.0, 0, 0, super_threshold))
                continue
            (mean, std, mx, nonzero, sup), values = values[:5], values[5:]
            out.append(DegreeStats(int(mx), mean, std / mean if mean > 0 else 0.0,
                                   degrees.numel() - int(nonzero), int(sup), super_threshold))
        return out
