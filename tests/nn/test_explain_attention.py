"""hector.explain on the attention layers: the schedule DF-GNN's dynamic fusion picks, and why."""
import pytest
import torch

import hector
from hector import Graph
from hector.nn import AGNNConv, GATConv, TransformerConv


def star(n_leaves=3000):
    """One node receiving from 3000 others: a super node that would straggle node-parallel."""
    src = torch.arange(1, n_leaves + 1)
    return Graph(torch.stack([src, torch.zeros_like(src)]), num_nodes=n_leaves + 1)


def ring(n=50):
    src = torch.arange(n)
    return Graph(torch.stack([src, (src + 1) % n]), num_nodes=n)


def test_explain_reports_strategy_and_reason():
    text = hector.explain(GATConv(8, 4, heads=2), star())      # (its compiled program)
    assert "forward + destination-side backward: Schedule(strategy='edge'" in text
    assert "the longest row would straggle (max degree 3001" in text   # + its self loop
    assert "self loops replaced" in text and "heads=2, dim_qk=0, dim_v=4" in text
    assert "negative_slope=0.2" in text and "roles=('v', 'a_src', 'a_dst', 'bias')" in text
    loopless = hector.explain(GATConv(8, 4, add_self_loops=False), star())
    assert "self loops replaced" not in loopless and "max degree 3000" in loopless
    flat = hector.explain(TransformerConv(8, 4, heads=2), ring())      # (its program)
    assert "backward: Schedule(strategy='node'" in flat and "no row long enough" in flat
    forced = hector.explain(TransformerConv(8, 4, strategy="edge"), ring())
    assert "requested by the caller" in forced and "chunk=" in forced


def test_explain_agnn_and_bad_graph():
    text = hector.explain(AGNNConv(), ring(), features=16)     # (its program for width 16)
    assert "hector::cosine_qk" in text and "dim_qk=16, dim_v=16, has_qk=True" in text
    assert "normed_k=True" in text
    with pytest.raises(ValueError, match="needs features="):
        hector.explain(AGNNConv(), ring())
    with pytest.raises(TypeError, match="graph must be a hector.Graph"):
        hector.explain(GATConv(8, 4), torch.zeros(2, 3, dtype=torch.long))
