"""The AGNN program (``hector.compiler.models.agnn``) with fusion's cosine rule
(``passes.fuse_cosine``): ``k = normalize(x)`` and ``q = k * beta`` become one ``cosine_qk``
step, the attention forms its keys from v = x and the norm, autodiff makes one
``cosine_qk_bwd``.  Against PyG's AGNNConv, hector.nn's AGNNConv and the program without
fusion: output and the gradients of x and beta, both backends; its launches against the
layer's; the rule's explain lines, and its declines where the pattern differs."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import models
from hector.compiler.explain import explain
from hector.compiler.ir import Op
from hector.compiler.launches import CallCounter, count_step, summary, total
from hector.compiler.program import Program
from hector.graph import with_self_loops
from hector.nn import AGNNConv

pyg = pytest.importorskip("torch_geometric.nn")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, rel_err  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")    # interpreter chatter

N, F = 16, 8


def _edges(dev):
    return torch.randint(0, N, (2, 30), generator=torch.Generator().manual_seed(1)).to(dev)


def _graph(dev):
    return with_self_loops(hector.Graph(_edges(dev), num_nodes=N))


def _x(dev, dtype, zero_row=True):
    x = torch.randn(N, F, generator=torch.Generator().manual_seed(2), dtype=dtype).to(dev)
    if zero_row:
        x[4] = 0.0           # the norm's eps branch
    return x


def _run(f, x, params, x_grad):
    """Output and the gradients of (beta, x if it needs one) of a weighted sum."""
    x = x.clone().requires_grad_(x_grad)
    out = f(x)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3),
                    dtype=out.dtype).to(out.device)
    grads = torch.autograd.grad((out * w).sum(), params + ([x] if x_grad else []))
    return [out.detach()] + [g.reshape(-1) if g.numel() == 1 else g for g in grads]


@pytest.mark.parametrize("backend,dtype", [("torch", torch.float32), ("torch", torch.float64),
                                           ("triton", torch.float32)])
@pytest.mark.parametrize("x_grad", [True, False])
def test_the_program_is_pyg_agnnconv_the_layer_and_the_unfused_program(backend, dtype, x_grad):
    dev = device_for(backend)
    graph, ei, x = _graph(dev), _edges(dev), _x(dev, dtype)
    ours = hector.compile(models.agnn, in_dim=F, backend=backend).to(dev, dtype)
    plain = hector.compile(models.agnn, in_dim=F, backend="torch", fuse=False).to(dev, dtype)
    ref = pyg.AGNNConv(requires_grad=True).to(dev, dtype)
    layer = AGNNConv(backend=backend, add_self_loops=False).to(dev, dtype)
    for m in (ours, plain, ref, layer):
        with torch.no_grad():
            m.beta.fill_(0.7)
    got = _run(lambda t: ours(graph, x=t), x, [ours.beta], x_grad)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for name, want in (("pyg", _run(lambda t: ref(t, ei), x, [ref.beta], x_grad)),
                       ("layer", _run(lambda t: layer(t, graph), x, [layer.beta], x_grad)),
                       ("unfused", _run(lambda t: plain(graph, x=t), x, [plain.beta], x_grad))):
        assert len(got) == len(want)
        # (the unfused program's edge softmax runs in fp32: kernels.traversal.reference)
        near = max(tol, 1e-6) if name == "unfused" else tol
        for what, a, b in zip(("out", "beta", "x"), got, want):
            assert rel_err(a, b) < near, (name, what, rel_err(a, b))
    # the rule applied: one cosine step, the attention reads its norm
    cp = ours.program.compile_exact(graph, dtype)
    fwd = cp.forward_plan.steps
    assert [s.body.op for s in fwd if s.template == "cosine"] == [Op.COSINE_QK]
    att = next(s for s in fwd if s.template == "attention")
    assert "k_norm" in att.body.attr("roles") and att.spec[0].normed_k


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_frozen_beta_leaves_x_gradient_as_it_was(backend):
    """beta needs no gradient: the backward's part narrows the cosine step to dx alone, and
    x's gradient is PyG's."""
    dev = device_for(backend)
    graph, ei, x = _graph(dev), _edges(dev), _x(dev, torch.float32)
    ours = hector.compile(models.agnn, in_dim=F, backend=backend).to(dev)
    ref = pyg.AGNNConv(requires_grad=True).to(dev)
    for m in (ours, ref):
        with torch.no_grad():
            m.beta.fill_(0.7)
        m.beta.requires_grad_(False)
    got, want = (_run(f, x, [], True) for f in (lambda t: ours(graph, x=t),
                                                lambda t: ref(t, ei)))
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-5
    cp = ours.program.compile_exact(graph)
    part = cp.backward_part(tuple(t for t in cp.grad_targets if t.op == Op.INPUT)).plan
    assert [s.body.attr("needs") for s in part.steps if s.template == "cosine"] == [("x",)]


def _launches(f, params):
    f().sum().backward()            # the first call plans and fills caches: not counted
    step = count_step(f, device_for("triton").type, params)
    with torch.no_grad(), CallCounter(device_for("triton").type) as inference:
        f()
    return step, inference.launches


@pytest.mark.parametrize("x_grad", [False, True])
def test_launches_no_more_than_the_layers(x_grad):
    """Triton backend: forward and inference two launches (cosine_qk, the attention), the
    backward no more than hector.nn.AGNNConv's on the same graph and features (without x's
    gradient: the attention's destination side and beta's gradient as one dot)."""
    dev = device_for("triton")
    graph, x = _graph(dev), _x(dev, torch.float32).requires_grad_(x_grad)
    ours = hector.compile(models.agnn, in_dim=F, backend="triton").to(dev)
    layer = AGNNConv(backend="triton", add_self_loops=False).to(dev)
    extra = [x] if x_grad else []
    prog, prog_inf = _launches(lambda: ours(graph, x=x), list(ours.parameters()) + extra)
    lay, _ = _launches(lambda: layer(x, graph), list(layer.parameters()) + extra)
    for c in (prog["forward"], prog_inf):
        assert total(c) <= 2, summary(c)
        assert c["triton::cosine_qk_kernel"] == 1 and c["triton::attention_fwd_kernel"] == 1
    assert total(prog["backward"]) <= total(lay["backward"]), (
        summary(prog["backward"]), summary(lay["backward"]))
    assert prog["backward"]["triton::cosine_qk_bwd_kernel"] == int(x_grad)
    assert prog["backward"]["triton::attention_bwd_src_kernel"] == int(x_grad)


def test_explain_says_the_rule_applied_and_the_part_without_x_is_narrowed():
    graph = _graph("cpu")
    text = explain(models.agnn, graph, in_dim=F)
    assert ("[fuse] applied: normalize + beta product -> cosine_qk -- one kernel writes q, k "
            "and each row's norm (hector::cosine_qk); the attention forms each key from the v "
            "row it gathers (v is x)") in text
    assert "[autodiff] applied: cosine_qk backward as one operator" in text
    assert "hector::cosine_qk_backward (Triton cosine_qk_bwd kernel" in text
    forward = text.split("== forward plan")[1].split("ops called")[0]
    assert "cosine_node_cosine_qk" in forward and "traversal" not in forward
    cp = hector.compile(models.agnn, in_dim=F).program.compile_exact(graph)
    whole = cp.backward_plan.steps
    assert [s.body.attr("needs") for s in whole if s.template == "cosine"] == [("x", "beta")]
    part = cp.backward_part(tuple(t for t in cp.grad_targets if t.op != Op.INPUT)).plan
    needs = {s.body.op: s.body.attr("needs") for s in part.steps
             if s.body.op in (Op.ATTENTION_BWD, Op.COSINE_QK_BWD)}
    assert needs == {Op.ATTENTION_BWD: ("q",), Op.COSINE_QK_BWD: ("beta",)}
    assert not any(s.template == "traversal" for s in part.steps)     # (no dx sum)


# -- where the pattern differs -------------------------------------------------------------
def _agnn_like(q_of, out_of=None, v_of=None, heads=1):
    def fn(m, in_dim):
        x = m.node_input("x", in_dim)
        x = m.heads(x, heads) if heads > 1 else x
        k = m.normalize(x)
        q = q_of(m, x, k)
        v = v_of(m, x, in_dim) if v_of else x
        out = m.aggregate(m.edge_softmax(m.dot(m.dst(q), m.src(k))) * m.src(v), "sum")
        return out_of(out, q, k) if out_of else out
    return fn


def _beta(m, shape=(1,)):
    return m.weight("beta", shape, init="ones")


VARIANTS = {
    # (program, the rule's explain line, the attention takes k_norm)
    "q_is_k": (_agnn_like(lambda m, x, k: k),
               "applied: normalize + beta product -> cosine_qk", True),
    "v_is_not_x": (_agnn_like(lambda m, x, k: k * _beta(m),
                              v_of=lambda m, x, d: m.linear(x, m.weight("w", (d, d)))),
                   "applied: normalize + beta product -> cosine_qk -- one kernel writes q, k "
                   "and each row's norm (hector::cosine_qk)\n", False),
    "k_read_elsewhere": (_agnn_like(lambda m, x, k: k * _beta(m), lambda o, q, k: o + k),
                         "declined: normalize + beta product -> cosine_qk -- normalize(x) is "
                         "read beside the attention's q and k", None),
    "q_read_elsewhere": (_agnn_like(lambda m, x, k: k * _beta(m), lambda o, q, k: o + q),
                         "declined: normalize + beta product -> cosine_qk -- q is read beside "
                         "the attention", None),
    "beta_per_feature": (_agnn_like(lambda m, x, k: k * _beta(m, (F,))),
                         "declined: normalize + beta product -> cosine_qk -- q is k times param "
                         f"weight[{F}], not a one-element shared weight", None),
    "q_not_from_k": (_agnn_like(lambda m, x, k: x),
                     "declined: normalize + beta product -> cosine_qk -- q is input, neither k "
                     "nor k times a weight", None),
    "two_heads": (_agnn_like(lambda m, x, k: k * _beta(m), heads=2),
                  "declined: normalize + beta product -> cosine_qk -- 2 heads: the cosine_qk "
                  "kernel normalises one row per node", None),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_rule_applies_or_declines_with_its_reason_and_the_results_hold(name):
    """Each variant's explain line; a cosine step exactly where the rule applied (a k_norm
    where v is x); output and every gradient equal the unfused program's (torch fp64), the
    backward twice through one forward (the saved norm is a tensor of its own)."""
    fn, line, normed = VARIANTS[name]
    graph = _graph("cpu")
    assert line in explain(fn, graph, in_dim=F)
    cp = Program(fn, in_dim=F).compile_exact(graph)
    fwd = cp.forward_plan.steps
    assert any(s.template == "cosine" for s in fwd) == (normed is not None)
    if normed is not None:
        att = next(s for s in fwd if s.template == "attention")
        assert ("k_norm" in att.body.attr("roles")) == normed
    x = _x("cpu", torch.float64)
    results = []
    for fuse in (True, False):
        torch.manual_seed(0)
        m = hector.compile(fn, in_dim=F, backend="torch", fuse=fuse).double()
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(4)) + 1)
        params = list(m.parameters())
        with hector.retain_saved():
            xr = x.clone().requires_grad_()
            out = m(graph, x=xr)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3),
                        dtype=out.dtype)
        first = torch.autograd.grad((out * w).sum(), params + [xr], retain_graph=True)
        again = torch.autograd.grad((out * w).sum(), params + [xr])
        assert all(torch.equal(a, b) for a, b in zip(first, again))
        results.append([out.detach(), *first])
    for a, b in zip(*results):      # (the unfused edge softmax runs in fp32)
        assert rel_err(a, b) < 1e-6


@pytest.mark.parametrize("name", ["q_is_k", "v_is_not_x"])
def test_the_rule_on_triton_where_v_is_not_x_or_beta_absent(name):
    """The Triton backend runs what the rule made for the variants it applies to, as the
    torch backend does (fp32)."""
    fn = VARIANTS[name][0]
    graph, x = _graph(device_for("triton")), _x(device_for("triton"), torch.float32)
    results = []
    for backend in ("torch", "triton"):
        torch.manual_seed(0)
        m = hector.compile(fn, in_dim=F, backend=backend).to(x.device)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(4)) + 1)
        results.append(_run(lambda t: m(graph, x=t), x, list(m.parameters()), True))
    for a, b in zip(*results):
        assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("model,dims", [
    ("gat", dict(in_dim=F, out_dim=4, heads=2)),
    ("transformer", dict(in_dim=F, out_dim=4, heads=2))])
def test_other_attention_programs_make_no_cosine_step_and_log_nothing_of_it(model, dims):
    cp = Program(getattr(models, model), **dims).compile_exact(_graph("cpu"))
    assert not any("cosine" in str(d) for rec in cp.log for d in rec.decisions)
    steps = cp.forward_plan.steps + cp.backward_plan.steps
    assert not any(s.template == "cosine" for s in steps)
