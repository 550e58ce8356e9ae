"""The attention epilogue bias (``fuse_attention._fold_bias``): ``[reshape](attention) + b``
runs as the attention kernel's epilogue (RGAT's output bias): outputs and every gradient, the
bias's included, equal the unfolded plan's on both backends, rows without incoming edges
getting the bias alone; what stays apart (averaged heads, a bias per relation, an attention
read elsewhere)."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import ir as N
from hector.compiler import models
from hector.compiler.passes import fuse, fuse_attention
from hector.compiler.program import compile as hcompile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, forward_backward, rel_err  # noqa: E402


def _graph(seed=0, num_nodes=24, num_edges=90, relations=3):
    """Random typed edges; the last four nodes receive none (their output is the bias)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = torch.randint(0, num_nodes - 4, (num_edges,), generator=gen)
    et = torch.randint(0, relations, (num_edges,), generator=gen)
    return hector.Graph(torch.stack([src, dst]), edge_type=et, num_nodes=num_nodes,
                        num_relations=relations)


def _run(fn, g, backend, fold, monkeypatch, **kw):
    if not fold:     # (patched where it is read: fuse.run and fuse.attention_for_autodiff)
        monkeypatch.setattr(fuse, "_fold_bias", lambda outputs, memo, decisions: outputs)
    dev = device_for(backend)
    torch.manual_seed(1)
    m = hcompile(fn, backend=backend, **kw).to(dev)
    with torch.no_grad():       # a bias that is not zero (the layers start it at zeros)
        for name, p in m.named_parameters():
            if "bias" in name:
                p.copy_(torch.linspace(-1, 2, p.numel()).view_as(p))
    g = g.to(dev)
    out, grads = forward_backward(m, g, dev, kw["in_dim"])
    monkeypatch.undo()
    return m.program.compiled_for(g), out, grads


def _attention_steps(plan):
    return [s for s in plan.steps if s.template == "attention"]


def stored_by_the_attention(cp):
    """(the forward's attention step, the applied fuse decisions) of a plan whose one
    attention adds its bias role as it stores (a bias row, or node rows: an addend), checked:
    nothing reads the attention's rows back (at most a view of them is the output), and its
    backward keeps the role, with no gradient of its own."""
    (fwd,) = _attention_steps(cp.forward_plan)
    assert "bias" in fwd.body.attr("roles")
    after = cp.forward_plan.steps[cp.forward_plan.steps.index(fwd) + 1:]
    assert all(getattr(s.spec, "schedule", None) == "view" for s in after), after
    (bwd,) = _attention_steps(cp.backward_plan)
    assert "bias" in bwd.body.attr("roles") and "bias" not in bwd.body.attr("needs")
    return fwd, [d.what for r in cp.log for d in r.decisions if d.applied]


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_rgat_bias_in_the_attention_epilogue(backend, heads, monkeypatch):
    kw = dict(in_dim=8, out_dim=6, heads=heads, num_relations=3)
    g = _graph()
    cp, out, grads = _run(models.rgat, g, backend, True, monkeypatch, **kw)
    _, ref, ref_grads = _run(models.rgat, g, "torch", False, monkeypatch, **kw)
    assert rel_err(out, ref) < 1e-5
    assert set(grads) == set(ref_grads) and "bias" in grads
    for name, gr in grads.items():
        assert rel_err(gr, ref_grads[name]) < 1e-4, name
    bias = torch.linspace(-1, 2, heads * 6)
    torch.testing.assert_close(out[-4:], bias.expand(4, -1))     # edgeless rows: bias alone
    _, decided = stored_by_the_attention(cp)
    assert "bias add into attention" in decided


def _mean_heads(m, in_dim, out_dim, num_relations=3):
    return models.rgat(m, in_dim, out_dim, heads=2, concat=False)


@pytest.mark.parametrize("fn", [_mean_heads], ids=["averaged heads"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_bias_after_averaged_heads_stays_apart(fn, backend, monkeypatch):
    kw = dict(in_dim=8, out_dim=6, num_relations=3)
    g = _graph()
    cp, out, grads = _run(fn, g, backend, True, monkeypatch, **kw)
    _, ref, ref_grads = _run(fn, g, "torch", False, monkeypatch, **kw)
    assert rel_err(out, ref) < 1e-5
    for name, gr in grads.items():
        assert rel_err(gr, ref_grads[name]) < 1e-4, name
    (fwd,) = _attention_steps(cp.forward_plan)
    assert "bias" not in fwd.body.attr("roles")


def _att():
    x = N.input_("x", 8)
    z = N.linear(N.gather(x, N.CSRC, "src"), N.param("w", (8, 8), per="relation"), 1)
    return N.attention({"v": z}, (1, 8), 1.0, None)


@pytest.mark.parametrize("case", ["per node type", "read elsewhere", "one value"])
def test_fold_declines(case):
    att = _att()
    b = N.param("b", (1,) if case == "one value" else (8,),
                per="node_type" if case == "per node type" else None)
    y = N.binary("add", att, b)
    outs = (y, att) if case == "read elsewhere" else (y,)
    folded = fuse_attention._fold_bias(outs, {}, [])
    assert folded == outs


def test_fold_makes_the_bias_a_role():
    att = _att()
    b = N.param("b", (8,))
    decisions = []
    (y,) = fuse_attention._fold_bias((N.binary("add", att, b),), {}, decisions)
    assert y.op == N.Op.ATTENTION and N.attention_roles(y)["bias"] == b
    assert decisions and decisions[0].applied


def test_an_output_the_backward_reads_is_not_pinned_and_not_changed_in_place():
    """RGAT's output (one head) is the attention's own output, which its backward reads: it
    is kept as an alias the backward drops after the attention backward (not in
    ``save_for_backward``, which would hold it through the whole backward after the caller
    let it go), and an in-place change of it before the backward is an error."""
    g = _graph()
    torch.manual_seed(1)
    m = hcompile(models.rgat, backend="torch", in_dim=8, out_dim=6, num_relations=3)
    x = torch.randn(g.num_nodes, 8, requires_grad=True)
    out = m(g, x=x)
    node = out.grad_fn
    while "PlanFunction" not in type(node).__name__:
        node = node.next_functions[0][0]
    assert node.saved_tensors == ()
    out.sum().backward()                      # the alias path gives the same gradients
    ref = x.grad.clone()
    x.grad = None
    with hector.retain_saved():               # save_for_backward path
        m(g, x=x).sum().backward()
    torch.testing.assert_close(x.grad, ref)
    out = m(g, x=x)
    out.mul_(2.0)
    with pytest.raises(RuntimeError, match="in-place"):
        out.sum().backward()
