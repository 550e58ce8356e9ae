"""Node rows added to an attention's output (``fuse_attention._fold_bias``, an addend): GAT's
residual ``x W_res (+ b)`` and Transformer's root projection are added by the attention
kernel as it stores each output row, the bias riding on the residual GEMM's epilogue.  The
folded plan's output and every gradient equal the unfolded plan's (the rule switched off) on
both backends, rows without incoming edges getting the addend alone; what stays apart
(averaged heads, an addend read elsewhere)."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import ir as N
from hector.compiler import models
from hector.compiler.passes import fuse_attention
from hector.compiler.program import compile as hcompile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, rel_err  # noqa: E402
from test_attention_bias import _attention_steps, stored_by_the_attention  # noqa: E402


def _graph(seed=0, num_nodes=24, num_edges=90):
    """Random edges; the last four nodes receive none (their output is the addend)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = torch.randint(0, num_nodes - 4, (num_edges,), generator=gen)
    return hector.Graph(torch.stack([src, dst]), num_nodes=num_nodes)


def _no_addends(monkeypatch):
    """The rule switched off: node rows are not folded (a weight row still is)."""
    real = fuse_attention._output_term
    monkeypatch.setattr(fuse_attention, "_output_term",
                        lambda att, x, t: real(att, x, t) if t.kind == N.WEIGHT else None)


def _run(fn, g, backend, fold, monkeypatch, dtype=torch.float32, **kw):
    """(compiled plan, output, gradients by name and ``"x"``) of one forward and the backward
    of a weighted sum of the output, with non-zero biases."""
    if not fold:
        _no_addends(monkeypatch)
    dev = device_for(backend)
    torch.manual_seed(1)
    m = hcompile(fn, backend=backend, **kw).to(dev, dtype)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "bias" in name:
                p.copy_(torch.linspace(-1, 2, p.numel()).view_as(p))
    g = g.to(dev)
    torch.manual_seed(2)
    x = torch.randn(g.num_nodes, kw["in_dim"], dtype=dtype).to(dev).requires_grad_()
    out = m(g, x=x)
    if isinstance(out, (tuple, list)):           # several outputs: one flat row
        out = torch.cat([o.flatten() for o in out])
    (out * torch.linspace(-1, 1, out.numel(), device=dev, dtype=dtype).view_as(out)).sum() \
        .backward()
    grads = {n: p.grad.cpu() for n, p in m.named_parameters()}
    grads["x"] = x.grad.cpu()
    cp = m.program.compiled_for(g)
    monkeypatch.undo()
    return cp, out.detach().cpu(), grads, m, x.detach().cpu()


def _addend_role(step):
    roles = N.attention_roles(step.body)
    return roles.get("bias")


def _check_same(out, grads, ref, ref_grads, tol):
    assert rel_err(out, ref) < tol
    assert set(grads) == set(ref_grads)
    for name, gr in grads.items():
        if name == "key_bias":    # zero but for rounding: a softmax ignores a shift of all
            assert gr.abs().max() < 1e-4     # of a destination's scores
            continue
        assert rel_err(gr, ref_grads[name]) < 10 * tol, name


CASES = [(torch.float32, "torch"), (torch.float64, "torch"), (torch.float32, "triton")]


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype, backend", CASES, ids=["torch-fp32", "torch-fp64", "triton"])
def test_gat_residual_is_the_attention_addend(dtype, backend, heads, bias, monkeypatch):
    kw = dict(in_dim=8, out_dim=6, heads=heads, residual=True, bias=bias)
    g = _graph()
    cp, out, grads, m, x = _run(models.gat, g, backend, True, monkeypatch, dtype, **kw)
    _, ref, ref_grads, _, _ = _run(models.gat, g, "torch", False, monkeypatch, dtype, **kw)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    _check_same(out, grads, ref, ref_grads, tol)
    # Edgeless rows: the addend alone, x W_res^T + b.
    w = dict(m.named_parameters())
    addend = x[-4:] @ w["res"].detach().cpu().t()
    if bias:
        addend = addend + w["bias"].detach().cpu()
    torch.testing.assert_close(out[-4:], addend)
    fwd, decided = stored_by_the_attention(cp)
    role = _addend_role(fwd)
    assert role is not None and role.kind == N.NODE
    # The residual GEMM stores x W + b (its bias epilogue).
    gemms = [s for s in cp.forward_plan.steps if s.template == "gemm"]
    assert any(s.spec[0].has_bias for s in gemms) == bias
    assert "node-rows addend add into attention" in decided
    assert ("bias add into attention (joins its addend)" in decided) == bias


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("bias", [True, False])
def test_transformer_root_is_the_attention_addend(backend, bias, monkeypatch):
    kw = dict(in_dim=8, out_dim=6, heads=2, bias=bias)
    g = _graph(seed=3)
    cp, out, grads, _, _ = _run(models.transformer, g, backend, True, monkeypatch, **kw)
    _, ref, ref_grads, _, _ = _run(models.transformer, g, "torch", False, monkeypatch, **kw)
    _check_same(out, grads, ref, ref_grads, 1e-5)
    (fwd,) = _attention_steps(cp.forward_plan)
    assert _addend_role(fwd).kind == N.NODE


def _both_read(m, in_dim, out_dim, keep="attention"):
    """An attention plus the residual product, with the attention's output (or the product)
    returned as well."""
    x = m.node_input("x", in_dim)
    z = m.linear(x, m.weight("lin", (in_dim, out_dim)), heads=1)
    a_src = m.linear(z, m.weight("att_src", (1, out_dim, 1)))
    a_dst = m.linear(z, m.weight("att_dst", (1, out_dim, 1)))
    alpha = m.edge_softmax(m.leaky_relu(m.src(a_src) + m.dst(a_dst), 0.2))
    out = m.heads(m.aggregate(alpha * m.src(z), "sum"), 1)
    r = m.linear(x, m.weight("res", (in_dim, out_dim)))
    return out + r, out if keep == "attention" else r


def _keep_product(m, in_dim, out_dim):
    return _both_read(m, in_dim, out_dim, keep="product")


@pytest.mark.parametrize("case", ["averaged heads", "attention read elsewhere"])
def test_an_addend_that_cannot_fold_stays_apart(case):
    g = _graph()
    if case == "averaged heads":
        m = hcompile(models.gat, backend="torch", in_dim=8, out_dim=6, heads=2, concat=False,
                     residual=True)
    else:
        m = hcompile(_both_read, backend="torch", in_dim=8, out_dim=6)
    m(g, x=torch.randn(g.num_nodes, 8))
    (fwd,) = _attention_steps(m.program.compiled_for(g).forward_plan)
    assert _addend_role(fwd) is None


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_an_addend_read_elsewhere_still_folds(backend, monkeypatch):
    """The product is an output too: the attention adds it all the same (it is stored once,
    for both readers)."""
    g = _graph()
    kw = dict(in_dim=8, out_dim=6)
    cp, out, grads, _, _ = _run(_keep_product, g, backend, True, monkeypatch, **kw)
    _, ref, ref_grads, _, _ = _run(_keep_product, g, "torch", False, monkeypatch, **kw)
    _check_same(out, grads, ref, ref_grads, 1e-5)
    (fwd,) = _attention_steps(cp.forward_plan)
    assert _addend_role(fwd) is not None


def test_fold_joins_the_addend_and_the_bias():
    x = N.input_("x", 8)
    att = N.attention({"v": N.linear(x, N.param("w", (8, 8)), 1)}, (1, 8), 1.0, None)
    r = N.linear(x, N.param("r", (8, 8)), 1)
    b = N.param("b", (8,))
    decisions = []
    (y,) = fuse_attention._fold_bias((N.binary("add", N.binary("add", att, r), b),), {},
                                     decisions)
    assert y.op == N.Op.ATTENTION
    added = N.attention_roles(y)["bias"]
    assert added.op == N.Op.ADD and added.args == (r, b)
    assert [d.applied for d in decisions] == [True, True]
