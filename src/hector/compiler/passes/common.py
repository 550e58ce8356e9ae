"""What every pass shares: the decision record, the graph statistics the cost models read,
the one question they may ask of them, and the pass signature
``run(outputs, stats, enabled) -> (outputs, decisions)``.

A pass's rewrites may depend on the graph only through :class:`Cheaper` questions, each
recorded in the :class:`Decision` it led to (``applied`` is its answer).  That is what lets
one compilation serve every graph that answers those questions the same way (see
:mod:`hector.compiler.pipeline`): a mini-batch's blocks differ in row counts, not in the
outcome of the cost models.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from ...graph.capacity import compact_rows
from ..ir import CDST, CSRC, EDGE, NODE, Op, Value, WEIGHT


@dataclass(frozen=True)
class Decision:
    """One rewrite a pass applied or declined, and why (what ``explain`` prints)."""
    pass_name: str
    what: str
    applied: bool
    reason: str
    #: the graph question whose answer ``applied`` is (None: the decision does not depend on
    #: the graph's row counts)
    question: Optional["Cheaper"] = None

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
    #: every relation leaves nodes of one node type (``Graph.relation_source_types``), so a
    #: per-node-type weight of the sources can be re-sliced per relation (``ir.wsrc``).  Not
    #: a row count: a stage is shared only between graphs that agree on it (``program``).
    typed_sources: bool = False
    #: every node has an incoming edge (read from the graph's degree statistics, kept on the
    #: host when it was built; False on a mini-batch block, whose sources have none).  Not a
    #: row count either: asked by :class:`EveryRowHasEdges`.
    every_row_has_edges: bool = False

    @staticmethod
    def of(graph, typed: bool = True) -> "GraphStats":
        """``typed``: ask the graph for ``typed_sources`` (on a graph without names, one read
        of its edges); a program without per-node-type weights passes False (never needs
        it).  A capacity block's compact rows are bounds (``graph.capacity``)."""
        src, dst = compact_rows(graph)
        covered = not graph.is_block and graph.in_degree.num_isolated == 0
        return GraphStats(graph.num_nodes, graph.num_edges, src, dst, graph.num_relations,
                          graph.num_node_types,
                          typed and graph.relation_source_types() is not None, covered)

    def rows(self, kind: str) -> int:
        return {NODE: self.num_nodes, EDGE: self.num_edges, CSRC: self.compact_src_rows,
                CDST: self.compact_dst_rows, ONE: 1}[kind]


#: A cost term's row kind that counts one on every graph: a fixed price.
ONE = "one"


@dataclass(frozen=True)
class EveryRowHasEdges:
    """The question "does every node of this graph have an incoming edge?" (a rewrite that
    adds a bias after an aggregation rests on it), kept with a compiled stage like a
    :class:`Cheaper`."""

    def answer(self, stats: "GraphStats") -> bool:
        return stats.every_row_has_edges


#: A cost: the sum of ``coefficient x rows of kind`` over its terms (multiply-adds, rows moved).
Cost = Tuple[Tuple[int, str], ...]


@dataclass(frozen=True)
class Cheaper:
    """The question "does ``new`` cost less than ``old`` on this graph?", both linear in the
    graph's row counts.  Frozen and made of ints and row kinds, so a compiled plan can keep
    its questions and put them to another graph's statistics."""
    new: Cost
    old: Cost

    @staticmethod
    def cost(terms: Cost, stats: "GraphStats") -> int:
        return sum(c * stats.rows(kind) for c, kind in terms)

    def answer(self, stats: "GraphStats") -> bool:
        return self.cost(self.new, stats) < self.cost(self.old, stats)


def rows_or_none(stats: Optional[GraphStats], kind: str) -> Optional[int]:
    return None if stats is None else stats.rows(kind)


def bias_split(v: Value) -> Optional[Tuple[Value, Optional[Value]]]:
    """``(x, b)`` for ``v = x + b`` with ``b`` a weight and ``x`` not (a linear and its bias
    row, as the reorder rules read them); ``(v, None)`` when ``v`` is no addition; None for an
    addition of other terms."""
    if v.op != Op.ADD:
        return v, None
    w = [a for a in v.args if a.kind == WEIGHT]
    rest = [a for a in v.args if a.kind != WEIGHT]
    if len(w) != 1 or len(rest) != 1:
        return None
    return rest[0], w[0]
