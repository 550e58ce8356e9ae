"""IR-level autodiff (backward plan) against torch autograd through the forward's torch ops."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import models
from hector.compiler.program import compile as hcompile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, random_relational, rel_err  # noqa: E402


def zoo(m, in_dim):
    """Every operator the adjoints cover, in one layer."""
    x = m.node_input("x", in_dim)
    W = m.weight("W", (in_dim, 2 * in_dim), per="relation")
    z = m.linear(m.src(x), W, heads=2)
    q = m.linear(x, m.weight("wq", (in_dim, 2 * in_dim)), heads=2)
    s = m.dot(m.dst(q), z) * 0.5 - m.linear(z, m.weight("a", (2 * in_dim, 2)), heads=2)
    alpha = m.edge_softmax(m.tanh(s) + m.sigmoid(s))
    h = m.aggregate(alpha * m.exp(m.gelu(z) * 0.1), "sum")
    h = m.head_mean(h) + m.head_mean(m.aggregate(m.relu(m.linear(m.dst(x), W, heads=2)), "mean")) * 0.5
    g = m.sigmoid(m.weight("gate", (1,), per="node_type"))
    return -(h * g) + m.linear(x, m.weight("root", (in_dim, in_dim), per="node_type"))


def _graph():
    ei, et = random_relational(num_nodes=16, num_edges=50, num_relations=3, empty=(2,))
    return hector.Graph(ei, edge_type=et, num_nodes=16, num_relations=3,
                        node_type=(torch.arange(16) >= 9).long())


def _grads(model, dims, graph, autodiff, backend="torch", **opts):
    torch.manual_seed(3)
    dev = device_for(backend)
    m = hcompile(model, autodiff=autodiff, backend=backend, num_relations=graph.num_relations,
                 num_node_types=graph.num_node_types, **opts, **dims)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    m, graph = m.to(dev), graph.to(dev)
    x = torch.randn(graph.num_nodes, dims["in_dim"], generator=torch.Generator().manual_seed(4))
    x = x.to(dev).requires_grad_()
    out = m(graph, x=x)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(dev)
    gs = torch.autograd.grad((out * w).sum(), [x] + list(m.parameters()))
    return out.detach().cpu(), [g.cpu() for g in gs]


CASES = [(models.rgcn, dict(in_dim=8, out_dim=4)),
         (models.rgcn, dict(in_dim=8, out_dim=4, num_bases=2)),
         (models.rgat, dict(in_dim=8, out_dim=4, heads=2)),
         (models.hgt, dict(in_dim=8, out_dim=8, heads=2)),
         (zoo, dict(in_dim=4))]


@pytest.mark.parametrize("model,dims", CASES, ids=lambda c: getattr(c, "__name__", ""))
@pytest.mark.parametrize("fuse", [True, False])
def test_ir_backward_matches_torch_autograd(model, dims, fuse):
    g = _graph()
    ref_out, ref = _grads(model, dims, g, "torch", fuse=fuse)
    out, got = _grads(model, dims, g, "ir", fuse=fuse)
    assert rel_err(out, ref_out) < 1e-5
    for a, b in zip(got, ref):
        assert rel_err(a, b) < 1e-4


def test_backward_plan_exists_and_reads_saved_values():
    g = _graph()
    m = hcompile(models.rgat, in_dim=8, out_dim=4, heads=2, num_relations=3, backend="torch")
    cp = m.program.compiled_for(g)
    assert cp.backward_plan is not None and len(cp.backward_plan.steps) > 0
    assert any(s.template == "gemm" for s in cp.backward_plan.steps)
    assert cp.saved_values   # forward kernel outputs kept for the backward


def test_triton_backend_backward_matches_torch_backend():
    g = _graph()
    ref_out, ref = _grads(models.rgat, dict(in_dim=8, out_dim=4, heads=2), g, "ir")
    out, got = _grads(models.rgat, dict(in_dim=8, out_dim=4, heads=2), g, "ir", backend="triton")
    assert rel_err(out, ref_out) < 1e-5
    for a, b in zip(got, ref):
        assert rel_err(a, b) < 1e-4


def _count_backward_builds(monkeypatch):
    """Counts IR-autodiff runs (the first step of building a backward plan)."""
    from hector.compiler.passes import autodiff
    calls = []
    real = autodiff.differentiate
    monkeypatch.setattr(autodiff, "differentiate", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_inference_never_builds_the_backward(monkeypatch, backend):
    calls = _count_backward_builds(monkeypatch)
    dev = device_for(backend)
    g = _graph().to(dev)
    m = hcompile(models.rgat, in_dim=8, out_dim=4, heads=2, num_relations=3,
                 backend=backend).to(dev)
    x = torch.randn(16, 8, device=dev)
    with torch.no_grad():                      # parameters require grad, recording is off
        m(g, x=x)
    for p in m.parameters():
        p.requires_grad_(False)
    m(g, x=x)                                  # grad enabled, nothing requires grad
    assert calls == []
    (cp,) = m.program._cache.values()          # one entry: the forward plan alone
    assert cp.backward_plan is None and cp.differentiable
    assert not any(r.name == "autodiff" or r.name.startswith("backward/") for r in cp.log)


def test_backward_is_built_once_by_the_first_forward_that_needs_it(monkeypatch):
    calls = _count_backward_builds(monkeypatch)
    g = _graph()
    m = hcompile(models.rgat, in_dim=8, out_dim=4, heads=2, num_relations=3, backend="torch")
    x = torch.randn(16, 8)
    with torch.no_grad():
        ref = m(g, x=x)
    out = m(g, x=x)
    out.square().sum().backward()
    assert len(calls) == 1
    for _ in range(2):
        with torch.no_grad():
            m(g, x=x)
        m(g, x=x).sum().backward()
    assert len(calls) == 1 and len(m.program._cache) == 1
    (cp,) = m.program._cache.values()
    assert cp.backward_plan is not None and cp.grad_leaves
    assert torch.equal(out.detach(), ref)
    # The log is in the order the passes ran: the forward's passes, then autodiff, then the
    # backward's, each record once although the backward was asked for three times.
    names = [r.name for r in cp.log]
    assert names.index("fuse") < names.index("autodiff") < names.index("backward/fuse")
    assert names.count("autodiff") == 1 and names.count("backward/fuse") == 1
    # Gradients equal those of a module whose backward was built by its very first call.
    fresh = hcompile(models.rgat, in_dim=8, out_dim=4, heads=2, num_relations=3, backend="torch")
    fresh.load_state_dict(m.state_dict())
    m.zero_grad()
    m(g, x=x).square().sum().backward()
    fresh(g, x=x).square().sum().backward()
    for n, p in fresh.named_parameters():
        assert torch.equal(p.grad, dict(m.named_parameters())[n].grad), n


def test_explain_forward_only_after_training_hides_the_backward():
    g = _graph()
    m = hcompile(models.rgat, in_dim=8, out_dim=4, heads=2, num_relations=3, backend="torch")
    m(g, x=torch.randn(16, 8)).sum().backward()
    fwd_only = hector.explain(m, g, backward=False)
    assert "backward plan" not in fwd_only and "pass autodiff" not in fwd_only
    assert "backward plan" in hector.explain(m, g, backward=True)


def test_a_failed_backward_build_leaves_the_entry_as_it_was(monkeypatch):
    from hector.compiler.passes import autodiff
    g = _graph()
    m = hcompile(models.rgat, in_dim=8, out_dim=4, heads=2, num_relations=3, backend="torch")
    x = torch.randn(16, 8)
    real = autodiff.bind_saved

    def fail(*args, **kwargs):
        raise RuntimeError("build failed")
    monkeypatch.setattr(autodiff, "bind_saved", fail)   # after autodiff ran, before lowering
    with pytest.raises(RuntimeError, match="build failed"):
        m(g, x=x)
    (cp,) = m.program._cache.values()
    assert cp.backward_plan is None
    assert [r.name for r in cp.log] == ["canonicalize", "reorder", "compact", "siblings", "fuse"]
    monkeypatch.setattr(autodiff, "bind_saved", real)
    m(g, x=x).sum().backward()                           # retried: built once, logged once
    names = [r.name for r in cp.log]
    assert cp.backward_plan is not None and names.count("autodiff") == 1
    assert all(p.grad is not None for p in m.parameters())


def _subset_grads(model, dims, graph, autodiff, mask_seed, fuse):
    """The gradients of a random subset of {x, every parameter} (the others need none), by
    name; the subset drawn from ``mask_seed`` so both autodiffs get the same one."""
    torch.manual_seed(3)
    m = hcompile(model, autodiff=autodiff, backend="torch", num_relations=graph.num_relations,
                 num_node_types=graph.num_node_types, fuse=fuse, **dims)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(graph.num_nodes, dims["in_dim"], generator=torch.Generator().manual_seed(4))
    leaves = {"x": x, **dict(m.named_parameters())}
    pick = torch.rand(len(leaves), generator=torch.Generator().manual_seed(mask_seed)) < 0.5
    wanted = [n for n, keep in zip(leaves, pick.tolist()) if keep] or ["x"]
    for n, t in leaves.items():
        t.requires_grad_(n in wanted)
    out = m(graph, x=x)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    grads = torch.autograd.grad((out * w).sum(), [leaves[n] for n in wanted])
    return dict(zip(wanted, grads))


@pytest.mark.parametrize("model,dims", CASES, ids=lambda c: getattr(c, "__name__", ""))
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("mask_seed", [0, 1, 2])
def test_ir_backward_of_some_leaves_matches_torch_autograd(model, dims, fuse, mask_seed):
    """Only some leaves need gradients: the backward runs its part for them (``Plan.pruned``)
    and gives what torch autograd gives for each."""
    g = _graph()
    ref = _subset_grads(model, dims, g, "torch", mask_seed, fuse)
    got = _subset_grads(model, dims, g, "ir", mask_seed, fuse)
    assert got.keys() == ref.keys()
    for n in ref:
        assert rel_err(got[n], ref[n]) < 1e-4, n
