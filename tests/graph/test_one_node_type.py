"""``Graph.with_one_node_type``: a typed graph (a mini-batch block of a typed graph, say) as a
graph of one node type, sharing its index arrays; what ``hector train``'s one-type HGT runs
on a block instead of rebuilding it from per-relation edge lists."""
import sys
from pathlib import Path

import pytest
import torch

from hector import Graph
from hector.loader import NeighborLoader
from hector.nn import HGTConv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import host_reads  # noqa: E402

NAMES = [("n", f"r{r}", "n") for r in range(3)]


def typed_graph(seed=0, nodes=30, edges=160):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, nodes, (2, edges), generator=g)
    et = torch.randint(0, 3, (edges,), generator=g)
    nt = (torch.arange(nodes) * 3) // nodes          # three contiguous node types
    return Graph(ei, edge_type=et, num_nodes=nodes, num_relations=3, node_type=nt,
                 num_node_types=3)


def test_the_view_shares_every_index_array_and_reads_nothing():
    g = typed_graph()
    with host_reads() as seen:
        v = g.with_one_node_type("n", NAMES)
    assert seen == []
    for name in ("src", "dst", "etype", "edge_perm", "rel_ptr", "csr_in", "compact_src",
                 "compact_dst", "in_degree", "out_degree"):
        assert getattr(v, name) is getattr(g, name), name
    assert (v.num_node_types, v.node_type_names, v.relation_names) == (1, ["n"], NAMES)
    assert v.host_ptr["node"] == [0, g.num_nodes] and v.node_types_contiguous
    assert torch.equal(v.node_type, torch.zeros(g.num_nodes, dtype=torch.int32))
    assert v.relation_source_types() == (0, 0, 0)
    assert g.num_node_types == 3 and g.host_ptr["node"] != [0, g.num_nodes]   # unchanged
    assert g.with_one_node_type().relation_names == NAMES                      # the default


def test_a_blocks_view_is_an_ordinary_graph_over_its_sources():
    block = next(iter(NeighborLoader(typed_graph(), [4], batch_size=6, seed=0))).blocks[0]
    assert block.is_block and block.dst_index is not None   # typed: no destination prefix
    v = block.with_one_node_type("n", NAMES)
    assert not v.is_block and v.num_nodes == block.num_nodes and block.is_block


@pytest.mark.parametrize("names,match", [
    (NAMES[:2], "relation_names"),
    ([("n", "r0", "n"), ("m", "r1", "n"), ("n", "r2", "n")], "relation_names"),
])
def test_bad_relation_names_are_named(names, match):
    with pytest.raises(ValueError, match=match):
        typed_graph().with_one_node_type("n", names)


def test_hgt_on_the_view_equals_hgt_on_a_one_type_graph_built_from_the_edges():
    g = typed_graph(seed=3)
    ei, et = g.input_edge_index(), g.input_edge_type()
    built = Graph(ei, edge_type=et, num_nodes=g.num_nodes, num_relations=3,
                  node_type_names=["n"], relation_names=NAMES)
    torch.manual_seed(0)
    layer = HGTConv(8, 8, (["n"], NAMES), heads=2, backend="torch")
    x = torch.randn(g.num_nodes, 8)
    results = []
    for graph in (g.with_one_node_type("n", NAMES), built):
        layer.zero_grad()
        xx = x.clone().requires_grad_()
        out = layer({"n": xx}, graph)["n"]
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append((out.detach(), xx.grad, {n: p.grad.clone()
                                                for n, p in layer.named_parameters()}))
    (o1, gx1, gp1), (o2, gx2, gp2) = results
    torch.testing.assert_close(o1, o2)
    torch.testing.assert_close(gx1, gx2)
    for name in gp1:
        torch.testing.assert_close(gp1[name], gp2[name], msg=name)
