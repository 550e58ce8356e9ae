"""``AttentionGraph``: the derived graphs of the compiler's attention steps hold exactly the
fields the fused attention op reads, equal to those of a full ``Graph`` of the same edges."""
import sys
from pathlib import Path

import pytest
import torch

from hector import Graph
from hector.compiler.steps_torch import GraphIndex
from hector.compiler.steps_triton.attention import _derived_graph
from hector.compiler.ir import CSRC, EDGE
from hector.graph.derived import ATTENTION_FIELDS, AttentionGraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import random_relational  # noqa: E402


def assert_same_fields(light: AttentionGraph, full: Graph):
    assert isinstance(light, Graph)
    for name in ("num_nodes", "num_edges", "num_relations", "num_node_types", "device",
                 "index_dtype"):
        assert getattr(light, name) == getattr(full, name), name
    for name in ATTENTION_FIELDS:
        a, b = getattr(light, name), getattr(full, name)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), name
        elif name.startswith("csr"):
            for part in ("ptr", "col", "eid"):
                x, y = getattr(a, part), getattr(b, part)
                assert x.dtype == y.dtype and torch.equal(x, y), (name, part)
        else:
            assert a == b, name


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])   # (CUDA: search ptrs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(3))
def test_attention_graph_equals_a_full_graph(seed, device):
    g = torch.Generator().manual_seed(seed)
    n, e = 30, 120      # parallel edges, self loops, isolated ids, a hub: all likely here
    src = torch.randint(0, n, (e,), generator=g).to(device)
    dst = torch.cat([torch.zeros(20, dtype=torch.long), torch.randint(0, n - 5, (e - 20,),
                                                                       generator=g)]).to(device)
    full = Graph(torch.stack([src, dst]), num_nodes=n)
    assert_same_fields(AttentionGraph(src, dst, n), full)
    order = torch.sort(dst, stable=True).indices        # dst sorted: no sort is run
    assert_same_fields(AttentionGraph(src[order], dst[order], n, dst_sorted=True),
                       Graph(torch.stack([src[order], dst[order]]), num_nodes=n))
    # The order given (the stable sort of dst, here the full build's): no sort either.
    assert_same_fields(AttentionGraph(src, dst, n, dst_order=full.edge_perm), full)
    # As the compiler gives it: a relational graph's own destinations and its csr_in.eid.
    ei, et = random_relational(num_nodes=n, num_edges=e, num_relations=3, seed=seed)
    rel = Graph(ei.to(device), edge_type=et.to(device), num_nodes=n, num_relations=3)
    ix = GraphIndex(rel)
    rows, m = ix.move(CSRC, EDGE, "src"), max(ix.rows[CSRC], n)
    assert_same_fields(AttentionGraph(rows, rel.dst, m, dst_order=rel.csr_in.eid),
                       Graph(torch.stack([rows, rel.dst.long()]), num_nodes=m))
    assert light_csr_out_is_lazy(AttentionGraph(src, dst, n))


def light_csr_out_is_lazy(light):
    """Whether the CSR by source waits for its first use (a sort no forward needs)."""
    return light._csr_out is None and light.csr_out is light._csr_out


def test_attention_graph_rejects_a_dst_order_of_another_length():
    src = dst = torch.tensor([0, 1, 1])
    with pytest.raises(ValueError, match="dst_order"):
        AttentionGraph(src, dst, 2, dst_order=torch.tensor([0, 1]))


def test_attention_graph_without_edges_and_its_missing_fields():
    none = torch.zeros(0, dtype=torch.long)
    light = AttentionGraph(none, none, 4)
    assert_same_fields(light, Graph(torch.zeros(2, 0, dtype=torch.long), num_nodes=4))
    with pytest.raises(AttributeError, match="compact_src.*derived attention graph"):
        light.compact_src
    with pytest.raises(ValueError, match="src and dst"):
        AttentionGraph(none, torch.zeros(1, dtype=torch.long), 4)


@pytest.mark.parametrize("kind", [CSRC, EDGE])
def test_compiler_derived_graphs_equal_the_full_graphs_they_replace(kind):
    ei, et = random_relational(num_nodes=24, num_edges=90, num_relations=4)
    g = Graph(ei, edge_type=et, num_nodes=24, num_relations=4)
    ix = GraphIndex.of(g)
    rows = ix.move(kind, EDGE, "src") if kind == CSRC else torch.arange(g.num_edges)
    S = ix.rows[kind]
    # sources: (source rows) -> nodes, one id range for both (not sorted by destination)
    sources = Graph(torch.stack([rows, g.dst.long()]), num_nodes=max(S, g.num_nodes))
    assert_same_fields(_derived_graph(ix, kind), sources)
    assert _derived_graph(ix, kind) is _derived_graph(ix, kind)      # memoised on the graph


def test_degree_stats_of_each_read_once_equal_one_by_one():
    from hector.graph.structures import DegreeStats
    degs = [torch.tensor([0, 3, 1, 1200, 0]), torch.zeros(0, dtype=torch.long),
            torch.tensor([2, 2], dtype=torch.int32)]
    both = DegreeStats.of_each(degs, 1000)
    for d, s in zip(degs, both):
        vals = [float(x) for x in d.tolist()]
        n = len(vals)
        mean = sum(vals) / n if n else 0.0
        std = (sum((x - mean) ** 2 for x in vals) / n) ** 0.5 if n else 0.0
        assert s.max == (max(vals) if n else 0) and s.num_isolated == vals.count(0.0)
        assert s.num_super == sum(x >= 1000 for x in vals)
        assert s.mean == pytest.approx(mean) and s.cv == pytest.approx(std / mean if mean else 0.0)
        assert s == DegreeStats.of(d, 1000)
