"""GAT's per-head score products as one (``siblings.fuse_scores``): ``linear(z, a_src)`` and
``linear(z, a_dst)`` (per-head ``[H, C, 1]`` weights) become one product of ``z``'s rows with
their block-diagonal ``[H*C, 2H]`` matrix (``wblocks``), read back as column windows, and
lowering forms it in the epilogue of ``z``'s own GEMM.  Against the program compiled without
the rule: output and the gradients of x, lin, att_src and att_dst, both backends, 1 and 3
heads, fp32 and float64; the explain lines; where the rule declines and why; the launches of
a training step and of an inference call."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import explain as explaining
from hector.compiler import models
from hector.compiler.ir import Op
from hector.compiler.launches import CallCounter, count_step, summary, total
from hector.compiler.passes import siblings
from hector.graph import with_self_loops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, rel_err  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")    # interpreter chatter


def _graph(num_nodes=12, num_edges=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, num_nodes, (2, num_edges), generator=g)
    return with_self_loops(hector.Graph(ei, num_nodes=num_nodes))


def _run(backend, heads, dtype, F=6, C=4):
    """Output and gradients (x, lin, att_src, att_dst) of the compiled GAT program."""
    torch.manual_seed(0)
    dev = device_for(backend)
    m = hector.compile(models.gat, in_dim=F, out_dim=C, heads=heads, backend=backend)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(std=0.5)
    m = m.to(dev, dtype)
    graph = _graph().to(dev)
    x = torch.randn(graph.num_nodes, F, generator=torch.Generator().manual_seed(2))
    x = x.to(dev, dtype).requires_grad_()
    out = m(graph, x=x)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(dev, dtype)
    grads = torch.autograd.grad((out * w).sum(), [x, m.lin, m.att_src, m.att_dst])
    return m.program.compiled_for(graph, dtype), out.detach(), grads


CASES = [("torch", 1, torch.float32), ("torch", 3, torch.float32),
         ("torch", 1, torch.float64), ("torch", 3, torch.float64),
         ("triton", 1, torch.float32), ("triton", 3, torch.float32)]


@pytest.mark.parametrize("backend,heads,dtype", CASES, ids=str)
def test_one_score_product_equals_the_two(backend, heads, dtype, monkeypatch):
    cp, out, grads = _run(backend, heads, dtype)
    fwd = cp.forward_plan.steps
    assert [s.body.op for s in fwd if s.template == "weight"] == [Op.WBLOCKS]
    gemms = [s for s in fwd if s.template == "gemm"]
    if dtype == torch.float32:        # 2H <= 8 columns: the projection's epilogue forms them
        assert len(gemms) == 1 and gemms[0].spec[0].extra_cols == 2 * heads
        assert "(x W) V" in gemms[0].note
    else:                             # (float64 takes 2 extra columns: 6 are a GEMM of their own)
        assert len(gemms) == 1 + (heads > 1)
    monkeypatch.setattr(siblings, "fuse_scores", lambda outputs, decisions: outputs)
    ref_cp, ref_out, ref_grads = _run(backend, heads, dtype)
    assert not any(s.template == "weight" for s in ref_cp.forward_plan.steps)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert rel_err(out, ref_out) < tol
    for name, got, want in zip(["x", "lin", "att_src", "att_dst"], grads, ref_grads):
        assert got.shape == want.shape
        assert rel_err(got, want) < tol, name


def test_explain_says_why():
    text = explaining.explain(hector.compile(models.gat, in_dim=6, out_dim=4, heads=2),
                              _graph())
    assert ("[siblings] applied: 2 per-head score linears of one node value (2 heads) -- one "
            "product of the 8-column rows with their block-diagonal 8 x 4 weight") in text
    assert "+ (x W) V (4 columns" in text
    assert "[siblings] declined: 1 concat(s) of window gradients" in text
    assert "hector::head_blocks" in text


def _decisions(fn, **dims):
    cp = hector.compile(fn, **dims).program.compiled_for(_graph())
    return [str(d) for rec in cp.forward.log if rec.name == "siblings" for d in rec.decisions]


def _gat_scores_out(m, in_dim, heads=2, dim=4):
    """GAT whose source score is also an output."""
    x = m.node_input("x", in_dim)
    z = m.linear(x, m.weight("lin", (in_dim, heads * dim)), heads=heads)
    a_src = m.linear(z, m.weight("att_src", (heads, dim, 1)))
    a_dst = m.linear(z, m.weight("att_dst", (heads, dim, 1)))
    alpha = m.edge_softmax(m.leaky_relu(m.src(a_src) + m.dst(a_dst), 0.2))
    return m.heads(m.aggregate(alpha * m.src(z), "sum"), 1), a_src


def _gat_of_input(m, in_dim, heads=2):
    """Scores of the input rows themselves (no GEMM of z to ride on)."""
    z = m.heads(m.node_input("x", heads * in_dim), heads)
    a_src = m.linear(z, m.weight("att_src", (heads, in_dim, 1)))
    a_dst = m.linear(z, m.weight("att_dst", (heads, in_dim, 1)))
    alpha = m.edge_softmax(m.leaky_relu(m.src(a_src) + m.dst(a_dst), 0.2))
    return m.heads(m.aggregate(alpha * m.src(z), "sum"), 1)


def test_declines_with_its_reason():
    many = _decisions(models.gat, in_dim=6, out_dim=4, heads=5)
    assert any("declined: 2 per-head score linears" in d and "10 columns" in d for d in many)
    read = _decisions(_gat_scores_out, in_dim=6)
    assert any("declined: 2 per-head score linears" in d and "read by output" in d
               for d in read)
    plain = _decisions(_gat_of_input, in_dim=4)
    assert any("declined: 2 per-head score linears" in d and "not the output of a GEMM" in d
               for d in plain)


def _counts(heads):
    torch.manual_seed(0)
    dev = device_for("triton")
    m = hector.compile(models.gat, in_dim=16, out_dim=8, heads=heads, backend="triton").to(dev)
    graph = _graph(20, 60).to(dev)
    x = torch.randn(20, 16, generator=torch.Generator().manual_seed(2)).to(dev)

    def forward():
        return m(graph, x=x)
    forward().sum().backward()          # the first call plans and fills caches: not counted
    step = count_step(forward, dev.type, list(m.parameters()))
    with torch.no_grad():
        with CallCounter(dev.type) as inference:
            forward()
    return step, inference.launches


@pytest.mark.parametrize("heads", [1, 2])
def test_launches(heads):
    """Training forward and inference: the block matrix (one kernel), the projection with
    the scores in its epilogue, the attention; the backward within the separate products'
    twelve (one kernel for the block matrix's gradient in place of a second score GEMM)."""
    step, inference = _counts(heads)
    for c in (step["forward"], inference):
        assert total(c) == 3 and c["triton::head_blocks_kernel"] == 1, summary(c)
        assert c["triton::segment_mm_kernel"] == 1, summary(c)
    assert total(step["backward"]) <= 12, summary(step["backward"])
    assert step["backward"]["triton::head_blocks_bwd_kernel"] == 1
