"""Every mini-batch is a graph of a new shape: the compiled-plan cache of a ``Program`` must
keep only the most recently used shapes (LRU), so training by mini-batches does not grow it
without end."""
import pytest
import torch

from hector import Graph
from hector.compiler import models
from hector.compiler.program import PLAN_CACHE_SIZE, Program
from hector.loader import NeighborLoader
from hector.compiler.passes.common import GraphStats


def blocks(n):
    g = torch.Generator().manual_seed(0)
    graph = Graph(torch.randint(0, 80, (2, 400), generator=g),
                  edge_type=torch.randint(0, 2, (400,), generator=g), num_relations=2)
    loader = NeighborLoader(graph, [3], batch_size=5, shuffle=True, seed=0)
    out = {}                 # the first block of each shape (the plan cache's key)
    for b in loader:
        out.setdefault(GraphStats.of(b.blocks[0]), b.blocks[0])
    assert len(out) >= n, "the test needs blocks of distinct shapes"
    return list(out.values())[:n]


def program(size=None):
    return Program(models.rgcn, in_dim=4, out_dim=3, num_bases=None, num_blocks=None,
                   aggr="mean", root_weight=True, bias=True, num_relations=2, backend="torch",
                   plan_cache_size=size)


def run(p, block):
    weights = {"weight": torch.randn(2, 4, 3), "root": torch.randn(4, 3), "bias": torch.randn(3)}
    return p(block, {"x": torch.randn(block.num_nodes, 4)}, weights)[0]


def test_plan_cache_keeps_the_most_recently_used_shapes():
    p = program(size=3)
    bs = blocks(5)
    for b in bs[:3]:
        run(p, b)
    assert len(p._cache) == 3
    run(p, bs[0])                       # a hit: bs[0] becomes the most recent
    run(p, bs[3])                       # a miss: evicts the least recent, bs[1]
    run(p, bs[4])                       # evicts bs[2]
    kept = {k[0] for k in p._cache}
    assert kept == {GraphStats.of(b) for b in (bs[0], bs[3], bs[4])}
    out = run(p, bs[1])                 # an evicted shape compiles again and still runs
    assert out.shape == (bs[1].num_nodes, 3) and len(p._cache) == 3


def test_plan_cache_size_default_and_environment(monkeypatch):
    assert program().plan_cache_size == PLAN_CACHE_SIZE
    monkeypatch.setenv("HECTOR_PLAN_CACHE_SIZE", "5")
    assert program().plan_cache_size == 5
    monkeypatch.setenv("HECTOR_PLAN_CACHE_SIZE", "zero")
    with pytest.raises(ValueError, match="HECTOR_PLAN_CACHE_SIZE"):
        program()
    with pytest.raises(ValueError, match="plan_cache_size"):
        program(size=0)
