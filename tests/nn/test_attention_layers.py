"""GATConv, AGNNConv and TransformerConv against their PyG namesakes, parameters copied with
``from_pyg``: outputs and the gradients of the input and of every parameter.

On a CPU, small random graphs run the Triton kernels under the interpreter (both strategies)
and the real graphs run the torch backend (the interpreter is too slow for them); on CUDA every
case runs the Triton kernels, both strategies, in fp32 and bf16 (scripts/gpu-check runs this
file on the H200).
"""
import copy
import sys
from pathlib import Path

import pytest
import torch

pyg = pytest.importorskip("torch_geometric.nn")
import hector  # noqa: E402
from hector import datasets  # noqa: E402
from hector.graph import Graph, with_self_loops  # noqa: E402
from hector.nn import AGNNConv, GATConv, TransformerConv  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import SHARED_DATA as DATA  # noqa: E402
#: float64: agreement to rounding, far below any step computed in fp32 (~1e-7).
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float64: 1e-10}
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]
CPU_FEATURES = 64


def make_layers(kind, f_in, heads, concat, **layer_kw):
    torch.manual_seed(0)
    if kind == "gat":
        ref = pyg.GATConv(f_in, 16, heads=heads, concat=concat, **layer_kw)
    elif kind == "agnn":
        ref = pyg.AGNNConv()
        with torch.no_grad():
            ref.beta.fill_(1.7)       # not the initial 1, so a lost beta is seen
    else:
        kw = dict(dict(beta=True), **layer_kw)
        ref = pyg.TransformerConv(f_in, 16, heads=heads, concat=concat, **kw)
    # Non-trivial parameters: PyG zero-initialises biases.
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() == 1 and p.numel() > 1:
                p.normal_(0, 0.1)
    return ref.to(DEVICE)


def rel_err(a, b, floor=1e-30):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(floor))


def compare(kind, edge_index, x, heads=2, concat=True, strategy="auto", backend="auto",
            dtype=torch.float32, reorder=None, **layer_kw):
    """Ours in ``dtype`` against PyG in float64 on the same (``dtype``-rounded) inputs and
    parameters: the error measured is ours, not the sum of two low-precision runs.
    ``reorder``: TransformerConv's linear reordering, asserted to be applied (True, one head;
    several heads: asked for and declined) or not (False) on this graph; None: as the layer
    decides."""
    ref = make_layers(kind, x.shape[1], heads, concat, **layer_kw).to(dtype)
    kw = {} if reorder is None else dict(reorder=reorder)
    ours = type_of(kind).from_pyg(ref, strategy=strategy, backend=backend, **kw)
    if reorder is not None:
        decision = ours.reordering(Graph(edge_index, num_nodes=x.shape[0]))
        assert decision.applied == (reorder and heads == 1), decision
    ref = copy.deepcopy(ref).double()
    x = x.to(DEVICE, dtype)
    edge_index = edge_index.to(DEVICE)
    x_ref, x_ours = x.double().requires_grad_(), x.clone().requires_grad_()
    out_ref, out = ref(x_ref, edge_index), ours(x_ours, edge_index)
    assert out.shape == out_ref.shape and out.dtype == dtype
    assert not torch.isnan(out).any()
    tol = TOL[dtype]
    assert rel_err(out, out_ref) < tol, f"output: {rel_err(out, out_ref)}"
    with torch.no_grad():     # inference takes other paths (GAT: scores in the GEMM's epilogue)
        out_inf = ours(x, edge_index)
    assert rel_err(out_inf, out_ref) < tol, f"inference output: {rel_err(out_inf, out_ref)}"
    grad_out = torch.randn_like(out)
    params_ref, params = dict(ref.named_parameters()), dict(ours.named_parameters())
    # (PyG keeps lin_skip with root_weight=False, unused; ours has none: compare ours.)
    unused = {n for n in params_ref if n.startswith("lin_skip.")} if (
        kind == "transformer" and not ref.root_weight) else set()
    assert params_ref.keys() - unused == params.keys()
    names = list(params)
    g_ref = torch.autograd.grad(out_ref, [x_ref] + [params_ref[n] for n in names],
                                grad_out.double())
    g = torch.autograd.grad(out, [x_ours] + [params[n] for n in names], grad_out)
    # Some gradients are zero in exact arithmetic (a bias on the keys shifts every score of
    # a row equally, which softmax ignores) and hold only rounding noise: measure every error
    # against at least a hundredth of the largest gradient of the call.
    floor = 1e-2 * max(float(b.norm()) for b in g_ref)
    for name, a, b in zip(["x"] + names, g, g_ref):
        err = rel_err(a, b, floor)
        assert err < tol * 5, f"grad of {name}: {err}"


def type_of(kind):
    return {"gat": GATConv, "agnn": AGNNConv, "transformer": TransformerConv}[kind]


def random_graph(n, e, seed, hub=0):
    """Random edges plus isolated nodes (the last ten), duplicates and a hub of degree ``hub``."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n - 10, (e,), generator=g)
    dst = torch.randint(0, n - 10, (e,), generator=g)
    src = torch.cat([src, src[:5], torch.randint(0, n - 10, (hub,), generator=g)])
    dst = torch.cat([dst, dst[:5], torch.zeros(hub, dtype=torch.long)])
    return torch.stack([src, dst])


@pytest.mark.parametrize("kind", ["gat", "agnn", "transformer"])
def test_float64_matches_pyg_to_rounding(kind):
    """float64 asked, float64 computed (the torch backend: Triton takes no float64)."""
    ei = random_graph(40, 150, seed=1, hub=80)
    x = torch.randn(40, 12, generator=torch.Generator().manual_seed(2))
    compare(kind, ei, x, heads=3, backend="torch", dtype=torch.float64)


@pytest.mark.parametrize("kind", ["gat", "agnn", "transformer"])
@pytest.mark.parametrize("strategy", ["node", "edge"])
def test_small_random_graphs(kind, strategy):
    ei = random_graph(40, 150, seed=1, hub=80)
    x = torch.randn(40, 12, generator=torch.Generator().manual_seed(2))
    for dtype in DTYPES:
        compare(kind, ei, x, heads=3, strategy=strategy, backend="triton", dtype=dtype)


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("concat, bias", [(True, True), (True, False), (False, True)])
def test_gat_residual_matches_pyg(strategy, concat, bias):
    """GAT with a residual: heads concatenated on a whole graph, ``x W_res^T + b`` is one
    product that the attention's store adds row by row (the epilogue's row-wise addend, rows
    without edges included); heads averaged, added after.  Output and every gradient."""
    ei = random_graph(40, 150, seed=4, hub=80)
    x = torch.randn(40, 12, generator=torch.Generator().manual_seed(5))
    for dtype in DTYPES:
        compare("gat", ei, x, heads=3, concat=concat, strategy=strategy, backend="triton",
                dtype=dtype, residual=True, bias=bias)


@pytest.mark.parametrize("concat, bias", [(True, True), (True, False), (False, True)])
def test_gat_residual_float64_matches_pyg_to_rounding(concat, bias):
    """The residual folded into the attention's store (heads concatenated) on the torch
    backend in float64: output and every gradient to rounding."""
    ei = random_graph(40, 150, seed=4, hub=80)
    x = torch.randn(40, 12, generator=torch.Generator().manual_seed(5))
    compare("gat", ei, x, heads=3, concat=concat, backend="torch", dtype=torch.float64,
            residual=True, bias=bias)


@pytest.mark.parametrize("heads, concat", [(1, True), (3, True), (3, False)])
def test_gat_scores_in_the_projection_epilogue(heads, concat):
    """GATConv is its compiled program: the projection and both scores are one segment GEMM
    (the scores its epilogue's extra product), and the output is PyG's."""
    from hector.compiler.lower import extra_cols
    ei = random_graph(40, 150, seed=7, hub=30)
    x = torch.randn(40, 12, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    ref = make_layers("gat", 12, heads, concat)
    ours = GATConv.from_pyg(ref, backend="triton").eval()
    want = ref.double()(x.double(), ei.to(DEVICE))
    with torch.no_grad():
        got = ours(x, ei.to(DEVICE))
    assert rel_err(got, want) < TOL[torch.float32]
    graph = with_self_loops(Graph(ei.to(DEVICE), num_nodes=40))
    plan = ours.program.compiled_for(graph, backward=False).forward_plan
    assert [extra_cols(s) for s in plan.steps if s.template == "gemm"] == [2 * heads]


@pytest.mark.parametrize("kind", ["gat", "transformer"])
def test_mean_over_heads(kind):
    ei = random_graph(30, 90, seed=3)
    compare(kind, ei, torch.randn(30, 8), heads=2, concat=False, backend="triton")


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("beta, bias, root_weight, concat", [
    (False, True, True, True),
    (False, False, True, True),
    (True, False, True, True),
    (False, True, True, False),
    (False, True, False, True),     # no skip term (PyG keeps an unused lin_skip)
])
def test_transformer_skip_variants(strategy, beta, bias, root_weight, concat):
    """Every skip-term variant (with and without the beta gate, biases, root weight; heads
    concatenated or averaged) agrees with PyG in the output and every gradient (the other
    tests use ``beta=True`` only)."""
    kw = dict(beta=beta, bias=bias, root_weight=root_weight)
    ei = random_graph(40, 150, seed=4, hub=80)
    x = torch.randn(40, 12, generator=torch.Generator().manual_seed(5))
    for dtype in DTYPES:
        compare("transformer", ei, x, heads=3, concat=concat, strategy=strategy,
                backend="triton", dtype=dtype, **kw)


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("heads, concat, beta, bias, root_weight, isolated", [
    (1, True, False, True, True, True),      # b_v times the graph's has-edges mask
    (1, True, False, True, True, False),     # b_v added to every row
    (1, True, True, True, True, True),       # the gate reads the message with b_v
    (1, True, False, True, False, True),     # no skip: b_v after the product
    (1, True, False, True, False, False),
    (1, True, False, False, True, True),
    (3, True, False, True, True, True),      # several heads: declined, as written
])
def test_transformer_reordered_matches_pyg(strategy, heads, concat, beta, bias, root_weight,
                                           isolated):
    """Keys and values moved across the attention (``reorder=True``): the output and every
    gradient agree with PyG, with and without nodes that have no incoming edge (their
    output must not get the value bias), in every skip variant; three heads: declined."""
    ei = random_graph(40, 150, seed=6, hub=30)
    if not isolated:        # an edge into each of the ten isolated nodes
        ei = torch.cat([ei, torch.stack([torch.arange(10), torch.arange(30, 40)])], 1)
    x = torch.randn(40, 20, generator=torch.Generator().manual_seed(7))   # F=20 <= 2C=32
    for dtype in DTYPES:
        compare("transformer", ei, x, heads=heads, concat=concat, strategy=strategy,
                backend="triton", dtype=dtype, reorder=True, beta=beta, bias=bias,
                root_weight=root_weight)


def test_transformer_declines_reordering_with_attention_dropout_in_training():
    ref = make_layers("transformer", 20, 1, True, dropout=0.5)
    ours = TransformerConv.from_pyg(ref, reorder=True)
    g = Graph(random_graph(40, 150, seed=6), num_nodes=40)
    decision = ours.reordering(g)
    assert not decision.applied and "dropout" in decision.reason
    assert ours.eval().reordering(g).applied        # no dropout in evaluation


def real_graph(name):
    if not (DATA / name).is_dir():
        pytest.skip(f"real dataset {name} not found at {DATA / name}")
    data = datasets.load(name, root=DATA / name)
    x = data.x if data.x is not None else torch.randn(data.num_nodes, 32)
    return data.edge_index, x


@pytest.mark.parametrize("name", ["cora", "amazon-computers", "github-musae"])
@pytest.mark.parametrize("kind", ["gat", "agnn", "transformer"])
def test_real_graphs(name, kind):
    ei, x = real_graph(name)
    if not CUDA:
        # The float64 PyG reference materialises several E x F tensors: with all 767 features of
        # amazon-computers that is 13 GB on a 24 GB CI machine. The graph's structure (degrees,
        # super nodes) is what this test is about, so on the CPU it takes 64 real feature columns.
        compare(kind, ei, x[:, :CPU_FEATURES], heads=2, backend="torch")
        return
    for strategy in ("node", "edge"):
        for dtype in DTYPES:
            compare(kind, ei, x, heads=2, strategy=strategy, backend="triton", dtype=dtype)


def test_layers_accept_a_prebuilt_graph():
    from hector import Graph
    ei = random_graph(30, 80, seed=4)
    layer = GATConv(8, 4, heads=2, backend="torch").to(DEVICE)
    x = torch.randn(30, 8, device=DEVICE)
    assert torch.allclose(layer(x, Graph(ei.to(DEVICE), num_nodes=30)), layer(x, ei.to(DEVICE)))


def test_layer_errors_name_the_argument():
    from hector import Graph
    layer = GATConv(8, 4)
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match=r"x must have 3 rows"):
        layer(torch.randn(2, 8), Graph(ei))
    with pytest.raises(TypeError, match="x must be a floating tensor"):
        layer(torch.ones(3, 8, dtype=torch.long), ei)
    with pytest.raises(ValueError, match=r"edge_index\[1\] \(destination ids\) contains id 5"):
        layer(torch.randn(3, 8), torch.tensor([[0, 1], [1, 5]]))
    with pytest.raises(ValueError, match="strategy must be one of"):
        GATConv(8, 4, strategy="fast")
    with pytest.raises(NotImplementedError, match="edge_attr"):
        layer(torch.randn(3, 8), ei, edge_attr=torch.randn(2, 3))


@pytest.mark.parametrize("kind", ["gat", "agnn", "transformer"])
def test_cpu_training_keeps_no_edge_messages(kind):
    """On the CPU the torch backend keeps nothing near the size of the [E, H, D] per-edge
    messages for the backward (building those is what made it slower than PyG): per-edge
    scalars and per-node features only, both far smaller here."""
    n, e, f = 50, 3000, 16
    ei = random_graph(n, e, seed=5)
    layer = type_of(kind).from_pyg(make_layers(kind, f, 2, True).cpu(), backend="torch")
    x = torch.randn(n, f, requires_grad=True)
    sizes = []

    def keep(t):
        sizes.append(t.numel())
        return t

    # (inside retain_saved the compiled layers keep their saved values through autograd's
    # save_for_backward, which the hooks see)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), hector.retain_saved():
        out = layer(x, ei)
    out.sum().backward()
    heads, width = (1, f) if kind == "agnn" else (2, 16)     # AGNN: one head over x itself
    messages = (e + 5) * heads * width                       # edges and duplicates, no loops
    assert sizes and max(sizes) < messages / 5, (messages, sorted(sizes)[-3:])
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_settings_changed_after_construction_are_compiled(backend):
    """GATConv's negative slope and dropout set after construction (as on PyG's layer) are
    the ones a call computes with: the layer compiles its program for its settings now."""
    ei = random_graph(30, 90, seed=3)
    x = torch.randn(30, 8, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    ref = make_layers("gat", 8, 2, True).to(DEVICE).eval()
    ours = GATConv.from_pyg(ref, backend=backend).eval()
    ref.negative_slope = ours.negative_slope = 0.5
    assert rel_err(ours(x, ei.to(DEVICE)), ref(x, ei.to(DEVICE))) < TOL[torch.float32]
    ours.train()
    plain = ours(x, ei.to(DEVICE))
    ours.dropout = 0.5
    dropped = ours(x, ei.to(DEVICE))
    assert rel_err(plain, ref(x, ei.to(DEVICE))) < TOL[torch.float32]
    assert rel_err(dropped, plain) > 0.01          # (half the attention weights dropped)
