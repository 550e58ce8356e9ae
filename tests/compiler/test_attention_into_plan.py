"""A compiled backward writes the attention's source-side gradients over the forward's k and
v (the saved values it reads for the last time), on the Triton backend, and only when that is
safe: not when the saved values are retained for a second backward, not when the backward
records a graph of its own, never over a tensor the caller holds (inputs, parameters, the
layer's output).  The gradients equal torch autograd's through the forward's torch ops."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.kernels.attention import custom_ops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import device_for  # noqa: E402
from test_attention_backward import CASES as _CASES, _compiled, _grads, _graph  # noqa: E402

# RGAT with per-head outputs wide enough that its value rows (N = 32) and its score term
# (N = 2) stay two GEMMs: with N = 8 + 2 the siblings pass makes them one 16-column GEMM, v
# becomes a column window of that output, and nothing may be written over a window.
# The transformer-like model over relu(x): its projections of a layer input would be one
# GEMM (siblings' node rows), k and v column windows of it, which nothing may be written
# over; of relu(x) they stay apart, and the backward writes over k and v.
CASES = [(c[0], dict(c[1], relu_input=True)) if c[0].__name__ == "transformer_like" else
         c if c[0] is not hector.compiler.models.rgat else
         (c[0], dict(c[1], out_dim=16)) for c in _CASES]


@pytest.fixture
def into_calls(monkeypatch):
    """``into_kv`` of every attention backward launched."""
    calls = []
    real = custom_ops.attention_backward

    def spy(*args, **kw):
        calls.append(args[17] if len(args) > 17 else kw.get("into_kv", False))
        return real(*args, **kw)
    monkeypatch.setattr(custom_ops, "attention_backward", spy)
    return calls


def _layer(model, dims, graph):
    """(layer, x) on the Triton backend's device; ``graph`` must be moved there too."""
    torch.manual_seed(3)
    m = _compiled(model, dims, graph, backend="triton")
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.4)
    x = torch.randn(graph.num_nodes, dims["in_dim"], generator=torch.Generator().manual_seed(4))
    dev = device_for("triton")
    return m.to(dev), x.to(dev).requires_grad_()


@pytest.mark.parametrize("model,dims", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_the_backward_writes_dk_dv_over_k_v_and_matches_torch(model, dims, into_calls):
    g = _graph()
    out, grads = _grads(model, dims, g, "ir", "triton")
    assert into_calls == [True]
    ref_out, ref = _grads(model, dims, g, "torch", "torch")
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    for name in ref:
        torch.testing.assert_close(grads[name], ref[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("model,dims", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_caller_tensors_are_never_overwritten(model, dims, into_calls):
    g = _graph().to(device_for("triton"))
    m, x = _layer(model, dims, g)
    params = {n: p.detach().clone() for n, p in m.named_parameters()}
    x0 = x.detach().clone()
    out = m(g, x=x)
    out0 = out.detach().clone()
    out.square().sum().backward()
    assert into_calls == [True]
    assert torch.equal(x.detach(), x0) and torch.equal(out.detach(), out0)
    for n, p in m.named_parameters():
        assert torch.equal(p.detach(), params[n]), n


@pytest.mark.parametrize("model,dims", CASES[2:], ids=lambda c: getattr(c, "__name__", ""))
def test_retained_saved_values_are_not_overwritten(model, dims, into_calls):
    """Inside ``retain_saved`` the saved k and v stay intact: two backwards agree with one
    outside it (which wrote over them)."""
    g = _graph().to(device_for("triton"))
    m, x = _layer(model, dims, g)
    first, = torch.autograd.grad(m(g, x=x).square().sum(), [x])
    with hector.retain_saved():
        loss = m(g, x=x).square().sum()
    a, = torch.autograd.grad(loss, [x], retain_graph=True)
    b, = torch.autograd.grad(loss, [x])
    assert into_calls == [True, False, False]
    torch.testing.assert_close(a, first, rtol=1e-6, atol=1e-6)
    assert torch.equal(a, b)


def test_a_backward_that_records_a_graph_does_not_overwrite(into_calls):
    """``create_graph=True``: the backward's own ops may be differentiated again, so they
    keep their inputs."""
    model, dims = CASES[2]
    g = _graph().to(device_for("triton"))
    m, x = _layer(model, dims, g)
    want, = torch.autograd.grad(m(g, x=x).square().sum(), [x])
    got, = torch.autograd.grad(m(g, x=x).square().sum(), [x], create_graph=True)
    assert into_calls == [True, False]
    torch.testing.assert_close(got.detach(), want, rtol=1e-6, atol=1e-6)
