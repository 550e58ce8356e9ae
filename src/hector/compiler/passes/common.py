"""What every pass shares: the decision record, the graph statistics the cost models read,
and the pass signature ``run(outputs, stats, enabled) -> (outputs, decisions)``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ir import CDST, CSRC, EDGE, NODE


@dataclass(frozen=True)
class Decision:
    """One rewrite a pass applied or declined, and why (what ``explain`` prints)."""
    pass_name: str
    what: str
    applied: bool
    reason: str

    def __str__(self) -> str:
        return f"[{self.pass_name}] {'applied' if self.applied else 'declined'}: {self.what} -- {self.reason}"


@dataclass(frozen=True)
class GraphStats:
    """Row counts of each row kind: the cost models' only input from the graph."""
    num_nodes: int
    num_edges: int
    compact_src_rows: int
    compact_dst_rows: int
    num_relations: int
    num_node_types: int

    @staticmethod
    def of(graph) -> "GraphStats":
        return GraphStats(graph.num_nodes, graph.num_edges, graph.compact_src.num_rows,
                          graph.compact_dst.num_rows, graph.num_relations, graph.num_node_types)

    def rows(self, kind: str) -> int:
        return {NODE: self.num_nodes, EDGE: self.num_edges, CSRC: self.compact_src_rows,
                CDST: self.compact_dst_rows}[kind]


def rows_or_none(stats: Optional[GraphStats], kind: str) -> Optional[int]:
    return None if stats is None else stats.rows(kind)
