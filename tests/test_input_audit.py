"""Regression tests of an input-robustness audit of the public API (CPU, torch backend): each
test is one input that crashed deep inside, was silently misread, or got a misleading error."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hector import Graph
from hector.loader import NeighborLoader
from hector.nn import AGNNConv, GATConv, HGTConv, TransformerConv

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/helpers.py
from helpers import random_hetero, random_relational  # noqa: E402


def _hetero_graph():
    counts, eid, meta = random_hetero()
    return counts, eid, meta, Graph.from_hetero({e: eid[e] for e in meta[1]}, counts)


def test_hgt_prebuilt_graph_rows_per_type_must_match_the_graph():
    """x_dict rows that only add up to the graph's node count were read as other types' nodes
    (paper row 8 taken from author's rows): silently wrong output, on a Graph and on a block."""
    counts, _, meta, g = _hetero_graph()
    layer = HGTConv(8, 8, meta, heads=2, backend="torch")
    xs = {t: torch.randn(n, 8) for t, n in counts.items()}
    shifted = dict(xs, paper=torch.randn(counts["paper"] - 1, 8),
                   author=torch.randn(counts["author"] + 1, 8))
    with pytest.raises(ValueError, match=r"x_dict\['paper'\] has 8 rows but the graph has 9 "
                                         r"'paper' nodes"):
        layer(shifted, g)
    batch = next(iter(NeighborLoader(g, [3], input_nodes="paper", batch_size=4, seed=0)))
    xb = batch.x_dict(xs)
    assert layer(xb, batch.blocks[0])["paper"].shape == (4, 8)      # the right rows still run
    xb["paper"], xb["author"] = xb["paper"][:-1], torch.cat([xb["author"], xb["paper"][-1:]])
    with pytest.raises(ValueError, match=r"x_dict\['paper'\] has .* rows but the block has"):
        layer(xb, batch.blocks[0])


def test_loader_fanout_dict_naming_one_relation_twice():
    """{"writes": 2, ("author", "writes", "paper"): 5} silently kept the last fan-out."""
    _, _, _, g = _hetero_graph()
    fans = {"writes": 2, "cites": 1, "in": 1, "hosts": 1, ("author", "writes", "paper"): 5}
    with pytest.raises(ValueError, match=r"num_neighbors\[0\] gives relation 0 twice, as "
                                         r"'writes' and \('author', 'writes', 'paper'\)"):
        NeighborLoader(g, [fans])


def test_loader_fanout_dict_keys_of_other_types():
    """A float key crashed in relation_index ("'float' object is not iterable"); a numpy or
    0-d tensor integer key (an id) was "unknown" or crashed the same way."""
    _, _, _, g = _hetero_graph()
    with pytest.raises(TypeError, match=r"num_neighbors\[0\]: key 1.0: relation must be an int "
                                        r"id, a relation name \(str\) or a \(src_type"):
        NeighborLoader(g, [{1.0: 2}])
    with pytest.raises(TypeError, match=r"relation must be an int id.*got bool"):
        g.relation_index(True)
    assert g.relation_index(np.int64(2)) == g.relation_index(torch.tensor(2)) == 2
    by_id = NeighborLoader(g, [{np.int64(r): r for r in range(4)}]).fanouts[0]
    assert by_id.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(batch_size=-1), "batch_size must be >= 1, got -1"),     # was ">= 0" (0 refused too)
    (dict(num_parts=0), "num_parts must be >= 1, got 0"),          # was "part must be in ..."
])
def test_loader_size_messages_name_the_argument_and_the_bound(kwargs, pattern):
    ei, et = random_relational()
    with pytest.raises(ValueError, match=pattern):
        NeighborLoader(Graph(ei, edge_type=et, num_relations=4), [2], **kwargs)


@pytest.mark.parametrize("kind", ["gat", "agnn", "transformer"])
def test_attention_layers_on_a_graph_without_nodes(kind):
    """PyG's layers return [0, F] for x [0, F_in] and no edges; ours crashed (RuntimeError
    "cannot reshape tensor of 0 elements") on the torch backend on the CPU; the gradient of
    the (empty) output reaches the parameters too."""
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    ref = {"gat": lambda: pyg.GATConv(4, 3, heads=2), "agnn": pyg.AGNNConv,
           "transformer": lambda: pyg.TransformerConv(4, 3, heads=2)}[kind]()
    ours = {"gat": GATConv, "agnn": AGNNConv, "transformer": TransformerConv}[kind].from_pyg(
        ref, backend="torch")
    x, ei = torch.randn(0, 4, requires_grad=True), torch.zeros(2, 0, dtype=torch.long)
    out = ours(x, ei)
    assert out.shape == ref(x, ei).shape
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_graph_node_type_names_given_twice():
    """["a", "a"] was accepted: nodes_of_type("a") then listed type 0's nodes only, and with
    relation_names the endpoint check blamed a correct edge ("node types ('a', 'a')")."""
    ei, nt = torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.tensor([0, 1, 1])
    for extra in ({}, dict(relation_names=[("a", "r", "a")])):
        with pytest.raises(ValueError, match=r"node_type_names has a name twice \(\['a', 'a'\]\)"):
            Graph(ei, node_type=nt, node_type_names=["a", "a"], **extra)


def test_node_type_ids_of_other_types_are_refused_by_name():
    """nodes_of_type(0.5) failed with "list indices must be integers"; a numpy id works."""
    g = Graph(torch.tensor([[0, 1], [1, 0]]), node_type=torch.tensor([0, 1]),
              node_type_names=["a", "b"])
    for bad in (0.5, True):
        with pytest.raises(TypeError, match=r"node_type must be an int id or a node type "
                                            r"name \(str\), got"):
            g.nodes_of_type(bad)
    assert g.nodes_of_type(np.int64(1)).tolist() == [1]


def test_loader_seed_beyond_64_bits():
    """seed=2**70 failed inside torch ("Overflow when unpacking long long")."""
    g = Graph(torch.tensor([[0, 1], [1, 0]]), num_nodes=2)
    with pytest.raises(ValueError, match="seed must fit in 64 bits"):
        NeighborLoader(g, [2], batch_size=1, seed=2 ** 70)
    with pytest.raises(TypeError, match="seed must be an int or None, got bool"):
        NeighborLoader(g, [2], batch_size=1, seed=True)


def test_dataset_root_that_is_not_a_path():
    """datasets.load(root=3) raised os's TypeError, which did not name root."""
    from hector import datasets
    with pytest.raises(TypeError, match=r"root must be a folder path \(str or os.PathLike\), "
                                        r"got int"):
        datasets.load("cora", root=3)
