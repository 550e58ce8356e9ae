"""Every hector layer under ``torch.compile``: with a prebuilt ``hector.Graph`` the whole forward
traces as one graph (``fullgraph=True``, so any graph break fails the test), and the compiled
output and gradients equal eager ones.  With a raw ``edge_index`` (the Graph is built, or found
in the cache, outside the traced region) it compiles with breaks and still matches.

Both backends: on the CPU the Triton kernels run under the interpreter, behind the opaque
``hector::`` custom ops that torch.compile sees as single nodes.  The fullgraph tests run one
eager call first (plans, index memos); a first call under torch.compile plans outside the
traced region (one graph break) and is tested without ``fullgraph``."""
import sys
from pathlib import Path

import pytest
import torch

import hector.nn
from hector.compiler.ir import Op
from hector.graph import Graph, with_self_loops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import random_hetero, random_relational  # noqa: E402

# hgt_wide: K and V 16 wide, so the siblings pass runs them as one GEMM read through column
# views and the attention backward writes their gradients into one buffer (at 8 wide they
# stay apart: a narrow output has its own kernel).  rgat_1h: one head, so the source score
# is the message GEMM's extra product (hector::segment_mm_extra).  transformer_1h: one head,
# keys and values moved across the attention (``reorder=True``; the graph has nodes without
# incoming edges, so b_v is added through the per-graph has-edges mask); transformer_2h: the
# same asked of two heads, which the compiler declines (the layer as written).
LAYERS = ("gat", "agnn", "transformer", "transformer_1h", "transformer_2h", "rgcn",
          "rgcn_dense", "rgat", "rgat_1h", "hgt", "hgt_wide")


def make_case(name, prebuilt=True, backend="torch"):
    """(layer, call arguments) of one layer on a tiny random graph, on the device the backend
    runs on (CUDA for Triton where there is a GPU)."""
    dev = torch.device("cuda" if backend == "triton" and torch.cuda.is_available() else "cpu")
    layer, args = _make_case(name, prebuilt, backend)
    move = lambda a: (a.to(dev) if isinstance(a, (torch.Tensor, Graph)) else  # noqa: E731
                      {k: move(v) for k, v in a.items()} if isinstance(a, dict) else a)
    return layer.to(dev), tuple(move(a) for a in args)


def _make_case(name, prebuilt, backend):
    torch.manual_seed(0)
    ei, et = random_relational()
    x = torch.randn(24, 16)
    if name in ("hgt", "hgt_wide"):
        width = 16 if name == "hgt_wide" else 8
        counts, eid, meta = random_hetero()
        layer = hector.nn.HGTConv(width, width, meta, heads=2, backend=backend)
        xs = {t: torch.randn(n, width) for t, n in counts.items()}
        return layer, (xs, layer.graph_of(xs, eid) if prebuilt else eid)
    if name == "rgcn_dense":
        # Many (destination, relation) rows per node: the relation GEMM sums its rows into
        # the nodes (scatter epilogue) and the root GEMM adds them (addend epilogue).
        gen = torch.Generator().manual_seed(3)
        ei = torch.stack([torch.randint(0, 24, (200,), generator=gen),
                          torch.randint(0, 8, (200,), generator=gen)])
        et = torch.randint(0, 8, (200,), generator=gen)
        layer = hector.nn.RGCNConv(16, 8, 8, backend=backend)
        graph = Graph(ei, et, num_nodes=24, num_relations=8)
        return layer, ((x, graph) if prebuilt else (x, ei, et))
    if name in ("rgcn", "rgat", "rgat_1h"):
        kw = dict(heads=2) if name == "rgat" else {}
        cls = hector.nn.RGCNConv if name == "rgcn" else hector.nn.RGATConv
        layer = cls(16, 16 if name == "rgat_1h" else 8, 4, backend=backend, **kw)
        graph = Graph(ei, et, num_nodes=24, num_relations=4)
        return layer, ((x, graph) if prebuilt else (x, ei, et))
    if name == "gat":
        # Self loops are added when the Graph is resolved; a prebuilt one carries them.
        layer = hector.nn.GATConv(16, 8, heads=2, backend=backend, add_self_loops=not prebuilt)
    elif name == "agnn":
        layer = hector.nn.AGNNConv(backend=backend, add_self_loops=not prebuilt)
    elif name == "transformer_1h":
        layer = hector.nn.TransformerConv(16, 12, backend=backend, reorder=True)
    elif name == "transformer_2h":
        layer = hector.nn.TransformerConv(16, 8, heads=2, backend=backend, reorder=True)
    else:
        layer = hector.nn.TransformerConv(16, 8, heads=2, backend=backend)
    graph = with_self_loops(Graph(ei, num_nodes=24)) if name in ("gat", "agnn") else \
        Graph(ei, num_nodes=24)
    return layer, (x, graph if prebuilt else ei)


def _features(args):
    return args[0] if isinstance(args[0], dict) else {"x": args[0]}


def run(layer, args, compiled=None):
    """Output (flattened) of ``compiled`` (default: ``layer`` itself) and the gradients of a
    fixed loss w.r.t. the features and ``layer``'s parameters."""
    feats = {k: v.detach().clone().requires_grad_() for k, v in _features(args).items()}
    call_args = (feats if isinstance(args[0], dict) else feats["x"],) + tuple(args[1:])
    out = (layer if compiled is None else compiled)(*call_args)
    flat = torch.cat([o.flatten() for o in out.values()]) if isinstance(out, dict) \
        else out.flatten()
    weights = torch.linspace(-1, 1, flat.numel(), device=flat.device)       # not symmetric: every entry matters
    layer.zero_grad(set_to_none=True)
    (flat * weights).sum().backward()
    grads = {f"feature {k}": v.grad for k, v in feats.items()}
    grads.update({n: p.grad for n, p in layer.named_parameters() if p.grad is not None})
    return flat.detach(), grads


def assert_same(got, want):
    (out, grads), (ref, ref_grads) = got, want
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    assert ref_grads, "the loss reached no parameter"
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-5, atol=1e-6,
                                   msg=lambda m, n=name: f"gradient of {n}: {m}")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", LAYERS)
def test_fullgraph_compile_with_prebuilt_graph_matches_eager(name, backend):
    layer, args = make_case(name, backend=backend)
    want = run(layer, args)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    assert_same(run(layer, args, compiled), want)
    assert_same(run(layer, args, compiled), want)          # the cached graph, second call


@pytest.mark.parametrize("name", ["gat", "transformer_1h", "transformer_2h"])
def test_inference_compiles_whole_and_matches_eager(name):
    """Without autograd the layers take other paths (GAT: its scores are the projection
    GEMM's epilogue, ``hector::segment_mm_extra``; the reordered Transformer adds its
    addend and masked bias in place): traced whole, and equal to eager inference."""
    layer, args = make_case(name, backend="triton")
    with torch.no_grad():
        want = layer(*args)
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(*args), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(compiled(*args), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["gat", "rgat", "hgt", "hgt_wide"])
def test_inductor_compile_matches_eager(name):
    layer, args = make_case(name)
    want = run(layer, args)
    assert_same(run(layer, args, torch.compile(layer, fullgraph=True)), want)


@pytest.mark.parametrize("name", LAYERS)
def test_compile_with_raw_edge_index_matches_eager(name):
    layer, args = make_case(name, prebuilt=False)
    want = run(layer, args)
    assert_same(run(layer, args, torch.compile(layer, backend="aot_eager")), want)


@pytest.mark.parametrize("name", ["rgcn", "rgat", "hgt"])
def test_first_call_under_compile_plans_and_matches_eager(name):
    layer, args = make_case(name)
    got = run(layer, args, torch.compile(layer, backend="aot_eager"))    # cold: plans here
    assert_same(got, run(layer, args))


def test_dense_rgcn_case_runs_the_addend_epilogue():
    """``rgcn_dense`` (above) exercises the GEMM epilogues the other cases do not: the
    addend, the CSR prologue (forward and weight gradient) and the CSR scatter epilogue."""
    layer, (x, graph) = make_case("rgcn_dense")
    layer(x.requires_grad_(), graph).sum().backward()
    entry = layer.program.compiled_for(graph)
    steps = entry.forward_plan.steps
    assert any(s.template == "gemm" and s.spec[0].has_addend for s in steps)
    assert any(s.template == "gemm" and s.spec[0].has_csr for s in steps)
    back = entry.backward_plan.steps
    assert any(s.template == "gemm" and s.spec is not None and s.spec[0].has_csr_out
               for s in back)
    assert any(s.body.op == Op.WGRAD and s.body.args[0].op == Op.SCATTER for s in back)


def test_one_head_rgat_case_runs_the_extra_product():
    """``rgat_1h`` exercises the GEMM's extra product (RGAT's source score from the message
    GEMM's epilogue), which the two-head case's fused sibling GEMM does not."""
    layer, (x, graph) = make_case("rgat_1h")
    layer(x, graph)
    steps = layer.program.compiled_for(graph).forward_plan.steps
    assert [s.spec[0].extra_cols for s in steps
            if s.template == "gemm" and s.spec is not None and s.spec[0].extra_cols] == [1]



def test_hgt_training_steps_under_compile_do_not_recompile():
    """scripts/capture_after_use.py's case: eager steps, then compiled training steps.  After
    the first compiled step nothing recompiles (the graph's handles stay what they were), and
    every step equals eager."""
    layer, args = make_case("hgt", backend="triton")
    want = run(layer, args)
    compiled = torch.compile(layer, backend="aot_eager")
    assert_same(run(layer, args, compiled), want)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):
            assert_same(run(layer, args, compiled), want)


def test_compiled_layer_on_new_graphs_passes_constant_handles():
    """A compiled layer called on graphs it has not seen (equal edges, other objects, so other
    handles, first made inside the traced region) recompiles per graph with each handle a
    constant: a second value at one place once made the handle a symbolic int, which the
    ops' fake implementations cannot look a graph up by."""
    layer, args = make_case("gat", backend="triton")
    want = run(layer, args)
    compiled = torch.compile(layer, backend="aot_eager")
    for case in (args, make_case("gat", backend="triton")[1], args,
                 make_case("gat", backend="triton")[1]):
        assert_same(run(layer, case, compiled), want)


@pytest.mark.parametrize("name", ["rgcn", "rgat"])
def test_a_program_compiled_cold_plans_once(name, monkeypatch):
    """A compiled layer whose first call is the compiled one plans outside the trace then,
    and never again: the frame traced on that miss is traced again on the next call (the
    program's plan token changed) and whole after it.  Before, the traced miss kept its
    planning call, which also ran the plans eagerly on copies, on every call."""
    from hector.compiler import program as P
    plans = []
    inner = P._plan_outside_tracing

    @torch.compiler.disable
    def counting(*args, **kwargs):
        plans.append(1)
        return inner(*args, **kwargs)
    monkeypatch.setattr(P, "_plan_outside_tracing", counting)
    layer, args = make_case(name)
    compiled = torch.compile(layer, backend="aot_eager")
    got = [run(layer, args, compiled) for _ in range(2)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        got += [run(layer, args, compiled) for _ in range(2)]
    assert len(plans) == 1
    want = run(layer, args)
    for g in got:
        assert_same(g, want)


def test_eager_calls_between_compiled_calls_do_not_recompile():
    """Eager calls of a layer between its compiled calls (a warm-up, a manual capture, an
    evaluation) keep the attention launch handles the compiled frame guards on."""
    layer, args = make_case("rgat", backend="triton")
    want = run(layer, args)
    compiled = torch.compile(layer, backend="aot_eager")
    assert_same(run(layer, args, compiled), want)
    assert_same(run(layer, args), want)
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert_same(run(layer, args, compiled), want)
        assert_same(run(layer, args), want)
        assert_same(run(layer, args, compiled), want)
