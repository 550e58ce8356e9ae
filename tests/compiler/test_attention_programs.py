"""The attention layers as DSL programs (``hector.compiler.models.gat``, ``agnn``,
``transformer``) compiled by the pipeline, against PyG's ``GATConv``, ``AGNNConv`` and
``TransformerConv`` with the same parameters: output and the gradients of x and of every
parameter, on both backends, several heads, heads concatenated and averaged, the
transformer's gate and root options; attention dropout against hector.nn's layers (the same
mask at the same torch seed). And what the pipeline makes of them: every score term on node
rows, score + softmax + aggregation as one attention operator, the bias in its epilogue, its
backward as one operator."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import models
from hector.compiler.ir import NODE, Op
from hector.graph import with_self_loops
from hector.nn import GATConv, TransformerConv

pyg = pytest.importorskip("torch_geometric.nn")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, rel_err  # noqa: E402


def _pair(heads, concat, backend="auto", residual=False, F=6, C=4, seed=0):
    torch.manual_seed(seed)
    ref = pyg.GATConv(F, C, heads=heads, concat=concat, residual=residual)
    with torch.no_grad():
        ref.bias.normal_()
    ours = hector.compile(models.gat, in_dim=F, out_dim=C, heads=heads, concat=concat,
                          residual=residual, backend=backend)
    with torch.no_grad():
        ours.lin.copy_(ref.lin.weight)      # (stored as PyG's nn.Linear weight)
        ours.att_src.copy_(ref.att_src.view(heads, C, 1))
        ours.att_dst.copy_(ref.att_dst.view(heads, C, 1))
        ours.bias.copy_(ref.bias)
        if residual:
            ours.res.copy_(ref.res.weight)
    return ref, ours


def _edges(num_nodes=30, num_edges=120, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_nodes, (2, num_edges), generator=g)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("heads,concat,residual", [(1, True, False), (3, True, False),
                                                   (2, False, False), (2, True, True),
                                                   (2, False, True)])
def test_the_compiled_program_is_pyg_gatconv(heads, concat, residual, backend):
    dev = device_for(backend)
    ref, ours = _pair(heads, concat, backend, residual)
    ref, ours = ref.to(dev), ours.to(dev)
    ei = _edges().to(dev)
    graph = with_self_loops(hector.Graph(ei, num_nodes=30))     # PyG adds them itself
    x = torch.randn(30, 6, generator=torch.Generator().manual_seed(2)).to(dev)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = ref(xa, ei), ours(graph, x=xb)
    assert a.shape == b.shape
    assert rel_err(b.detach(), a.detach()) < 1e-5
    w = torch.randn(a.shape, generator=torch.Generator().manual_seed(3)).to(dev)
    res = ([ref.res.weight], [ours.res]) if residual else ([], [])
    ga = torch.autograd.grad((a * w).sum(), [xa, ref.lin.weight, ref.att_src, ref.att_dst,
                                             ref.bias] + res[0])
    gb = torch.autograd.grad((b * w).sum(), [xb, ours.lin, ours.att_src, ours.att_dst,
                                             ours.bias] + res[1])
    wants = [ga[0], ga[1], ga[2].view_as(gb[2]), ga[3].view_as(gb[3]), ga[4]]
    wants += [ga[5]] if residual else []
    for name, got, want in zip(["x", "lin", "att_src", "att_dst", "bias", "res"], gb, wants):
        assert rel_err(got, want) < 1e-5, name


def test_the_pipeline_fuses_it_into_one_attention_on_node_rows():
    graph = with_self_loops(hector.Graph(_edges(), num_nodes=30))
    m = hector.compile(models.gat, in_dim=6, out_dim=4, heads=2)
    cp = m.program.compile_exact(graph)
    fwd = cp.forward_plan.steps
    att = [s for s in fwd if s.template == "attention"]
    assert len(att) == 1 and att[0].spec[1].source == NODE and att[0].spec[1].graph == "graph"
    assert "bias" in att[0].body.attr("roles")           # the bias in the epilogue
    assert {s.spec[1].rows for s in fwd if s.template == "gemm"} == {NODE}
    bwd = [s for s in cp.backward_plan.steps if s.template == "attention"]
    assert len(bwd) == 1 and bwd[0].body.op == Op.ATTENTION_BWD
    # z's gradient, the value gradient plus the scores' gradients times the attention
    # vectors, is one GEMM adding the value gradient as it stores (the addend epilogue): no
    # node-row pass adds the two
    added = [s for s in cp.backward_plan.steps
             if s.template == "gemm" and s.spec is not None and s.spec[0].has_addend]
    assert len(added) == 1 and "addend epilogue" in added[0].note
    assert not [s for s in cp.backward_plan.steps
                if s.template == "traversal" and s.body.op == Op.ADD]


def _one_vector(m, in_dim, out_dim, heads):
    """GAT with one attention vector read as both score terms (its kernels take that one
    value once, for two of the attention's arguments)."""
    x = m.node_input("x", in_dim)
    z = m.linear(x, m.weight("lin", (in_dim, heads * out_dim), stored="transposed"),
                 heads=heads)
    a = m.linear(z, m.weight("att", (heads, out_dim, 1)))
    alpha = m.edge_softmax(m.leaky_relu(m.src(a) + m.dst(a), 0.2))
    return m.heads(m.aggregate(alpha * m.src(z), "sum"), 1)


@pytest.mark.parametrize("backend,dtype", [("torch", torch.float64), ("triton", torch.float32)])
@pytest.mark.parametrize("heads", [1, 2])
def test_one_value_as_both_score_terms_is_gat_with_equal_vectors(backend, dtype, heads):
    dev = device_for(backend)
    graph = with_self_loops(hector.Graph(_edges().to(dev), num_nodes=30))
    torch.manual_seed(0)
    one = hector.compile(_one_vector, in_dim=6, out_dim=4, heads=heads,
                         backend=backend).to(dev, dtype)
    two = hector.compile(models.gat, in_dim=6, out_dim=4, heads=heads, bias=False,
                         backend=backend).to(dev, dtype)
    with torch.no_grad():
        two.lin.copy_(one.lin)
        two.att_src.copy_(one.att)
        two.att_dst.copy_(one.att)
    x = torch.randn(30, 6, device=dev, dtype=dtype)
    outs, grads = [], []
    for m in (one, two):
        xg = x.clone().requires_grad_()
        out = m(graph, x=xg)
        (out * torch.linspace(-1, 1, out.numel(), device=dev, dtype=dtype).view_as(out)).sum() \
            .backward()
        outs.append(out.detach())
        grads.append((xg.grad, m.lin.grad))
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert rel_err(outs[0], outs[1]) < tol
    for g1, g2 in zip(grads[0], grads[1]):
        assert rel_err(g1, g2) < tol
    assert rel_err(one.att.grad, two.att_src.grad + two.att_dst.grad) < tol


def _twins(backend, dropout=0.5, heads=2, F=6, C=4, **kw):
    """hector.nn.GATConv with attention dropout and the DSL program with the same parameters."""
    torch.manual_seed(0)
    layer = GATConv(F, C, heads=heads, dropout=dropout, backend="torch")
    prog = hector.compile(models.gat, in_dim=F, out_dim=C, heads=heads, dropout=dropout,
                          backend=backend, **kw)
    with torch.no_grad():
        layer.bias.normal_()
        prog.lin.copy_(layer.lin.weight)
        prog.att_src.copy_(layer.att_src.view(heads, C, 1))
        prog.att_dst.copy_(layer.att_dst.view(heads, C, 1))
        prog.bias.copy_(layer.bias)
    return layer, prog


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("autodiff", ["ir", "torch"])
def test_attention_dropout_drops_what_the_layer_drops(backend, autodiff):
    """In training calls the program's attention weights are dropped by the same mask as
    GATConv's (a hash of the seed each call draws from torch's generator: same torch seed,
    same mask): output and every gradient equal; the mask changes between calls; in eval
    calls nothing is dropped."""
    dev = device_for(backend)
    layer, prog = _twins(backend, autodiff=autodiff)
    layer, prog = layer.to(dev), prog.to(dev)
    graph = with_self_loops(hector.Graph(_edges().to(dev), num_nodes=30))
    x = torch.randn(30, 6, generator=torch.Generator().manual_seed(2)).to(dev)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.manual_seed(11)
    a = layer(xa, graph)
    torch.manual_seed(11)
    b = prog(graph, x=xb)
    assert rel_err(b.detach(), a.detach()) < 1e-5
    w = torch.randn(a.shape, generator=torch.Generator().manual_seed(3)).to(dev)
    ga = torch.autograd.grad((a * w).sum(), [xa, layer.lin.weight, layer.att_src,
                                             layer.att_dst, layer.bias])
    gb = torch.autograd.grad((b * w).sum(), [xb, prog.lin, prog.att_src, prog.att_dst,
                                             prog.bias])
    wants = [ga[0], ga[1], ga[2].view_as(gb[2]), ga[3].view_as(gb[3]), ga[4]]
    for name, got, want in zip(["x", "lin", "att_src", "att_dst", "bias"], gb, wants):
        assert rel_err(got, want) < 1e-5, name
    with torch.no_grad():
        torch.manual_seed(12)
        assert not torch.allclose(prog(graph, x=x), b)          # another call, another mask
        prog.eval()
        layer.eval()
        assert rel_err(prog(graph, x=x), layer(x, graph)) < 1e-5
        assert not torch.allclose(prog(graph, x=x), b)


def test_only_a_fused_attention_drops():
    """A dropout that stays its own operator (fusion off) is refused by name, not run
    undropped; eval calls of the same program need no fusion of it and run."""
    _, prog = _twins("torch", fuse=False)
    graph = with_self_loops(hector.Graph(_edges(), num_nodes=30))
    x = torch.randn(30, 6)
    with pytest.raises(NotImplementedError, match="dropout"):
        prog(graph, x=x)
    prog.eval()
    assert prog(graph, x=x).shape == (30, 8)
    assert prog.program.training_program is not None
    assert hector.compile(models.gat, in_dim=6, out_dim=4).program.training_program is None


def _transformer_pair(heads, concat, beta, bias=True, root_weight=True, backend="auto",
                      dropout=0.0, F=6, C=4):
    """PyG's TransformerConv (randomised parameters) and the program holding them."""
    torch.manual_seed(0)
    ref = pyg.TransformerConv(F, C, heads=heads, concat=concat, beta=beta, bias=bias,
                              root_weight=root_weight, dropout=dropout)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(std=0.5)
    ours = hector.compile(models.transformer, in_dim=F, out_dim=C, heads=heads, concat=concat,
                          beta=beta, bias=bias, root_weight=root_weight, dropout=dropout,
                          backend=backend)
    with torch.no_grad():
        for name, t in _transformer_views(ref, heads, C).items():
            getattr(ours, name).copy_(t)
    return ref, ours


def _transformer_views(ref, heads, C):
    """The program's weights as views of PyG's parameters (what a layer shell would pass)."""
    out = {n: getattr(ref, "lin_" + n).weight for n in ("query", "key", "value")}
    if ref.lin_query.bias is not None:
        out.update({n + "_bias": getattr(ref, "lin_" + n).bias
                    for n in ("query", "key", "value")})
    if ref.root_weight:
        out["skip"] = ref.lin_skip.weight
        if ref.lin_skip.bias is not None:
            out["skip_bias"] = ref.lin_skip.bias
        if ref.lin_beta is not None:
            w = ref.lin_beta.weight
            third = w.shape[1] // 3
            out.update(beta_out=w[:, :third], beta_root=w[:, third:2 * third],
                       beta_diff=w[:, 2 * third:])
    return out


TRANSFORMER_CASES = [dict(heads=1, concat=True, beta=False), dict(heads=3, concat=True, beta=False),
                     dict(heads=2, concat=False, beta=False), dict(heads=2, concat=True, beta=True),
                     dict(heads=2, concat=False, beta=True),
                     dict(heads=2, concat=True, beta=False, root_weight=False),
                     dict(heads=1, concat=True, beta=False, bias=False)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", TRANSFORMER_CASES, ids=str)
def test_the_compiled_program_is_pyg_transformerconv(case, backend):
    dev = device_for(backend)
    ref, ours = _transformer_pair(backend=backend, **case)
    ref, ours = ref.to(dev), ours.to(dev)
    ei = _edges().to(dev)
    graph = hector.Graph(ei, num_nodes=30)                 # (no self loops: PyG adds none)
    x = torch.randn(30, 6, generator=torch.Generator().manual_seed(2)).to(dev)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = ref(xa, ei), ours(graph, x=xb)
    assert a.shape == b.shape and rel_err(b.detach(), a.detach()) < 1e-5
    w = torch.randn(a.shape, generator=torch.Generator().manual_seed(3)).to(dev)
    names = list(_transformer_views(ref, case["heads"], 4))
    # PyG's gradients through the same views (a view's gradient: autograd through it)
    views = _transformer_views(ref, case["heads"], 4)
    ga = torch.autograd.grad((a * w).sum(), [xa] + list(ref.parameters()), allow_unused=True)
    grads = {n: g for (n, _), g in zip(ref.named_parameters(), ga[1:]) if g is not None}
    gb = torch.autograd.grad((b * w).sum(), [xb] + [getattr(ours, n) for n in names])
    assert rel_err(gb[0], ga[0]) < 1e-5, "x"
    pyg_grads = _transformer_views(_Grads(grads), case["heads"], 4)
    # The key bias's gradient is zero in exact arithmetic (it shifts every score of a row
    # alike, which softmax ignores) and holds only rounding noise: errors are measured
    # against at least a hundredth of the largest gradient.
    floor = 1e-2 * max(float(g.abs().max()) for g in pyg_grads.values())
    for name, got in zip(names, gb[1:]):
        want = pyg_grads[name]
        assert got.shape == views[name].shape == want.shape
        err = float((got - want).abs().max()) / max(float(want.abs().max()), floor)
        assert err < 1e-4, (name, err)


class _Grads:
    """PyG's gradients laid out like the module (``lin_query.weight`` ...), so
    :func:`_transformer_views` takes them apart as it does the parameters."""

    def __init__(self, grads):
        self.root_weight = any(k.startswith("lin_skip") for k in grads)

        class Lin:
            pass
        for lin in ("query", "key", "value", "skip", "beta"):
            m = Lin()
            m.weight = grads.get(f"lin_{lin}.weight")
            m.bias = grads.get(f"lin_{lin}.bias")
            setattr(self, "lin_" + lin, m if m.weight is not None else None)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_transformer_dropout_drops_what_the_layer_drops(backend):
    """hector.nn.TransformerConv with attention dropout and the program at the same torch
    seed: the same output (the same mask) in training calls."""
    dev = device_for(backend)
    torch.manual_seed(0)
    layer = TransformerConv(6, 4, heads=2, dropout=0.5, backend="torch", reorder=False)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(std=0.5)
    ours = hector.compile(models.transformer, in_dim=6, out_dim=4, heads=2, dropout=0.5,
                          backend=backend)
    with torch.no_grad():
        for name, t in _transformer_views(layer, 2, 4).items():
            getattr(ours, name).copy_(t)
    layer, ours = layer.to(dev), ours.to(dev)
    graph = hector.Graph(_edges().to(dev), num_nodes=30)
    x = torch.randn(30, 6, generator=torch.Generator().manual_seed(2)).to(dev)
    torch.manual_seed(5)
    a = layer(x, graph)
    torch.manual_seed(5)
    b = ours(graph, x=x)
    assert rel_err(b.detach(), a.detach()) < 1e-5
    torch.manual_seed(6)
    assert not torch.allclose(ours(graph, x=x), b)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_compiled_program_is_pyg_agnnconv(backend):
    """AGNN (cosine attention, ``m.normalize``) against PyG's AGNNConv, a row of zeros
    among the features (the norm's eps branch): output, x's and beta's gradients; one fused
    attention (q and k on node rows, its keys formed from v = x and the cosine step's norm)
    with a fused backward."""
    dev = device_for(backend)
    ref = pyg.AGNNConv(requires_grad=True).to(dev)
    ours = hector.compile(models.agnn, in_dim=6, backend=backend).to(dev)
    with torch.no_grad():
        ref.beta.fill_(0.7)
        ours.beta.fill_(0.7)
    ei = _edges().to(dev)
    graph = with_self_loops(hector.Graph(ei, num_nodes=30))
    x = torch.randn(30, 6, generator=torch.Generator().manual_seed(2)).to(dev)
    x[4] = 0.0
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = ref(xa, ei), ours(graph, x=xb)
    assert rel_err(b.detach(), a.detach()) < 1e-5
    w = torch.randn(a.shape, generator=torch.Generator().manual_seed(3)).to(dev)
    ga = torch.autograd.grad((a * w).sum(), [xa, ref.beta])
    gb = torch.autograd.grad((b * w).sum(), [xb, ours.beta])
    for name, got, want in zip(["x", "beta"], gb, ga):
        assert rel_err(got, want) < 1e-5, name
    cp = ours.program.compile_exact(graph)
    att = [s for s in cp.forward_plan.steps if s.template == "attention"]
    assert len(att) == 1 and set(att[0].body.attr("roles")) == {"v", "q", "k", "k_norm"}
    assert any(s.template == "attention" and s.body.op == Op.ATTENTION_BWD
               for s in cp.backward_plan.steps)


def test_normalize_gradient_is_torchs():
    """``normalize_grad`` (the IR's adjoint of ``normalize``) equals torch autograd through
    F.normalize, zero and tiny rows included."""
    from hector.compiler import ir
    from hector.compiler.steps_torch import eval_op
    x = torch.randn(5, 2, 4, dtype=torch.float64)
    x[1] = 0.0
    x[2, 0] = 1e-14
    g = torch.randn_like(x)
    xr = x.clone().requires_grad_()
    want, = torch.autograd.grad(torch.nn.functional.normalize(xr, dim=-1), xr, g)
    v = ir.input_("x", 4, heads=2)
    got = eval_op(ir.normalize_grad(v, v), [g, x], None)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_the_strategy_option_picks_the_attention_schedule():
    """``hector.compile(..., strategy=)``: the fused attention's forward and backward run the
    schedule asked for (what ``hector.nn``'s ``strategy`` does), with the same output and
    gradients either way; an unknown strategy is refused by name."""
    from hector.compiler.steps_torch import GraphIndex
    from hector.compiler.steps_triton.attention import attention_launch
    graph = with_self_loops(hector.Graph(_edges(), num_nodes=30))
    x = torch.randn(30, 6, generator=torch.Generator().manual_seed(2))
    results = []
    for strategy in ("node", "edge"):
        torch.manual_seed(0)
        m = hector.compile(models.gat, in_dim=6, out_dim=4, heads=2, strategy=strategy,
                           backend="triton")
        cp = m.program.compiled_for(graph)
        for plan in (cp.forward_plan, cp.backward_plan):
            step = next(s for s in plan.steps if s.template == "attention")
            assert step.spec[1].strategy == strategy
            _, sched = attention_launch(step, GraphIndex.of(graph))
            assert {sched.dst.strategy, sched.src.strategy} == {strategy}
        xg = x.clone().requires_grad_()
        out = m(graph, x=xg)
        results.append((out.detach(), torch.autograd.grad(out.square().sum(), [xg, m.lin])))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="strategy"):
        hector.compile(models.gat, in_dim=6, out_dim=4, strategy="fast")
