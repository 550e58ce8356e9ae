"""The fused attention backward in the IR autodiff: an ``attention`` the forward fused is
differentiated as one operator (``attention_bwd``: the attention backward kernels on the
Triton backend, reading the forward's output and log-sum-exp), so the backward plan has no
per-edge step.  Checked against torch autograd through the forward's torch ops, on both
backends, for every form the fused backward takes (node sources with q.k, node sources with
additive terms and leaky_relu, compact (src, relation) sources with a per-relation prior,
RGAT's (dst, relation) destination term on the group graph)."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import models
from hector.compiler.ir import EDGE, Op
from hector.compiler.program import compile as hcompile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, random_relational, rel_err  # noqa: E402


def gat_like(m, in_dim, heads=2, dim=4):
    """Additive per-node terms, leaky_relu, messages on node rows (the op's own graph)."""
    x = m.node_input("x", in_dim)
    z = m.linear(x, m.weight("W", (in_dim, heads * dim)), heads=heads)
    a_s = m.linear(z, m.weight("att_src", (heads * dim, heads)), heads=heads)
    a_d = m.linear(z, m.weight("att_dst", (heads * dim, heads)), heads=heads)
    alpha = m.edge_softmax(m.leaky_relu(m.src(a_s) + m.dst(a_d), 0.2))
    return m.heads(m.aggregate(alpha * m.src(z), "sum"), 1)


def transformer_like(m, in_dim, heads=2, dim=4, relu_input=False):
    """A scaled q.k score plus a source term, messages on node rows (``relu_input``: the
    projections of relu(x), no layer input: the siblings pass then keeps them apart)."""
    x = m.node_input("x", in_dim)
    if relu_input:
        x = m.relu(x)

    def proj(name):
        return m.linear(x, m.weight(name, (in_dim, heads * dim)), heads=heads)
    q, k, v = proj("q"), proj("k"), proj("v")
    a_s = m.linear(v, m.weight("bias_src", (heads * dim, heads)), heads=heads)
    alpha = m.edge_softmax(m.dot(m.dst(q), m.src(k)) * 0.5 + m.src(a_s))
    return m.heads(m.aggregate(alpha * m.src(v), "sum"), 1)


CASES = [(gat_like, dict(in_dim=6)), (transformer_like, dict(in_dim=6)),
         (models.hgt, dict(in_dim=8, out_dim=8, heads=2)),
         (models.rgat, dict(in_dim=8, out_dim=4, heads=2))]


def _graph(num_relations=3):
    ei, et = random_relational(num_nodes=16, num_edges=50, num_relations=num_relations,
                               empty=(2,))
    return hector.Graph(ei, edge_type=et, num_nodes=16, num_relations=num_relations,
                        node_type=(torch.arange(16) >= 9).long())


def _compiled(model, dims, graph, **kw):
    return hcompile(model, num_relations=graph.num_relations,
                    num_node_types=graph.num_node_types, **kw, **dims)


def _grads(model, dims, graph, autodiff, backend, dtype=torch.float32):
    torch.manual_seed(3)
    dev = device_for(backend)
    m = _compiled(model, dims, graph, autodiff=autodiff, backend=backend)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.4)
    m, graph = m.to(dev, dtype), graph.to(dev)
    x = torch.randn(graph.num_nodes, dims["in_dim"], generator=torch.Generator().manual_seed(4))
    x = x.to(dev, dtype).requires_grad_()
    out = m(graph, x=x)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(dev, dtype)
    # (unused: parameters a graph without edges never reaches; their gradient is zero)
    gs = torch.autograd.grad((out * w).float().sum(), [x] + list(m.parameters()),
                             allow_unused=True, materialize_grads=True)
    names = ["x"] + [n for n, _ in m.named_parameters()]
    return out.detach().float().cpu(), {n: g.float().cpu() for n, g in zip(names, gs)}


@pytest.mark.parametrize("model,dims", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_the_backward_plan_differentiates_the_attention_as_one_operator(model, dims):
    g = _graph()
    cp = _compiled(model, dims, g, backend="torch").program.compiled_for(g)
    bwd = cp.backward_plan.steps
    fused = [s for s in bwd if s.template == "attention"]
    assert len(fused) == 1 and fused[0].body.op == Op.ATTENTION_BWD
    # the forward keeps the log-sum-exp its backward reads
    assert any(v.op == Op.ATTENTION_LSE for v in cp.saved_values)
    # no step of either plan writes a per-edge tensor
    for plan in (cp.forward_plan, cp.backward_plan):
        assert [s.name for s in plan.steps if s.output.kind == EDGE] == []
    applied = [d for rec in cp.log if rec.name == "autodiff" for d in rec.decisions
               if d.what == "attention backward as one operator"]
    assert [d.applied for d in applied] == [True]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("model,dims", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_fused_attention_backward_matches_torch_autograd(model, dims, backend):
    g = _graph()
    ref_out, ref = _grads(model, dims, g, "torch", "torch")
    out, got = _grads(model, dims, g, "ir", backend)
    assert rel_err(out, ref_out) < 1e-5
    assert set(got) == set(ref)
    for name in ref:
        assert rel_err(got[name], ref[name]) < 1e-4, name


def test_fused_attention_backward_in_bf16_stays_near_fp32():
    """bf16 storage, fp32 accumulation: the HGT gradients stay within bf16's precision."""
    model, dims = CASES[2]
    g = _graph()
    _, ref = _grads(model, dims, g, "torch", "torch")
    _, got = _grads(model, dims, g, "ir", "torch", dtype=torch.bfloat16)
    for name in ref:
        assert rel_err(got[name], ref[name]) < 6e-2, name


def test_a_score_folded_onto_edges_stays_unfused():
    """A relation-dependent destination term next to q.k puts the whole score on the edges;
    the fused backward does not take that form: autodiff says why and differentiates its
    operators."""
    def qk_with_relational_dst(m, in_dim, heads=2, dim=4):
        x = m.node_input("x", in_dim)
        z = m.linear(x, m.weight("W", (in_dim, heads * dim)), heads=heads)
        z_dst = m.linear(m.dst(x), m.weight("R", (in_dim, heads * dim), per="relation"),
                         heads=heads)
        a_d = m.linear(z_dst, m.weight("att_dst", (heads * dim, heads)), heads=heads)
        alpha = m.edge_softmax(m.dot(m.dst(z), m.src(z)) + a_d)
        return m.heads(m.aggregate(alpha * m.src(z), "sum"), 1)
    g = _graph()
    cp = _compiled(qk_with_relational_dst, dict(in_dim=6), g,
                   backend="torch").program.compiled_for(g)
    assert not any(s.body.op == Op.ATTENTION_BWD for s in cp.backward_plan.steps)
    why = [d for rec in cp.log if rec.name == "autodiff" for d in rec.decisions
           if d.what == "attention backward as one operator"]
    assert len(why) == 1 and not why[0].applied
    assert "per edge" in why[0].reason


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("num_edges", [0, 1])
def test_hgt_without_edges_or_with_one_edge(backend, num_edges):
    """No edges (no compact rows: the fused backward and the per-relation prior's gradient
    sum nothing) and a single edge, against torch autograd."""
    ei = torch.tensor([[0], [1]])[:, :num_edges]
    g = hector.Graph(ei, edge_type=torch.zeros(num_edges, dtype=torch.long), num_nodes=5,
                     num_relations=2, node_type=torch.tensor([0, 0, 1, 1, 1]))
    dims = dict(in_dim=8, out_dim=8, heads=2)
    ref_out, ref = _grads(models.hgt, dims, g, "torch", "torch")
    out, got = _grads(models.hgt, dims, g, "ir", backend)
    assert rel_err(out, ref_out) < 1e-5
    for name in ref:
        assert torch.isfinite(got[name]).all(), name
        assert rel_err(got[name], ref[name]) < 1e-4, name
