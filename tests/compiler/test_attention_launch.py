"""A compiled attention step launches the spec lowering built and the schedules chosen once
per graph; ``hector.explain`` prints those same objects."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector import Graph
from hector.compiler import ir as N
from hector.compiler import models
from hector.compiler.lower import attention_spec
from hector.compiler.steps_torch import GraphIndex
from hector.compiler.steps_triton.attention import attention_launch
from hector.kernels.attention import custom_ops
from hector.kernels.attention.op import edge_attention
from hector.kernels.attention.plan import make_plan
from hector.kernels.attention.spec import AttentionSpec, Schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import device_for, random_relational  # noqa: E402


def gat(m, in_dim, out_dim, heads=2):
    """GAT in the DSL: every score term per node, so the op runs on the graph itself."""
    x = m.node_input("x", in_dim)
    z = m.linear(x, m.weight("w", (in_dim, heads * out_dim)), heads=heads)
    a_s = m.linear(z, m.weight("att_src", (heads * out_dim, heads)), heads=heads)
    a_d = m.linear(z, m.weight("att_dst", (heads * out_dim, heads)), heads=heads)
    alpha = m.edge_softmax(m.leaky_relu(m.src(a_s) + m.dst(a_d), 0.2))
    return m.aggregate(alpha * m.src(z), "sum")


def _graph(node_types=1):
    ei, et = random_relational(num_nodes=14, num_edges=40, num_relations=3)
    nt = torch.arange(14) % node_types
    return Graph(ei, edge_type=et, num_nodes=14, num_relations=3, node_type=nt,
                 num_node_types=node_types).to(device_for("triton"))


CASES = {  # model, dims, node types, the op graph lowering must pick (plan.AttentionRows)
    "gat": (gat, dict(in_dim=6, out_dim=4, heads=2), 1, ("graph", "node")),
    "rgat": (models.rgat, dict(in_dim=6, out_dim=4, heads=2, num_relations=3), 1,
             ("derived", "compact_src")),
    "hgt": (models.hgt, dict(in_dim=8, out_dim=8, heads=2, num_relations=3, num_node_types=2),
            2, ("derived", "compact_src")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_step_launches_lowerings_spec_and_cached_schedules(monkeypatch, name):
    fn, dims, node_types, want_rows = CASES[name]
    launched, launched_bwd = [], []
    real, real_bwd = custom_ops.attention_forward, custom_ops.attention_backward  # what the ops run

    def spy(graph, spec, plan, params, *tensors):
        launched.append((graph, spec, plan))
        return real(graph, spec, plan, params, *tensors)

    def spy_bwd(graph, spec, plan, *rest):
        launched_bwd.append((graph, spec, plan))
        return real_bwd(graph, spec, plan, *rest)
    monkeypatch.setattr(custom_ops, "attention_forward", spy)
    monkeypatch.setattr(custom_ops, "attention_backward", spy_bwd)
    torch.manual_seed(0)
    g = _graph(node_types)
    module = hector.compile(fn, backend="triton", **dims).to(g.device)
    x = torch.randn(14, dims["in_dim"], device=g.device, requires_grad=True)
    module(g, x=x).square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()

    (cp,) = module.program._cache.values()
    (fwd_step,) = [s for s in cp.forward_plan.steps if s.template == "attention"]
    assert (fwd_step.spec[1].graph, fwd_step.spec[1].source) == want_rows
    steps = [s for plan in (cp.forward_plan, cp.backward_plan) for s in plan.steps
             if s.template == "attention"]
    # A fused backward step (attention_bwd) launches the backward kernels only; every other
    # attention step (forward, or the unfused backward's recomputation) the forward kernel.
    bwd_steps = [s for s in steps if s.body.op == N.Op.ATTENTION_BWD]
    ix = GraphIndex.of(g)
    assert launched and len(launched) == len(steps) - len(bwd_steps)
    assert len(launched_bwd) == len(bwd_steps)
    assert len(bwd_steps) == 1
    for graph, spec, plan in launched + launched_bwd:
        # Each launch is some step's own objects: lowering's spec (not one rebuilt from the
        # tensors) and the schedules memoised for this graph (not planned again).
        step = next(s for s in steps if s.spec[0] is spec)
        assert plan is attention_launch(step, ix)[1]
        assert (graph is g) == (step.spec[1].graph == "graph")
    # Inference on the same graph launches the forward step's objects again.
    with torch.no_grad():
        module(g, x=x)
    assert launched[-1][1] is fwd_step.spec[0]
    assert launched[-1][2] is attention_launch(fwd_step, ix)[1]

    text = hector.explain(module, g)
    for step in steps:
        spec, plan = attention_launch(step, ix)
        assert f"launch spec: {spec}" in text
        assert f"forward + destination-side backward: {plan.dst}" in text
        assert f"source-side backward: {plan.src}" in text

def test_relation_dependent_destination_with_qk_folds_the_score_onto_edges():
    x = N.input_("x", 4, heads=2)
    a_dst = N.gather(N.input_("a", 1, heads=2), N.CDST, "dst")
    node = N.attention({"v": x, "q": x, "k": x, "a_dst": a_dst}, x.shape, 0.5, None)
    spec, rows = attention_spec(node, torch.float32)
    # The op then gets the whole score as one per-edge source term: no q.k, no dst term.
    assert (rows.graph, rows.source, rows.score_on_edges) == ("derived", "edge", True)
    assert (spec.has_qk, spec.has_src, spec.has_dst, spec.dim_qk) == (False, True, False, 0)
    with_node_dst = N.attention({"v": x, "q": x, "k": x}, x.shape, 0.5, 0.2)
    spec, rows = attention_spec(with_node_dst, torch.float32)
    assert (rows.graph, rows.score_on_edges) == ("graph", False)
    assert (spec.has_qk, spec.dim_qk, spec.negative_slope) == (True, 4, 0.2)


def test_attention_node_roles_are_checked():
    x = N.input_("x", 4)
    with pytest.raises(ValueError, match="q and k"):
        N.attention({"v": x, "q": x}, x.shape, 1.0, None)
    with pytest.raises(ValueError, match="roles"):
        N.attention({"v": x, "bogus": x}, x.shape, 1.0, None)
    node = N.attention({"v": x, "a_src": x}, x.shape, 1.0, None)
    assert N.attention_roles(node) == {"v": x, "a_src": x}
    assert N.attention_roles(node, ("tv", "ta")) == {"v": "tv", "a_src": "ta"}


def test_op_rejects_a_spec_or_plan_that_does_not_fit(monkeypatch):
    dev = device_for("triton")
    g = Graph(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3).to(dev)
    v, a = torch.randn(3, 2, 4, device=dev), torch.randn(3, 2, device=dev)
    monkeypatch.setattr(custom_ops, "attention_forward",
                        lambda *args: pytest.fail("a kernel ran before the checks"))
    wrong = AttentionSpec.of(v, a_src=a)                     # says a_src; a_dst is given
    with pytest.raises(ValueError, match="spec"):
        edge_attention(g, v, a_dst=a, spec=wrong, backend="triton")
    with pytest.raises(TypeError, match="spec"):
        edge_attention(g, v, a_src=a, spec="node", backend="triton")
    with pytest.raises(TypeError, match="plan"):
        edge_attention(g, v, a_src=a, plan="node", backend="triton")
    plan = make_plan(g, AttentionSpec.of(v, a_src=a))
    sched = Schedule("node", 4, 2, 1, 4)
    with pytest.raises(ValueError, match="plan and schedule"):
        edge_attention(g, v, a_src=a, plan=plan, schedule=sched, backend="triton")
