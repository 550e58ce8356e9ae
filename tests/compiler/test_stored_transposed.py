"""Weights declared ``stored="transposed"`` (``Model.weight``): a ``(K, N)`` matrix whose
tensor is ``[N, K]``, as ``nn.Linear.weight``.  The program reading such a tensor gives what
the same program with ``(K, N)`` tensors gives, output and every gradient, each weight's
gradient in its own layout; on both backends (Triton under the interpreter on CPUs), fp32
and (torch) fp64; with the same plans and the same launches (no copy turns a weight or its
gradient around).  Programs: a plain GEMM with its bias epilogue, a gathered GEMM aggregated
by destination (the weight gradient over gathered rows), and GAT (the projection's
epilogue product, the residual, the weight gradient paired with the bias gradient)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import dsl, ir, models
from hector.compiler.ir import Op, toposort
from hector.compiler.launches import count_step, total
from hector.graph import with_self_loops
from hector.kernels.segment_mm import custom_ops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, rel_err  # noqa: E402


def mean_conv(m, in_dim, out_dim, stored=None):
    x = m.node_input("x", in_dim)
    msg = m.linear(m.src(x), m.weight("w", (in_dim, out_dim), stored=stored))
    root = m.linear(x, m.weight("root", (in_dim, out_dim), stored=stored))
    return m.aggregate(msg, "mean") + root + m.weight("bias", (out_dim,))


def dense(m, in_dim, out_dim, stored=None):
    x = m.node_input("x", in_dim)
    return m.linear(x, m.weight("w", (in_dim, out_dim), stored=stored)) + m.weight(
        "bias", (out_dim,))


def gat_plain(m, in_dim, out_dim, heads=1, concat=True, residual=False):
    """``models.gat`` with ``(K, N)`` tensors for ``lin`` and ``res``."""
    x = m.node_input("x", in_dim)
    z = m.linear(x, m.weight("lin", (in_dim, heads * out_dim)), heads=heads)
    a_src = m.linear(z, m.weight("att_src", (heads, out_dim, 1)))
    a_dst = m.linear(z, m.weight("att_dst", (heads, out_dim, 1)))
    alpha = m.edge_softmax(m.leaky_relu(m.src(a_src) + m.dst(a_dst), 0.2))
    out = m.aggregate(alpha * m.src(z), "sum")
    out = m.heads(out, 1) if concat else m.head_mean(out)
    width = heads * out_dim if concat else out_dim
    if residual:
        out = out + m.linear(x, m.weight("res", (in_dim, width)))
    return out + m.weight("bias", (width,), init="zeros")


def _gat(stored):
    return models.gat if stored else gat_plain


PROGRAMS = {
    "dense": (lambda stored: dense, dict(in_dim=20, out_dim=24), ("w",)),
    "mean_conv": (lambda stored: mean_conv, dict(in_dim=20, out_dim=24), ("w", "root")),
    "gat_4h_residual": (_gat, dict(in_dim=16, out_dim=8, heads=4, residual=True),
                        ("lin", "res")),
    "gat_1h_mean": (_gat, dict(in_dim=16, out_dim=8, heads=1, concat=False), ("lin",)),
}


def _pair(name, backend, dtype):
    """(the program with transposed tensors, the one with (K, N) tensors), same values."""
    fn, dims, transposed = PROGRAMS[name]
    extra = {} if name.startswith("gat") else dict(stored="transposed")
    torch.manual_seed(0)
    plain = hector.compile(fn(False), backend=backend, **dims)
    ours = hector.compile(fn(True), backend=backend, **dims, **extra)
    with torch.no_grad():
        for n, p in plain.named_parameters():
            p.normal_(std=0.5)
            getattr(ours, n).copy_(p.t() if n in transposed else p)
    dev = device_for(backend)
    return ours.to(dev, dtype), plain.to(dev, dtype), transposed


def _graph(dev, n=14, e=40):
    ei = torch.randint(0, n, (2, e), generator=torch.Generator().manual_seed(1))
    return with_self_loops(hector.Graph(ei, num_nodes=n)).to(dev)


CASES = [("torch", torch.float32), ("torch", torch.float64), ("triton", torch.float32)]


@pytest.mark.parametrize("backend,dtype", CASES, ids=str)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_transposed_tensors_give_the_same_outputs_and_gradients(name, backend, dtype):
    ours, plain, transposed = _pair(name, backend, dtype)
    dev = device_for(backend)
    graph = _graph(dev)
    x = torch.randn(graph.num_nodes, PROGRAMS[name][1]["in_dim"],
                    generator=torch.Generator().manual_seed(2)).to(dev, dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = ours(graph, x=xa), plain(graph, x=xb)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert rel_err(a.detach(), b.detach()) < tol
    w = torch.randn(a.shape, generator=torch.Generator().manual_seed(3)).to(dev, dtype)
    names = [n for n, _ in plain.named_parameters()]
    ga = torch.autograd.grad((a * w).sum(), [xa] + [getattr(ours, n) for n in names])
    gb = torch.autograd.grad((b * w).sum(), [xb] + [getattr(plain, n) for n in names])
    for n, got, want in zip(["x"] + names, ga, gb):
        if n in transposed:       # the stored layout, dense: nothing turned it around
            assert got.shape == want.shape[::-1] and got.is_contiguous(), n
            want = want.t()
        assert rel_err(got, want) < tol, n
    with torch.no_grad():
        assert rel_err(ours(graph, x=x), plain(graph, x=x)) < tol


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_same_plans_and_launches_as_with_untransposed_tensors(name):
    """The plans differ only in which weights are read transposed (and the weight gradients
    written so), and a Triton training step launches exactly what it launches with (K, N)
    tensors: no copy of a weight, nor of a weight gradient, anywhere."""
    ours, plain, _ = _pair(name, "triton", torch.float32)
    dev = device_for("triton")
    graph = _graph(dev)
    x = torch.randn(graph.num_nodes, PROGRAMS[name][1]["in_dim"]).to(dev)
    shape = []
    for m in (ours, plain):
        cp = m.program.compile_exact(graph)
        shape.append([(s.template, s.extra is not None, s.name.replace("_wT", ""))
                      for s in cp.forward_plan.steps + cp.backward_plan.steps])
    assert shape[0] == shape[1]
    cp = ours.program.compile_exact(graph)
    flipped = [s for s in cp.backward_plan.steps if s.body.op == Op.WGRAD
               and s.body.attr("transposed")]
    assert len(flipped) == len(PROGRAMS[name][2])
    assert all("written transposed" in s.note for s in flipped)
    counts = []
    for m in (ours, plain):
        m(graph, x=x).sum().backward()       # plans and fills caches: not counted
        c = count_step(lambda: m(graph, x=x), dev.type, list(m.parameters()))
        counts.append((dict(c["forward"]), dict(c["backward"])))
    assert counts[0] == counts[1]
    assert total(counts[0][0]) and total(counts[0][1])


def test_the_declaration():
    m = dsl.Model()
    w = m.weight("lin", (3, 5), stored="transposed")
    decl = m.weights["lin"]
    assert decl.full_shape == (5, 3) and decl.stored == "transposed"
    assert w.value.op == Op.WT and w.shape == (3, 5) and w.value.args[0] is decl.value
    assert ir.wT(w.value) is decl.value          # wT(wT(s)) = s
    # the gradient of a linear reading it is the stored tensor's, in its layout
    g = ir.wgrad(ir.input_("x", 3), ir.input_("dy", 5), w.value)
    assert g.shape == (5, 3) and g.attr("transposed")
    assert m.weights.keys() == {"lin"} and dsl.Model().weight("b", (4,)).value.op == Op.PARAM
    with pytest.raises(ValueError, match="stored must be one of"):
        dsl.Model().weight("w", (3, 5), stored="columns")
    with pytest.raises(NotImplementedError, match="unsliced"):
        dsl.Model().weight("w", (2, 3, 5), stored="transposed")
    with pytest.raises(NotImplementedError, match="unsliced"):
        dsl.Model(num_relations=2).weight("w", (3, 5), per="relation", stored="transposed")


def test_program_checks_the_stored_shape():
    m = hector.compile(dense, in_dim=3, out_dim=5, stored="transposed")
    assert m.w.shape == (5, 3)
    weights = {"w": torch.zeros(3, 5), "bias": torch.zeros(5)}
    with pytest.raises(ValueError, match=r"weight 'w' must have shape \(5, 3\)"):
        m.program(_graph("cpu", n=4, e=6), {"x": torch.zeros(4, 3)}, weights)


def test_the_gradient_targets_the_stored_tensor():
    traced = dsl.trace(dense, in_dim=3, out_dim=5, stored="transposed")
    from hector.compiler.passes import autodiff
    roots = autodiff.weight_roots(traced.outputs)
    assert traced.weights["w"].value in roots
    assert not any(r.op == Op.WT for r in roots)
    bwd = autodiff.differentiate(traced.outputs)
    (dw,) = [o for t, o in zip(bwd.targets, bwd.outputs) if t == traced.weights["w"].value]
    assert dw.op == Op.WGRAD and dw.attr("transposed") and dw.shape == (5, 3)
    # the input gradient reads the stored tensor as it is (no wT of it)
    assert not any(v.op == Op.WT for v in toposort(bwd.outputs))


@pytest.mark.parametrize("sums", [False, True])
def test_wgrad_kernel_stores_the_transposed_gradient(sums):
    dev = device_for("triton")
    gen = torch.Generator().manual_seed(0)
    x, dy = torch.randn(37, 6, generator=gen).to(dev), torch.randn(37, 9, generator=gen).to(dev)
    op = custom_ops.segment_mm_wgrad_sums_op if sums else custom_ops.segment_mm_wgrad_op
    plain = op(x, dy, None, None, [0, 20, 37])
    flipped = op(x, dy, None, None, [0, 20, 37], "", None, True)
    if sums:
        assert torch.equal(plain[1], flipped[1])
        plain, flipped = plain[0], flipped[0]
    assert flipped.shape == (2, 9, 6) and flipped.is_contiguous()
    assert torch.allclose(flipped, plain.transpose(1, 2), atol=1e-6)
    torch.library.opcheck(op, (x, dy, None, None, [0, 20, 37], "", None, True))
