"""Heterogeneous (HeteroData-layout) construction and block-diagonal batching."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from hector import Graph


def hetero_example():
    num_nodes = {"author": 3, "paper": 4, "field": 2}
    edges = {
        ("author", "writes", "paper"): torch.tensor([[0, 1, 2, 2], [0, 0, 3, 1]]),
        ("paper", "cites", "paper"): torch.tensor([[0, 1], [1, 2]]),
        ("paper", "has_topic", "field"): torch.tensor([[3], [1]]),
        ("field", "empty", "author"): torch.zeros(2, 0, dtype=torch.int64),
    }
    return edges, num_nodes


def test_from_hetero_offsets_types_and_names():
    edges, num_nodes = hetero_example()
    g = Graph.from_hetero(edges, num_nodes)
    assert g.num_nodes == 9 and g.num_edges == 7 and g.num_relations == 4
    assert g.node_type_names == ["author", "paper", "field"]
    assert g.relation_names[0] == ("author", "writes", "paper")
    assert g.node_type.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert g.node_type_ptr.tolist() == [0, 3, 7, 9] and g.node_types_contiguous
    assert g.rel_ptr.tolist() == [0, 4, 6, 7, 7]
    want = torch.cat([edges[k] + torch.tensor([[o1], [o2]]) for k, (o1, o2) in zip(
        edges, [(0, 3), (3, 3), (3, 7), (7, 0)])], 1)
    assert torch.equal(g.input_edge_index(), want)
    assert g.relation_index("cites") == 1
    assert g.relation_index(("paper", "has_topic", "field")) == 2
    assert g.nodes_of_type("field").tolist() == [7, 8]
    s = g.summary()
    assert s["nodes_per_type"] == {"author": 3, "paper": 4, "field": 2}
    assert s["edges_per_relation"]["author/writes/paper"] == 4


def test_from_hetero_errors_name_the_relation():
    edges, num_nodes = hetero_example()
    edges[("author", "writes", "paper")] = torch.tensor([[0], [4]])
    with pytest.raises(ValueError, match=r"writes.*destination ids.*id 4.*num_nodes_dict\['paper'\]=4"):
        Graph.from_hetero(edges, num_nodes)
    with pytest.raises(ValueError, match="'venue'.*not in num_nodes_dict"):
        Graph.from_hetero({("venue", "r", "paper"): torch.zeros(2, 0, dtype=torch.long)}, num_nodes)
    with pytest.raises(TypeError, match="keys must be"):
        Graph.from_hetero({"writes": torch.zeros(2, 0, dtype=torch.long)}, num_nodes)
    with pytest.raises(TypeError, match="num_nodes_dict"):
        Graph.from_hetero({}, [])
    with pytest.raises(TypeError, match=r"num_nodes_dict\['paper'\] must be an int"):
        Graph.from_hetero({}, {"paper": 2.5})


def test_relation_endpoint_types_are_checked():
    ei = torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match="has relation .*'a', 'r', 'b'.* endpoints have node types .*'a', 'a'"):
        Graph(ei, node_type=torch.tensor([0, 0, 1]), node_type_names=["a", "b"],
              relation_names=[("a", "r", "b")])
    with pytest.raises(ValueError, match="names node type 'c'"):
        Graph(ei, node_type=torch.tensor([0, 1]), node_type_names=["a", "b"],
              relation_names=[("a", "r", "c")])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 12)), min_size=1, max_size=6),
       st.randoms(use_true_random=False))
def test_batch_is_block_diagonal(sizes, rnd):
    graphs, expect_src, expect_dst, expect_type, offset = [], [], [], [], 0
    for n, e in sizes:
        s = [rnd.randrange(n) for _ in range(e)]
        d = [rnd.randrange(n) for _ in range(e)]
        t = [rnd.randrange(2) for _ in range(e)]
        graphs.append(Graph(torch.tensor([s, d], dtype=torch.long).reshape(2, -1),
                            edge_type=torch.tensor(t, dtype=torch.long),
                            num_nodes=n, num_relations=2))
        expect_src += [x + offset for x in s]
        expect_dst += [x + offset for x in d]
        expect_type += t
        offset += n
    b = Graph.batch(graphs)
    assert b.num_nodes == offset and b.num_edges == len(expect_src)
    assert b.graph_ptr.tolist()[-1] == offset and b.graph_ptr.numel() == len(graphs) + 1
    assert b.input_edge_index().tolist() == [expect_src, expect_dst]
    assert b.input_edge_type().tolist() == expect_type
    ref = Graph(torch.tensor([expect_src, expect_dst], dtype=torch.long).reshape(2, -1),
                edge_type=torch.tensor(expect_type, dtype=torch.long), num_nodes=offset, num_relations=2)
    for name in ("src", "dst", "etype", "edge_perm", "rel_ptr"):
        assert torch.equal(getattr(b, name), getattr(ref, name))
    assert torch.equal(b.csr_out.eid, ref.csr_out.eid)


def test_batch_rejects_mixed_schemas():
    a = Graph(torch.tensor([[0], [1]]), num_relations=1)
    c = Graph(torch.tensor([[0], [1]]), edge_type=torch.tensor([1]))
    with pytest.raises(ValueError, match=r"graphs\[1\] has another schema"):
        Graph.batch([a, c])
    with pytest.raises(TypeError, match="non-empty sequence of hector.Graph"):
        Graph.batch([])
