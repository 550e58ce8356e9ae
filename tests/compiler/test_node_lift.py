"""Compaction's node rows: an edge-wise value whose weights are all shared depends on its end
node alone, so ``compact`` computes it once per node (``at_nodes``) -- GAT's score term
written on the gathered rows, ``src(z) a_src``, becomes ``src(z a_src)``.  Then every
attention term lives on node rows and the attention backward runs as one operator.  Against
the same layer written on node rows (the plan and the numbers) and against torch autograd."""
import sys
from pathlib import Path

import pytest
import torch

from hector.compiler.ir import EDGE, NODE, CSRC, Op, toposort
from hector.compiler.passes import compact

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_attention_backward import _compiled, _grads, _graph, gat_like  # noqa: E402


def gat_on_edges(m, in_dim, heads=2, dim=4):
    """``gat_like`` with its score terms formed on the gathered rows."""
    x = m.node_input("x", in_dim)
    z = m.linear(x, m.weight("W", (in_dim, heads * dim)), heads=heads)
    a_s = m.linear(m.src(z), m.weight("att_src", (heads * dim, heads)), heads=heads)
    a_d = m.linear(m.dst(z), m.weight("att_dst", (heads * dim, heads)), heads=heads)
    alpha = m.edge_softmax(m.leaky_relu(a_s + a_d, 0.2))
    return m.heads(m.aggregate(alpha * m.src(z), "sum"), 1)


def rgat_score_on_edges(m, in_dim, heads=2, dim=4):
    """A per-relation projection under the score: depends on (src, relation), not the node."""
    x = m.node_input("x", in_dim)
    z = m.linear(m.src(x), m.weight("W", (in_dim, heads * dim), per="relation"), heads=heads)
    a_s = m.linear(z, m.weight("att_src", (heads * dim, heads)), heads=heads)
    alpha = m.edge_softmax(m.leaky_relu(a_s, 0.2))
    return m.heads(m.aggregate(alpha * z, "sum"), 1)


def _decisions(model, graph, dims):
    cp = _compiled(model, dims, graph).program.compile_exact(graph)
    return cp, [d for rec in cp.log if rec.name == "compact" for d in rec.decisions]


def test_shared_weight_terms_move_to_node_rows():
    graph = _graph(num_relations=1)
    cp, decisions = _decisions(gat_on_edges, graph, dict(in_dim=6))
    applied = [d for d in decisions if d.applied]
    assert len(applied) == 2 and all("depends only on its" in d.what for d in applied)
    att = [s for s in cp.forward_plan.steps if s.template == "attention"]
    assert len(att) == 1 and att[0].spec[1].source == NODE and att[0].spec[1].graph == "graph"
    # every score GEMM runs over node rows, none over edges or compact rows
    rows = {s.spec[1].rows for s in cp.forward_plan.steps if s.template == "gemm"}
    assert rows == {NODE}
    assert any(s.template == "attention" and s.body.op == Op.ATTENTION_BWD
               for s in cp.backward_plan.steps)


def test_per_relation_terms_stay_compact():
    graph = _graph(num_relations=3)
    _, decisions = _decisions(rgat_score_on_edges, graph, dict(in_dim=6))
    assert not any("depends only on its" in d.what for d in decisions)
    assert any(d.applied and "(src, relation)" in d.what for d in decisions)


def test_at_nodes_declines_what_depends_on_more():
    from hector.compiler import ir as N
    x = N.input_("x", 4)
    w_shared, w_rel = N.param("a", (4, 2), None), N.param("r", (4, 2), "relation")
    both = N.binary(Op.ADD, N.gather(x, EDGE, "src"), N.gather(x, EDGE, "dst"))
    assert compact.at_nodes(N.linear(N.gather(x, EDGE, "src"), w_shared), "src") is not None
    assert compact.at_nodes(N.linear(N.gather(x, EDGE, "src"), w_rel), "src") is None
    assert compact.at_nodes(N.linear(N.gather(x, EDGE, "src"), w_shared), "dst") is None
    assert compact.at_nodes(N.linear(both, w_shared), "src") is None
    lifted = compact.at_nodes(N.linear(N.gather(x, EDGE, "src"), w_shared), "src")
    assert lifted.kind == NODE and all(v.kind != CSRC for v in toposort([lifted]))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_node_lift_equals_the_node_row_layer(backend):
    """Same parameters, same numbers: output and every gradient of the edge-written layer
    equal the node-written one's (whose plan the lift reproduces), and torch autograd's."""
    graph = _graph(num_relations=1)
    dims = dict(in_dim=6)
    out, grads = _grads(gat_on_edges, dims, graph, "ir", backend)
    ref_out, ref = _grads(gat_like, dims, graph, "ir", backend)
    auto_out, auto = _grads(gat_on_edges, dims, graph, "torch", backend)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, auto_out, rtol=1e-5, atol=1e-5)
    assert set(grads) == set(ref) == {"x", "W", "att_src", "att_dst"}
    for name in ref:
        torch.testing.assert_close(grads[name], ref[name], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grads[name], auto[name], rtol=1e-5, atol=1e-5)
