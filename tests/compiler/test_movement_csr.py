"""The traversal steps' movement CSRs (``steps_triton.movement_csr``): a backward chain that
reverses a forward one is that CSR transposed, bit for bit equal to composing it afresh."""
import sys
from pathlib import Path

import pytest
import torch

from hector import Graph
from hector.compiler.steps_torch import GraphIndex
from hector.compiler.steps_triton import _reversed_chain, movement_csr

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
    d[m.row_ids(), m.col.long()] = m.val.double()
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
