"""A per-head bias ``(H, C)`` added to a linear of H heads (a Transformer whose query, key and
value biases are declared per head) is the segment GEMM's bias epilogue, as a flat bias row
is: the program with the rule against the program without it (the bias then a traversal of
its own), output and every gradient."""
import sys
from pathlib import Path

import pytest
import torch

import math

import hector
from hector.compiler import ir as N
from hector.compiler.passes import fuse_group, siblings
from hector.compiler.program import compile as hcompile
from hector.graph import with_self_loops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, rel_err  # noqa: E402


def _graph():
    gen = torch.Generator().manual_seed(0)
    return with_self_loops(hector.Graph(torch.randint(0, 20, (2, 60), generator=gen),
                                        num_nodes=20))


def _flat_only(lin, bias):
    """The rule as it was: a flat bias row only."""
    return (bias.per == fuse_group._stored_weight(lin).per
            and tuple(bias.shape) == (lin.heads * lin.dim,))


def head_biased(m, in_dim, out_dim, heads=1):
    """A Transformer with per-head ``(heads, out_dim)`` biases on its query, key and value
    (``models.transformer`` declares them flat, as PyG stores them) and a flat root bias."""
    x = m.node_input("x", in_dim)

    def proj(name):
        y = m.linear(x, m.weight(name, (in_dim, heads * out_dim)), heads=heads)
        return y + m.weight(name + "_bias", (heads, out_dim), init="zeros")
    q, k, v = proj("query"), proj("key"), proj("value")
    alpha = m.edge_softmax(m.dot(m.dst(q), m.src(k)) / math.sqrt(out_dim))
    out = m.heads(m.aggregate(alpha * m.src(v), "sum"), 1)
    return out + m.linear(x, m.weight("skip", (in_dim, heads * out_dim))) + \
        m.weight("skip_bias", (heads * out_dim,), init="zeros")


def transformer_step(backend, dtype, heads, **kw):
    """(compiled entry, output, gradients by parameter name and ``"x"``) of one training
    step of the Transformer program with random weights (its biases nonzero) on a small
    graph with self loops."""
    dev = device_for(backend)
    torch.manual_seed(1)
    m = hcompile(head_biased, backend=backend, in_dim=12, out_dim=8, heads=heads,
                 **kw).to(dev, dtype)
    for p in m.parameters():                 # (the biases start at zero)
        torch.nn.init.normal_(p)
    g = _graph().to(dev)
    torch.manual_seed(2)
    x = torch.randn(g.num_nodes, 12, dtype=dtype, device=dev, requires_grad=True)
    out = m(g, x=x)
    (out * torch.linspace(-1, 1, out.numel(), device=dev, dtype=dtype).view_as(out)).sum() \
        .backward()
    grads = {n: p.grad.cpu() for n, p in m.named_parameters()}
    grads["x"] = x.grad.cpu()
    return m.program.compiled_for(g, dtype), out.detach().cpu(), grads


def _run(backend, dtype, heads, rule, monkeypatch):
    # (the projections each a GEMM of their own: siblings would make them one)
    monkeypatch.setattr(siblings, "run", lambda o, s=None, e=True: (tuple(o), []))
    if not rule:
        monkeypatch.setattr(fuse_group, "_bias_fits", _flat_only)
    step = transformer_step(backend, dtype, heads)
    monkeypatch.undo()
    return step


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("backend,dtype", [("torch", torch.float32), ("torch", torch.float64),
                                           ("triton", torch.float32)])
def test_head_shaped_bias_in_the_gemm_epilogue_equals_a_separate_add(backend, dtype, heads,
                                                                     monkeypatch):
    cp, out, grads = _run(backend, dtype, heads, True, monkeypatch)
    ref_cp, ref, ref_grads = _run(backend, dtype, heads, False, monkeypatch)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert rel_err(out, ref) < tol
    assert set(grads) == set(ref_grads)
    for name, g in grads.items():
        assert rel_err(g, ref_grads[name]) < 10 * tol, name

    def gemms_with_bias(c):
        return sum(1 for s in c.forward_plan.steps
                   if s.template == "gemm" and s.spec[0] is not None and s.spec[0].has_bias)
    # query, key and value add their biases in their GEMMs; before, three traversals did (the
    # root projection's flat bias rides its GEMM either way: the attention's store adds
    # that GEMM's rows)
    assert gemms_with_bias(cp) == 4 and gemms_with_bias(ref_cp) == 1
    assert len(cp.forward_plan.steps) == len(ref_cp.forward_plan.steps) - 3
    assert "bias add into linear" in [d.what for r in cp.log for d in r.decisions
                                      if r.name == "fuse" and d.applied]


def test_a_bias_of_other_heads_is_no_epilogue():
    """A (2, 8) bias on an output of one 16-column head broadcasts differently from the
    output's flattened row: it stays a separate add."""
    lin = N.linear(N.input_("x", 12), N.param("w", (12, 16)), 1)
    assert not fuse_group._bias_fits(lin, N.param("b", (2, 8)))
    assert fuse_group._bias_fits(lin, N.param("b", (16,)))
    two_heads = N.linear(N.input_("x", 12), N.param("w", (12, 16)), 2)
    assert fuse_group._bias_fits(two_heads, N.param("b", (2, 8)))
