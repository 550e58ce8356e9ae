"""Every bad graph input of DESIGN.md section 6 gets a clear error naming the argument."""
import pytest
import torch

from hector import Graph
from hector.checks import check_features

EI = torch.tensor([[0, 1, 2], [1, 2, 0]])


@pytest.mark.parametrize("kwargs, err, pattern", [
    (dict(edge_index=[[0, 1], [1, 0]]), TypeError, "edge_index must be a torch.Tensor, got list"),
    (dict(edge_index=EI.float()), TypeError, "edge_index must have an integer dtype, got torch.float32"),
    (dict(edge_index=EI[0]), ValueError, r"edge_index must have 2 dimensions, got shape \(3,\)"),
    (dict(edge_index=EI.t()), ValueError, r"edge_index must have shape \[2, num_edges\], got \(3, 2\)"),
    (dict(edge_index=torch.tensor([[0, -1], [1, 0]])), ValueError, "edge_index.*negative id -1"),
    (dict(edge_index=EI, num_nodes=2), ValueError,
     r"edge_index\[0\] \(source ids\) contains id 2, out of range for num_nodes=2"),
    (dict(edge_index=torch.tensor([[0, 0], [0, 5]]), num_nodes=3), ValueError,
     r"edge_index\[1\] \(destination ids\) contains id 5"),
    (dict(edge_index=EI, num_nodes=-1), ValueError, "num_nodes must be >= 0, got -1"),
    (dict(edge_index=EI, num_nodes=3.0), TypeError, "num_nodes must be an int, got float"),
    (dict(edge_index=EI, edge_type=torch.tensor([0, 1])), ValueError,
     "edge_type has 2 entries but edge_index .* has 3"),
    (dict(edge_index=EI, edge_type=torch.tensor([0.0, 1, 0])), TypeError,
     "edge_type must have an integer dtype"),
    (dict(edge_index=EI, edge_type=torch.tensor([0, 1, 2]), num_relations=2), ValueError,
     "edge_type contains id 2, out of range for num_relations=2"),
    (dict(edge_index=EI, edge_type=torch.tensor([0, -3, 1])), ValueError, "edge_type.*negative id -3"),
    (dict(edge_index=EI, node_type=torch.tensor([0, 1]), num_nodes=3), ValueError,
     "node_type has 2 entries but num_nodes has 3"),
    (dict(edge_index=EI, node_type=torch.tensor([0, 1])), ValueError,   # N taken from node_type
     r"edge_index\[0\] \(source ids\) contains id 2, out of range for num_nodes=2"),
    (dict(edge_index=EI, node_type=torch.tensor([0, 1, 4]), num_node_types=2), ValueError,
     "node_type contains id 4, out of range for num_node_types=2"),
    (dict(edge_index=EI, node_type=torch.tensor([0, 1, 0]), node_type_names=["a"]), ValueError,
     "node_type_names has 1 entries but num_node_types=2"),
    (dict(edge_index=EI, relation_names=[("a", "r")]), TypeError, r"relation_names\[0\] must be"),
    (dict(edge_index=EI, relation_names=[("a", "r", "a"), ("a", "s", "a")]), ValueError,
     "relation_names has 2 entries but num_relations=1"),
    (dict(edge_index=EI, super_node_threshold=-5), ValueError, "super_node_threshold must be >= 0"),
])
def test_bad_graph_input(kwargs, err, pattern):
    with pytest.raises(err, match=pattern):
        Graph(**kwargs)


def test_inputs_on_different_devices():
    meta = torch.tensor([0, 0, 0], device="meta")
    with pytest.raises(ValueError, match="edge_type is on meta but edge_index is on cpu"):
        Graph(EI, edge_type=meta)


def test_feature_checks():
    g = Graph(EI)
    x = torch.randn(3, 4)
    assert check_features(x, "x", g.num_nodes, "num_nodes", g.device, 4) is x
    with pytest.raises(TypeError, match="x must be a floating tensor.*got torch.int64"):
        check_features(torch.ones(3, 4, dtype=torch.long), "x", 3, "num_nodes", g.device)
    with pytest.raises(ValueError, match=r"x must have 3 rows \(num_nodes\), got shape \(2, 4\)"):
        check_features(torch.randn(2, 4), "x", 3, "num_nodes", g.device)
    with pytest.raises(ValueError, match=r"x must have shape \[3, 8\], got \(3, 4\)"):
        check_features(x, "x", 3, "num_nodes", g.device, 8)
    with pytest.raises(ValueError, match="x is on meta but the graph is on cpu"):
        check_features(torch.randn(3, 4, device="meta"), "x", 3, "num_nodes", g.device)
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got ndarray"):
        import numpy as np
        check_features(np.zeros((3, 4)), "x", 3, "num_nodes", g.device)
