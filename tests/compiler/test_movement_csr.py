"""The traversal steps' movement CSRs (``steps_triton.traversal.movement_csr``): a backward
chain that reverses a forward one is that CSR transposed, bit for bit equal to composing it
afresh."""
import sys
from pathlib import Path

import pytest
import torch

from hector import Graph
from hector.compiler.steps_torch import GraphIndex
from hector.compiler.steps_triton.traversal import (_movement_factor, _reversed_chain,
                                                    movement_csr)
from hector.kernels.traversal.csr import compose

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import random_relational  # noqa: E402

#: RGCN's forward aggregation chain (gather to edges by source, mean per (dst, relation)),
#: and one whose factors both weigh by 1 / count.
CHAINS = [(("gather", "node", "edge", "src", None), ("scatter", "compact_dst", "edge", "dst", "mean")),
          (("gather", "compact_src", "edge", "src", "mean"), ("scatter", "node", "edge", "dst", "mean"))]


def graph(seed):
    ei, et = random_relational(num_nodes=30, num_edges=150, num_relations=3, seed=seed)
    return Graph(ei, edge_type=et, num_nodes=30, num_relations=3)


def dense(m):
    d = torch.zeros(m.rows, m.cols, dtype=torch.float64)
    d.index_put_((m.row_ids(), m.col.long()), m.val.double(), accumulate=True)
    return d


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("chain", CHAINS, ids=["rgcn", "two-means"])
def test_reversed_chain_is_the_transpose_bit_for_bit(chain, seed):
    back = _reversed_chain(chain)
    assert _reversed_chain(back) == chain
    fresh = movement_csr(GraphIndex(graph(seed)), back, 0.5)     # composed from its factors
    ix = GraphIndex(graph(seed))
    fwd = movement_csr(ix, chain, 0.5)
    reused = movement_csr(ix, back, 0.5)                         # the forward's, transposed
    for a, b in ((reused.ptr, fresh.ptr), (reused.col, fresh.col), (reused.val, fresh.val)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert torch.allclose(dense(reused), dense(fwd).t())
    bins = [(m.layout.num_short, m.layout.num_long, m.layout.short_max) for m in (reused, fresh)]
    assert bins[0] == bins[1]


MOVES = [("node", "edge", "dst"), ("node", "edge", "src"), ("compact_dst", "edge", "dst"),
         ("compact_src", "edge", "src"), ("node", "compact_dst", "dst"),
         ("node", "compact_src", "src")]


def graphs():
    """A relational graph (empty relations, isolated nodes), its loader-style build (edges
    sorted by (destination, relation)), one node with self loops, no edges."""
    ei, et = random_relational(num_nodes=30, num_edges=150, num_relations=3, seed=4)
    order = torch.sort(ei[1] * 3 + et, stable=True).indices
    return [Graph(ei, edge_type=et, num_nodes=30, num_relations=3),
            Graph(ei[:, order], edge_type=et[order], num_nodes=30, num_relations=3,
                  dst_sorted=True),
            Graph(torch.zeros(2, 3, dtype=torch.long), edge_type=torch.tensor([0, 1, 1]),
                  num_nodes=1, num_relations=2),
            Graph(torch.zeros(2, 0, dtype=torch.long), num_nodes=5)]


@pytest.mark.parametrize("g", range(4))
@pytest.mark.parametrize("move", MOVES, ids="-".join)
def test_grouped_rows_equal_a_stable_sort_of_the_movement(move, g):
    ix = GraphIndex(graphs()[g])
    idx, n = ix.move(*move), ix.rows[move[0]]
    perm = torch.sort(idx, stable=True).indices
    ptr = torch.zeros(n + 1, dtype=torch.int64)
    ptr[1:] = torch.cumsum(torch.bincount(idx, minlength=n), 0)
    got_ptr, got_perm = ix.grouped(*move)
    assert got_ptr.dtype == got_perm.dtype == torch.int64
    assert torch.equal(got_ptr, ptr) and torch.equal(got_perm, perm)
    assert ix.grouped(*move)[1] is got_perm          # kept per graph


@pytest.mark.parametrize("g", range(4))
@pytest.mark.parametrize("move", MOVES, ids="-".join)
def test_scatter_from_groups_equals_from_coo(move, g):
    from hector.kernels.traversal.csr import from_coo, from_groups
    ix = GraphIndex(graphs()[g])
    idx, one, many = ix.move(*move), ix.rows[move[0]], ix.rows[move[1]]
    mean = ix.counts(*move).index_select(0, idx).reciprocal()
    for val in (None, mean):
        want = from_coo(idx, torch.arange(many), val, one, many, distinct=True)
        got = from_groups(*ix.grouped(*move), val, one, many)
        for a, b in ((got.ptr, want.ptr), (got.col, want.col), (got.val, want.val)):
            assert a.dtype == b.dtype and torch.equal(a, b)
        assert (got.rows, got.cols) == (want.rows, want.cols)


def _composed(ix, chain):
    """The chain as the product of its factors (every path, repeats merged)."""
    m = None
    for move in chain:
        f = _movement_factor(ix, move)
        m = f if m is None else compose(f, m)
    return m


@pytest.mark.parametrize("g", range(4))
@pytest.mark.parametrize("chain", CHAINS + [tuple(_reversed_chain(c)) for c in CHAINS],
                         ids=["rgcn", "two-means", "rgcn-back", "two-means-back"])
def test_gather_then_scatter_is_one_entry_per_moved_row(chain, g):
    """Built from the scatter's grouping (no composition): the same matrix as the product of
    the factors, with one entry per edge (parallel edges apart, adding up to the merged
    entry), each row's entries in edge order."""
    graph_ = graphs()[g]
    ix = GraphIndex(graph_)
    got = movement_csr(ix, chain)
    want = _composed(GraphIndex(graph_), chain)
    assert (got.rows, got.cols) == (want.rows, want.cols)
    assert got.nnz == graph_.num_edges and got.col.dtype == torch.int32
    torch.testing.assert_close(dense(got), dense(want), rtol=1e-6, atol=1e-7)
    ptr, perm = ix.grouped(*chain[1][1:4])
    assert torch.equal(got.ptr, ptr)
    assert torch.equal(got.col.long(), ix.move(*chain[0][1:4]).index_select(0, perm))
