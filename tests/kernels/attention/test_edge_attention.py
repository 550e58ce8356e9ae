"""``hector.kernels.attention.op.edge_attention``: the torch backend against a naive per-row
loop in float64, the Triton kernels (both schedules) against the torch backend, input
validation, and the semantics against PyG's GATConv / AGNNConv / TransformerConv."""
import itertools
import math
import os
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from hector import Graph
from hector.kernels.attention.reference import dropout_keep
from hector.kernels.attention.op import edge_attention
from hector.kernels.attention.spec import AttentionSpec, Schedule
from hector.kernels.sizes import next_pow2

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TRITON_OK = DEVICE.type == "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_triton = pytest.mark.skipif(
    not TRITON_OK, reason="no CUDA and TRITON_INTERPRET is not set (tests/ops/conftest.py sets "
                          "it unless TRITON_INTERPRET=0 was given)")
NAMES = ("v", "q", "k", "a_src", "a_dst")

# Term sets of the layers built on the op: (which tensors, kwargs).
TERMS = {
    "gat": (("v", "a_src", "a_dst"), dict(negative_slope=0.2)),
    "agnn": (("v", "q", "k"), dict(scale=1.7)),
    "transformer": (("v", "q", "k"), dict(scale=1 / math.sqrt(5))),
    "all": (("v", "q", "k", "a_src", "a_dst"), dict(scale=0.6, negative_slope=0.1)),
    "none": (("v",), {}),
}


def make_graph(num_nodes=24, num_random=120, super_degree=40, seed=0, device=DEVICE,
               hub_out_degree=0):
    """Random edges plus the awkward cases: a super node (degree > the test chunk, so the
    edge-parallel schedule splits it over several chunks), self loops, duplicate edges and
    three nodes without incoming edges; ``hub_out_degree`` more edges out of node 7."""
    gen = torch.Generator().manual_seed(seed)
    n_dst = num_nodes - 3                       # the last three nodes receive nothing
    src = torch.randint(0, num_nodes, (num_random,), generator=gen)
    dst = torch.randint(0, n_dst, (num_random,), generator=gen)
    sup_src = torch.randint(0, num_nodes, (super_degree,), generator=gen)
    loops = torch.arange(0, n_dst, 4)
    dup_s, dup_d = src[:10], dst[:10]
    hub_dst = torch.randint(0, n_dst, (hub_out_degree,), generator=gen)
    ei = torch.stack([torch.cat([src, sup_src, loops, dup_s, torch.full((hub_out_degree,), 7)]),
                      torch.cat([dst, torch.full((super_degree,), 5), loops, dup_d, hub_dst])])
    return Graph(ei, num_nodes=num_nodes).to(device)


def make_inputs(graph, heads, terms, dim_k=5, dim_v=6, dtype=torch.float32, seed=1,
                bias=False):
    """The term set's tensors (and with ``bias`` an output bias ``[H, Dv]``; with ``bias=
    "rows"`` a row-wise addend ``[N, H, Dv]``, the second half of each row of a wider
    buffer, as a skip term sliced from a joint projection), all requiring gradients."""
    gen = torch.Generator().manual_seed(seed)
    n = graph.num_nodes
    shapes = dict(v=(n, heads, dim_v), q=(n, heads, dim_k), k=(n, heads, dim_k),
                  a_src=(n, heads), a_dst=(n, heads), bias=(heads, dim_v))
    names = TERMS[terms][0] + (("bias",) if bias is True else ())
    inputs = {name: torch.randn(shapes[name], generator=gen).to(DEVICE, dtype).requires_grad_()
              for name in names}
    if bias == "rows":
        wide = torch.randn(n, 2 * heads * dim_v, generator=gen).to(DEVICE, dtype)
        inputs["bias"] = wide.requires_grad_()[:, heads * dim_v:].view(n, heads, dim_v)
    return inputs


def naive(graph, v, q=None, k=None, a_src=None, a_dst=None, scale=1.0, negative_slope=None,
          dropout=0.0, seed=None):
    """One destination at a time, straight from the formula."""
    src, dst = graph.src.long(), graph.dst.long()
    rows = []
    for node in range(graph.num_nodes):
        e = (dst == node).nonzero().flatten()
        if e.numel() == 0:
            rows.append(v[0] * 0.0)       # zero, but still part of the autograd graph
            continue
        u = src[e]
        s = torch.zeros(e.numel(), v.shape[1], dtype=v.dtype, device=v.device)
        if q is not None:
            s = s + scale * (q[node][None] * k[u]).sum(-1)
        if a_src is not None:
            s = s + a_src[u]
        if a_dst is not None:
            s = s + a_dst[node][None]
        if negative_slope is not None:
            s = torch.where(s > 0, s, negative_slope * s)
        alpha = torch.softmax(s, dim=0)
        if dropout > 0:
            alpha = alpha * dropout_keep(seed, e, v.shape[1], dropout) / (1 - dropout)
        rows.append((alpha[:, :, None] * v[u]).sum(0))
    return torch.stack(rows)


def outputs_and_grads(fn, inputs, seed=2):
    out = fn(**inputs)
    gout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)
    grads = torch.autograd.grad(out, list(inputs.values()), gout, allow_unused=True)
    return [out] + [torch.zeros_like(t) if g is None else g for t, g in zip(inputs.values(), grads)]


def assert_close(got, want, rel, what, floor=1e-6):
    """Max error relative to the largest reference entry (``floor`` when that is tiny: some
    gradients are exactly 0 in theory, e.g. d a_src when every edge enters one node)."""
    err = (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
    size = want.double().abs().max().item() if want.numel() else 0.0
    assert err <= rel * max(size, floor), f"{what}: max error {err:.3g} vs max |ref| {size:.3g}"


# --- (a) torch backend vs the naive loop, float64 -----------------------------------------

@pytest.mark.parametrize("terms", list(TERMS))
@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_torch_backend_matches_naive(terms, heads, dropout):
    g = make_graph()
    x = make_inputs(g, heads, terms, dtype=torch.float64)
    kw = dict(TERMS[terms][1])
    ref = outputs_and_grads(lambda **t: naive(g, **t, **kw, dropout=dropout, seed=7), x)
    got = outputs_and_grads(lambda **t: edge_attention(
        g, **t, **kw, dropout=dropout, training=True, seed=7, backend="torch"), x)
    for name, a, b in zip(("out",) + tuple(x), got, ref):
        assert_close(a, b, 1e-10, name)
    assert got[0][-3:].abs().max() == 0            # rows without incoming edges


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 8), e=st.integers(0, 30), heads=st.integers(1, 3),
       terms=st.sampled_from(["gat", "transformer", "all", "none"]), data=st.data())
def test_torch_backend_property(n, e, heads, terms, data):
    """Random small graphs (any mix of empty rows, loops, duplicates) in float64."""
    ids = st.lists(st.integers(0, n - 1), min_size=e, max_size=e)
    ei = torch.tensor([data.draw(ids), data.draw(ids)], dtype=torch.int64).reshape(2, -1)
    g = Graph(ei, num_nodes=n).to(DEVICE)
    x = make_inputs(g, heads, terms, dtype=torch.float64, seed=data.draw(st.integers(0, 99)))
    kw = dict(TERMS[terms][1])
    ref = outputs_and_grads(lambda **t: naive(g, **t, **kw), x)
    got = outputs_and_grads(lambda **t: edge_attention(g, **t, **kw, backend="torch"), x)
    for name, a, b in zip(("out",) + tuple(x), got, ref):
        assert_close(a, b, 1e-10, name, floor=1.0)


def test_dropout_mask_statistics():
    eid = torch.arange(20000)
    keep = dropout_keep(3, eid, 4, 0.3)
    assert abs(keep.float().mean().item() - 0.7) < 0.01
    assert (keep != dropout_keep(4, eid, 4, 0.3)).any()              # depends on the seed
    assert (keep[:, 0] != keep[:, 1]).any()                         # and on the head
    assert torch.equal(keep, dropout_keep(3, eid, 4, 0.3))          # and on nothing else


def test_dropout_off_outside_training():
    g = make_graph()
    x = make_inputs(g, 2, "gat")
    a = edge_attention(g, **x, negative_slope=0.2, dropout=0.5, training=False, backend="torch")
    b = edge_attention(g, **x, negative_slope=0.2, backend="torch")
    torch.testing.assert_close(a, b)    # not bitwise: index_add is atomic (unordered) on CUDA


# --- (b) Triton vs the torch backend --------------------------------------------------------

def edge_schedule(heads, dim_k=5, dim_v=6, chunk=13):
    # An odd chunk smaller than the super node's degree, so boundaries cut rows anywhere;
    # two heads per program, so three heads need a second head block with a masked lane.
    return Schedule("edge", block_e=8, block_h=min(2, next_pow2(heads)), block_dk=next_pow2(dim_k),
                    block_dv=next_pow2(dim_v), chunk=chunk)


def run_triton_vs_torch(terms, heads, strategy, dtype=torch.float32, rel=1e-4, dropout=0.0,
                        graph=None, bias=False, schedule=None):
    g = graph if graph is not None else make_graph()
    x = make_inputs(g, heads, terms, dtype=dtype, bias=bias)
    kw = dict(TERMS[terms][1], dropout=dropout, training=dropout > 0, seed=11)
    sched = schedule or (edge_schedule(heads) if strategy == "edge" else None)
    ref = outputs_and_grads(lambda **t: edge_attention(g, **t, **kw, backend="torch"), x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # numpy overflow chatter
        got = outputs_and_grads(lambda **t: edge_attention(
            g, **t, **kw, backend="triton", strategy=strategy, schedule=sched), x)
    for name, a, b in zip(("out",) + tuple(x), got, ref):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape, name
        assert torch.isfinite(a).all(), name
        assert_close(a, b, rel, f"{name} ({strategy}, {dtype})")


@needs_triton
@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("terms", ["gat", "agnn", "transformer", "all"])
def test_triton_fp32(terms, heads, strategy):
    run_triton_vs_torch(terms, heads, strategy)


@needs_triton
@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("block_e", [1, 2])
@pytest.mark.parametrize("terms", ["gat", "all"])
def test_triton_short_edge_tiles_all_heads(terms, block_e, strategy):
    """The tiles the heuristic and tuner now pick for 128-element rows (RGAT's 8 heads x 16):
    1 or 2 edges per step, every head in one program; output and every gradient."""
    sched = Schedule(strategy, block_e=block_e, block_h=4, block_dk=8, block_dv=8,
                     chunk=13 if strategy == "edge" else 0)
    run_triton_vs_torch(terms, 3, strategy, schedule=sched)


@needs_triton
@pytest.mark.parametrize("heads,terms,bias", [(1, "gat", False), (3, "all", True)])
def test_triton_rows_cut_into_many_chunks(terms, heads, bias):
    """A destination row and a source row each spread over ~70 chunks of 3 edges: the
    combine kernels merge a cut row's partials BLOCK_C chunks per step (several steps here,
    the last one partly masked); output and every gradient against the torch backend."""
    g = make_graph(super_degree=200, hub_out_degree=200)
    assert int(g.in_degree.max) >= 200 and int(g.out_degree.max) >= 200
    run_triton_vs_torch(terms, heads, "edge", graph=g, bias=bias,
                        schedule=edge_schedule(heads, chunk=3))


@needs_triton
@pytest.mark.parametrize("graph,chunk,heads,terms,bias", [
    ("hubs", 3, 1, "gat", False), ("hubs", 3, 3, "all", True), ("plain", 5, 3, "all", True),
    ("empty runs", 4, 3, "transformer", False)])
def test_triton_cut_rows_merged_in_the_traversal(monkeypatch, graph, chunk, heads, terms,
                                                 bias):
    """``HECTOR_MERGE_LAST=1``: the last of a cut row's chunks merges its partials in the
    forward and sums its gradients in both backward sides (no combine launch; the counters
    back at 0 after every launch, so a second call reuses them); output and every gradient
    against the torch backend, twice."""
    check_merge_in_traversal(monkeypatch, graph, chunk, heads, terms, bias)


@pytest.mark.skipif(DEVICE.type == "cuda" or not TRITON_OK,
                    reason="reorders the programs of Triton's interpreter (CPU only)")
@pytest.mark.parametrize("order,graph,chunk,heads,terms,bias", [
    ("reversed", "hubs", 3, 3, "all", True), ("shuffled", "hubs", 3, 1, "gat", False),
    ("shuffled", "empty runs", 4, 3, "transformer", False)])
def test_cut_rows_merged_whatever_order_the_programs_run_in(monkeypatch, order, graph, chunk,
                                                            heads, terms, bias):
    """The in-traversal merge on a GPU: a cut row's chunks finish in any order, and the
    merger is whichever arrives last, not the row's last chunk.  The interpreter runs
    programs in grid order, where the two coincide; here in reverse and shuffled order
    (``helpers.program_order``), forward and both backward sides."""
    from helpers import program_order
    with program_order(order, seed=3):
        check_merge_in_traversal(monkeypatch, graph, chunk, heads, terms, bias)


def check_merge_in_traversal(monkeypatch, graph, chunk, heads, terms, bias):
    from hector.kernels.attention import launch, plan
    monkeypatch.setenv("HECTOR_MERGE_LAST", "1")
    g = {"hubs": lambda: make_graph(super_degree=200, hub_out_degree=200),
         "plain": make_graph, "empty runs": graph_with_empty_runs}[graph]()
    combines = []
    real = launch.registry.kernel
    monkeypatch.setattr(launch.registry, "kernel", lambda name, **kw: (
        combines.append(name) if name in ("attention_combine", "combine_sum") else None)
        or real(name, **kw))
    for _ in range(2):
        run_triton_vs_torch(terms, heads, "edge", graph=g, bias=bias,
                            schedule=edge_schedule(heads, chunk=chunk))
    assert not combines
    counters = [t for table in plan._chunk_tables.values() for key, t in table.items()
                if key[0] == "counts"]
    assert counters and all(int(t.abs().sum()) == 0 for t in counters)


def test_merge_in_traversal_is_opt_in_and_edge_parallel_only(monkeypatch):
    from hector.kernels.attention.launch import merges_in_traversal
    monkeypatch.delenv("HECTOR_MERGE_LAST", raising=False)
    assert not merges_in_traversal("edge")
    monkeypatch.setenv("HECTOR_MERGE_LAST", "1")
    assert merges_in_traversal("edge") and not merges_in_traversal("node")


@needs_triton
@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("heads,terms", [(1, "transformer"), (3, "all")])
def test_triton_row_addend_epilogue(terms, heads, strategy):
    """A row-wise addend ``[N, H, Dv]`` read in place with its row stride (a column slice of
    a wider buffer), added by the forward and combine epilogues and written alone into the
    rows without edges; the backward's delta subtracts each row's again: output and every
    gradient, the addend's (the output's) included, equal the torch backend's ``out +
    addend``."""
    run_triton_vs_torch(terms, heads, strategy, bias="rows")


def _normed_keys(g, heads, dim=6, seed=3):
    """(v, q, k, k_norm): k is v divided row by row by k_norm (AGNN's normalised keys)."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(g.num_nodes, heads, dim, generator=gen)
    k_norm = torch.rand(g.num_nodes, generator=gen) + 0.5
    q = torch.randn(g.num_nodes, heads, dim, generator=gen)
    k = v / k_norm[:, None, None]
    return ({n: t.to(DEVICE).requires_grad_() for n, t in (("v", v), ("q", q), ("k", k))},
            k_norm.to(DEVICE))


@needs_triton
@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("heads", [1, 3])
def test_triton_normed_keys(heads, strategy):
    """``k_norm``: the destination side forms each edge's key from its gathered value row;
    output and the gradients of v, q and k equal the torch backend's with k as given."""
    g = make_graph()
    x, k_norm = _normed_keys(g, heads)
    sched = edge_schedule(heads, dim_k=6, dim_v=6) if strategy == "edge" else None
    ref = outputs_and_grads(lambda **t: edge_attention(g, **t, scale=1.3, backend="torch"), x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = outputs_and_grads(lambda **t: edge_attention(
            g, **t, scale=1.3, backend="triton", strategy=strategy, schedule=sched,
            k_norm=k_norm), x)
        # The forward and the destination side read no k row: with a k of zeros the
        # output and dq (the destination side's) are the same.
        blind = outputs_and_grads(lambda v, q: edge_attention(
            g, v, q, torch.zeros_like(x["k"]), scale=1.3, backend="triton", strategy=strategy,
            schedule=sched, k_norm=k_norm), dict(v=x["v"], q=x["q"]))
    for name, a, b in zip(("out", "v", "q", "k"), got, ref):
        assert_close(a, b, 1e-4, f"{name} ({strategy})")
    assert_close(blind[0], ref[0], 1e-4, f"out from v alone ({strategy})")
    assert_close(blind[2], ref[2], 1e-4, f"dq from v alone ({strategy})")


def test_k_norm_is_checked():
    g = make_graph(device=torch.device("cpu"))
    x, k_norm = _normed_keys(g, 2)
    x = {n: t.detach().cpu() for n, t in x.items()}
    k_norm = k_norm.cpu()
    bad = [(dict(k_norm=k_norm[:-1]), ValueError, r"\[num_nodes\] = \[24\]"),
           (dict(k_norm=k_norm.double()), TypeError, "float32"),
           (dict(k_norm=k_norm.tolist()), TypeError, "must be a tensor"),
           (dict(k_norm=k_norm, q=None, k=None), ValueError, "k was not given"),
           (dict(k_norm=k_norm, q=x["q"][..., :4], k=x["k"][..., :4]), ValueError,
            "of v's shape")]
    for change, error, match in bad:
        with pytest.raises(error, match=match):
            edge_attention(g, **dict(x, **change), backend="torch")


def test_k_norm_promise_is_checked_in_debug_mode(monkeypatch):
    g = make_graph(device=torch.device("cpu"))
    x, k_norm = _normed_keys(g, 2)
    x = {n: t.detach().cpu() for n, t in x.items()}
    edge_attention(g, **x, k_norm=k_norm.cpu(), backend="torch")      # unchecked
    monkeypatch.setenv("HECTOR_DEBUG", "1")
    edge_attention(g, **x, k_norm=k_norm.cpu(), backend="torch")      # the promise holds
    with pytest.raises(ValueError, match="not v divided"):
        edge_attention(g, **x, k_norm=k_norm.cpu() * 2, backend="torch")      # not k's


def test_row_addend_shape_is_checked():
    g = make_graph()
    x = make_inputs(g, 2, "gat")
    with pytest.raises(ValueError, match=r"\[rows, heads, Dv\] = \[24, 2, 6\]"):
        edge_attention(g, **x, bias=torch.zeros(23, 2, 6, device=DEVICE), backend="torch")


@needs_triton
@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("heads,terms", [(1, "gat"), (3, "all")])
def test_triton_bias_epilogue(terms, heads, strategy):
    """An output bias added by the kernels (forward and combine epilogues; the backward's
    delta subtracts it again): output and every gradient, the bias's included, equal the
    torch backend's ``out + bias``; rows without edges get the bias alone."""
    run_triton_vs_torch(terms, heads, strategy, bias=True)


@needs_triton
@pytest.mark.parametrize("strategy", ["node", "edge"])
def test_triton_bias_epilogue_half(strategy):
    run_triton_vs_torch("all", 3, strategy, dtype=torch.bfloat16, rel=2e-2, bias=True)


def test_bias_is_checked_against_v():
    g = make_graph(device=torch.device("cpu"))
    v = torch.randn(g.num_nodes, 2, 3)
    with pytest.raises(ValueError, match=r"bias must have shape \[heads, Dv\] = \[2, 3\]"):
        edge_attention(g, v, bias=torch.zeros(3))
    with pytest.raises(TypeError, match="bias has dtype"):
        edge_attention(g, v, bias=torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="bias must be a tensor"):
        edge_attention(g, v, bias=[0.0] * 6)
    flat = edge_attention(g, v, bias=torch.ones(6), backend="torch")
    torch.testing.assert_close(flat, edge_attention(g, v, backend="torch") + 1)


@needs_triton
@pytest.mark.parametrize("bias", [False, True])
def test_edge_parallel_writes_every_row_when_none_is_skipped(monkeypatch, bias):
    """On a graph whose rows all have edges (self loops) the edge-parallel outputs are not
    zero-filled (``launch._rows_out``): poisoned with NaN instead, every row and gradient
    must still come out finite and equal to the torch backend's."""
    from hector.graph.transforms import with_self_loops
    from hector.kernels.attention import launch
    seen = []

    def poisoned(skips, shape, **kw):
        seen.append(skips)
        return torch.zeros(shape, **kw) if skips else torch.full(shape, float("nan"), **kw)
    monkeypatch.setattr(launch, "_rows_out", poisoned)
    run_triton_vs_torch("all", 3, "edge", graph=with_self_loops(make_graph()), bias=bias)
    assert seen and not any(seen)     # every output took the unfilled path


@needs_triton
@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_half(dtype, strategy):
    run_triton_vs_torch("all", 3, strategy, dtype=dtype, rel=2e-2)


@needs_triton
@pytest.mark.parametrize("strategy", ["node", "edge"])
def test_triton_dropout_same_mask(strategy):
    run_triton_vs_torch("all", 3, strategy, dropout=0.3)


@needs_triton
@pytest.mark.parametrize("strategy", ["node", "edge"])
def test_triton_without_edges(strategy):
    g = Graph(torch.empty(2, 0, dtype=torch.int64), num_nodes=5).to(DEVICE)
    run_triton_vs_torch("gat", 2, strategy, graph=g)


def graph_with_empty_runs():
    """Edges enter only nodes 10-19 and 40-49 and leave only 0-29, so the in- and out-CSR
    both have leading, interior and trailing runs of rows without edges (the derived graphs
    of compiled RGAT/HGT and ogbn-mag's authors look like this); node 12 exceeds a chunk."""
    gen = torch.Generator().manual_seed(3)
    dst = torch.cat([torch.randint(10, 20, (60,), generator=gen),
                     torch.randint(40, 50, (60,), generator=gen), torch.full((30,), 12)])
    src = torch.randint(0, 30, (dst.numel(),), generator=gen)
    return Graph(torch.stack([src, dst]), num_nodes=60).to(DEVICE)


@needs_triton
@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_triton_runs_of_empty_rows(strategy, dropout):
    from hector.kernels.attention.plan import active_rows
    g = graph_with_empty_runs()
    for csr in (g.csr_in, g.csr_out):    # the edge schedule traverses only rows with edges
        compressed, sel = active_rows(g, csr)
        assert sel is not None and compressed.ptr.numel() == sel.numel() + 1
        assert bool((csr.degrees()[sel] > 0).all())
    run_triton_vs_torch("all", 3, strategy, dropout=dropout, graph=g)


def test_chunk_rows_in_18_ops_equal_the_searched_rows():
    """Each edge chunk's (first row, end row): the rows holding its first and last edge
    (edgeless rows on a boundary go to the chunk before), in 18 aten ops (22 before: two
    scalars lifted to tensors and copied, a cast of the comparison); every new block's
    attention graph builds two per layer and direction."""
    from hector.kernels.attention import plan as P
    from helpers import aten_ops
    gen = torch.Generator().manual_seed(0)
    for e in (0, 1, 7, 300):
        dst = torch.sort(torch.randint(5, 45, (e,), generator=gen)).values
        g = Graph(torch.stack([torch.randint(0, 50, (e,), generator=gen), dst]), num_nodes=50)
        for csr, chunk in itertools.product((g.csr_in, g.csr_out), (1, 3, 16)):
            rows, ops = aten_ops(lambda: P.chunk_rows(g, csr, chunk))
            assert sum(ops.values()) <= 18, ops
            ptr = csr.ptr.long()
            for c, (lo, hi) in enumerate(rows.tolist()):
                a, b = min(c * chunk, e), min((c + 1) * chunk, e)
                want_lo = 0 if c == 0 else int((ptr[1:] <= a).sum())
                want_hi = 50 if b == e else int((ptr[1:] <= b).sum()) + int(
                    ptr[int((ptr[1:] <= b).sum())] < b)
                assert (lo, hi) == (want_lo, want_hi), (e, chunk, c)


def test_active_and_idle_rows_from_the_degree_statistics_without_nonzero():
    """With the empty-row count the graph's build read, the active and idle row ids are one
    stable sort apart (no ``nonzero``: a device sync per CSR of every new block's attention
    graph), the same ids ``nonzero`` gives; a derived graph's cut source side too."""
    import itertools

    from hector.graph.derived import AttentionGraph
    from hector.kernels.attention import plan as P
    from helpers import aten_ops
    g = graph_with_empty_runs()
    cut = AttentionGraph(g.src, g.dst, g.num_nodes, num_src=30, num_dst=50)
    for graph, side in itertools.product((g, cut), ("dst", "src")):
        full = P.side_csr(graph, side)
        want_active = (full.degrees() > 0).nonzero().squeeze(1)
        want_idle = (full.degrees() == 0).nonzero().squeeze(1)
        (csr, ids), ops = aten_ops(lambda: P.active_rows(graph, full,
                                                         P.empty_rows(graph, side)))
        idle, more = aten_ops(lambda: P.idle_rows(graph, full, P.empty_rows(graph, side)))
        assert "aten::nonzero" not in ops + more and "aten::item" not in ops + more
        assert torch.equal(ids.cpu(), want_active.cpu()) and torch.equal(idle.cpu(),
                                                                         want_idle.cpu())
        assert torch.equal(csr.ptr.cpu(), torch.cat([full.ptr[want_active],
                                                     full.ptr[-1:]]).cpu())


@needs_triton
def test_triton_auto_and_partial_grads():
    """'auto' strategy and schedule, no q/k term, and only some inputs requiring grad."""
    g = make_graph()
    x = make_inputs(g, 2, "all")
    x["k"].requires_grad_(False)
    x["a_dst"].requires_grad_(False)
    kw = dict(scale=0.5, negative_slope=0.2)
    ref = edge_attention(g, **x, **kw, backend="torch")
    got = edge_attention(g, **x, **kw, backend="triton")
    assert_close(got, ref, 1e-4, "out")
    need = [x[n] for n in ("v", "q", "a_src")]
    for a, b, n in zip(torch.autograd.grad(got.sum(), need), torch.autograd.grad(ref.sum(), need),
                       ("v", "q", "a_src")):
        assert_close(a, b, 1e-4, n)


def test_strategy_rule():
    from hector.kernels.attention.spec import default_schedule
    from hector.kernels.attention.plan import choose_strategy
    from hector.graph.structures import DegreeStats
    flat = DegreeStats(max=20, mean=10.0, cv=0.3, num_isolated=0, num_super=0, super_threshold=1000)
    skew = DegreeStats(max=100_000, mean=5.0, cv=40.0, num_isolated=0, num_super=1,
                       super_threshold=1000)
    assert choose_strategy(flat, 1_000_000)[0] == "node"
    strategy, why = choose_strategy(skew, 1_000_000)
    assert strategy == "edge" and "100000" in why
    # HGT's derived graph of mag: the longest row is 1.5 fair shares (node-parallel measured
    # 3.2x slower on the H200), and products-like rows (0.07 shares) stay node-parallel.
    mag = DegreeStats(max=61_726, mean=6.9, cv=12.2, num_isolated=0, num_super=900,
                      super_threshold=1000)
    assert choose_strategy(mag, 21_111_007, sms=132, heads=4)[0] == "edge"
    products = DegreeStats(max=17_481, mean=50.5, cv=1.9, num_isolated=0, num_super=500,
                           super_threshold=1000)
    assert choose_strategy(products, 123_718_280, sms=132, heads=1)[0] == "node"
    # Long rows everywhere (reddit-like: mean 492, max 21.6K, no straggler): edge-parallel
    # with one head, node-parallel with four (the measured split).
    long_rows = DegreeStats(max=21_600, mean=492.0, cv=1.2, num_isolated=0, num_super=8000,
                            super_threshold=1000)
    assert choose_strategy(long_rows, 114_600_000, heads=1)[0] == "edge"
    assert choose_strategy(long_rows, 114_600_000, heads=4)[0] == "node"
    # Many rows of ~1 edge (RGAT's compact sources on wikikg2: 12.9M rows, 1.25 edges each):
    # edge-parallel; as short rows on a small graph, or rows of ~6 edges, node-parallel.
    short = DegreeStats(max=40, mean=1.25, cv=0.5, num_isolated=0, num_super=0,
                        super_threshold=1000)
    strategy, why = choose_strategy(short, 16_109_182, sms=132)
    assert strategy == "edge" and "short rows" in why
    assert choose_strategy(short, 20_000, sms=132)[0] == "node"
    assert choose_strategy(DegreeStats(max=40, mean=6.4, cv=0.5, num_isolated=0, num_super=0,
                                       super_threshold=1000), 16_109_182, sms=132)[0] == "node"
    from hector.kernels.attention.plan import CHUNK_PROGRAMS_PER_SM
    from hector.kernels.attention.spec import MAX_CHUNK, MIN_CHUNK
    lanes = 132 * CHUNK_PROGRAMS_PER_SM
    spec = AttentionSpec.of(torch.empty(1, 8, 8))
    sched = default_schedule(spec, "edge", 1_000_000, 5.0, lanes)
    assert sched.block_h == 8 and sched.chunk >= 4 * sched.block_e
    # 8 heads x 16 (RGAT 128x8): one program holds every head, 2 edges per step (a 256-element
    # tile), and the tuner may try one edge per step (both measured faster on the H200)
    from hector.kernels.attention.spec import tune_configs
    wide = default_schedule(AttentionSpec.of(torch.empty(1, 8, 16)), "edge", 16_109_182, 1.25,
                            lanes)
    assert (wide.block_h, wide.block_e, wide.num_warps) == (8, 2, 1)
    assert {(c.block_e, c.num_warps) for c in tune_configs(wide)} == {
        (2, 1), (4, 1), (8, 1), (1, 1), (2, 2), (4, 2)}
    # rows of 64 elements keep 4 edges per step, as before
    assert default_schedule(AttentionSpec.of(torch.empty(1, 4, 16)), "edge", 16_109_182, 1.25,
                            lanes).block_e == 4
    # many short chunks on a big graph (mag: 8192-edge chunks measured 1.3-1.6x slower)
    assert default_schedule(spec, "edge", 21_111_007, 6.9, lanes).chunk == MAX_CHUNK <= 1024
    # mid-size graphs get enough chunks to fill the device: 128-edge chunks measured 1.4-2.5x
    # faster than 1024 on synthetic arxiv (1.17M edges) and github-musae (578K)
    for edges in (287_209, 578_006, 1_166_243):
        assert default_schedule(spec, "edge", edges, 6.9, lanes).chunk == MIN_CHUNK == 128
    # in between, about one chunk per resident program, a power of two
    chunk = default_schedule(spec, "edge", 3_000_000, 6.9, lanes).chunk
    assert chunk == 256 and 3_000_000 // chunk >= lanes


def test_small_graphs_get_short_chunks_and_long_walks_go_edge_parallel():
    """The small-graph rule (measured on the H200): on a graph too small to give every resident
    program a MIN_CHUNK chunk, chunks aim at fewer programs, down to SMALL_CHUNK edges; and a
    row walked in more than LONG_WALK_TILES edge tiles sends the traversal edge-parallel."""
    from hector.graph.structures import DegreeStats
    from hector.kernels.attention.plan import (CHUNK_PROGRAMS_PER_SM, LONG_WALK_TILES,
                                               SMALL_GRAPH_PROGRAMS_PER_SM, choose_strategy)
    from hector.kernels.attention.spec import MIN_CHUNK, SMALL_CHUNK, default_schedule
    lanes, few = 132 * CHUNK_PROGRAMS_PER_SM, 132 * SMALL_GRAPH_PROGRAMS_PER_SM
    one_head = AttentionSpec.of(torch.empty(1, 1, 128))        # 128-wide rows: 2 edges a tile
    four = AttentionSpec.of(torch.empty(1, 4, 16))             # 64-wide rows: 4 edges a tile

    def chunk(spec, edges, small=few):
        return default_schedule(spec, "edge", edges, 4.0, lanes,
                                small_graph_programs=small).chunk
    assert chunk(one_head, 10_556) == SMALL_CHUNK == 16          # cora
    assert chunk(one_head, 88_648) == 32                         # synthetic pubmed
    assert chunk(one_head, 10_556, small=None) == MIN_CHUNK      # not asked: as before
    assert chunk(one_head, 20) == SMALL_CHUNK                    # never below it
    narrow_rows = default_schedule(AttentionSpec.of(torch.empty(1, 1, 16)), "edge", 10_556,
                                   16.0, lanes, small_graph_programs=few)
    assert (narrow_rows.block_e, narrow_rows.chunk) == (16, 64)  # at least 4 tiles a chunk
    tiny_rows = default_schedule(AttentionSpec.of(torch.empty(1, 1, 2)), "edge", 10_556,
                                 64.0, lanes, small_graph_programs=few)
    assert (tiny_rows.block_e, tiny_rows.chunk) == (64, 256)    # ... even above MIN_CHUNK
    for edges in (287_209, 578_006, 1_166_243, 21_111_007):      # amazon .. mag: unchanged
        assert chunk(one_head, edges) == chunk(one_head, edges, small=None)

    cora = DegreeStats(max=168, mean=3.9, cv=1.34, num_isolated=0, num_super=0,
                       super_threshold=1000)
    wide = default_schedule(one_head, "edge", 10_556, 3.9, lanes, small_graph_programs=few)
    strategy, why = choose_strategy(cora, 10_556, 132, 1, tile=wide.block_e, chunk=wide.chunk)
    assert (wide.block_e, strategy) == (2, "edge") and "168 edges, 2 per tile" in why
    assert 168 > LONG_WALK_TILES * 2
    narrow = default_schedule(four, "edge", 10_556, 3.9, lanes, small_graph_programs=few)
    assert narrow.block_e == 4 and 168 <= LONG_WALK_TILES * 4
    assert choose_strategy(cora, 10_556, 132, 4, tile=4, chunk=narrow.chunk)[0] == "node"
    # without the schedule's facts, or with MIN_CHUNK chunks (a graph big enough), as before
    assert choose_strategy(cora, 10_556, 132, 1)[0] == "node"
    assert choose_strategy(cora, 10_556, 132, 1, tile=2, chunk=MIN_CHUNK)[0] == "node"


def test_make_plan_sends_a_small_graphs_long_walks_edge_parallel():
    from hector.graph import Graph
    from hector.kernels.attention.plan import make_plan
    # node 0 receives 150 edges (75 tiles of 2 at 128 wide; 38 of 4 at 4 x 16), the rest one
    src = torch.cat([torch.arange(1, 151) % 100, torch.arange(99)])
    dst = torch.cat([torch.zeros(150, dtype=torch.long), torch.arange(1, 100)])
    g = Graph(torch.stack([src, dst]), num_nodes=100)
    plan = make_plan(g, AttentionSpec.of(torch.empty(1, 1, 128)))
    assert plan.dst.strategy == "edge" and plan.dst.chunk == 16, plan.dst
    assert plan.src.strategy == "node" and plan.src.chunk == 0, plan.src   # out-degrees <= 3
    assert make_plan(g, AttentionSpec.of(torch.empty(1, 4, 16))).dst.strategy == "node"


# --- (c) bad input --------------------------------------------------------------------------

def bad_cases():
    n = 24
    ok = lambda *s: torch.randn(*s)
    return [
        (dict(v=ok(n + 1, 2, 4)), ValueError, "v"),
        (dict(v=ok(n, 8)), ValueError, "v must have shape"),
        (dict(v=torch.ones(n, 2, 4, dtype=torch.int64)), TypeError, "v must be a floating"),
        (dict(v=[1.0]), TypeError, "v must be a torch.Tensor"),
        (dict(q=ok(n, 2, 3)), ValueError, "q was given without k"),
        (dict(k=ok(n, 2, 3)), ValueError, "k was given without q"),
        (dict(q=ok(n, 2, 3), k=ok(n, 2, 4)), ValueError, "q and k"),
        (dict(q=ok(n, 3, 3), k=ok(n, 3, 3)), ValueError, "q must have shape"),
        (dict(a_src=ok(n, 3)), ValueError, "a_src must have shape"),
        (dict(a_dst=ok(n - 1, 2)), ValueError, "a_dst"),
        (dict(a_dst=ok(n, 2).double()), TypeError, "a_dst has dtype"),
        (dict(a_src=ok(n, 2).to("meta")), ValueError, "a_src is on meta"),
        (dict(dropout=1.0), ValueError, "dropout"),
        (dict(dropout=-0.1), ValueError, "dropout"),
        (dict(dropout="0.1"), TypeError, "dropout"),
        (dict(scale=float("nan")), TypeError, "scale"),
        (dict(negative_slope="x"), TypeError, "negative_slope"),
        (dict(training=1), TypeError, "training"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(strategy="fast"), ValueError, "strategy"),
        (dict(backend="cuda"), ValueError, "backend"),
        (dict(graph="not a graph"), TypeError, "graph"),
    ]


@pytest.mark.parametrize("change,exc,message", bad_cases())
def test_bad_input(change, exc, message):
    g = make_graph(device="cpu")
    kw = dict(graph=g, v=torch.randn(g.num_nodes, 2, 4), backend="torch")
    kw.update(change)
    with pytest.raises(exc, match=message):
        edge_attention(**kw)


def test_triton_backend_refused_without_device(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    g = make_graph(device="cpu")
    with pytest.raises(ValueError, match="backend='triton'"):
        edge_attention(g, torch.randn(g.num_nodes, 1, 4), backend="triton")
    with pytest.raises(TypeError, match="v has dtype torch.float64"):
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        edge_attention(g, torch.randn(g.num_nodes, 1, 4).double(), backend="triton")


# --- (d) semantics against PyG --------------------------------------------------------------

def pyg_graph(seed=3):
    g = make_graph(num_nodes=20, num_random=80, super_degree=25, seed=seed, device="cpu")
    return g, g.input_edge_index()


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_gat_matches_pyg(backend):
    from torch_geometric.nn import GATConv
    torch.manual_seed(0)
    g, ei = pyg_graph()
    heads, out_ch = 3, 4
    conv = GATConv(7, out_ch, heads=heads, add_self_loops=False, bias=False)
    x = torch.randn(g.num_nodes, 7)
    want = conv(x, ei)
    z = conv.lin(x).view(-1, heads, out_ch)
    a_src = (z * conv.att_src).sum(-1)
    a_dst = (z * conv.att_dst).sum(-1)
    g, z, a_src, a_dst = g.to(DEVICE), z.to(DEVICE), a_src.to(DEVICE), a_dst.to(DEVICE)
    got = edge_attention(g, z, a_src=a_src, a_dst=a_dst, negative_slope=conv.negative_slope,
                         backend=backend)
    assert_close(got.reshape(g.num_nodes, -1).cpu(), want, 1e-5, "GAT out")


def test_agnn_matches_pyg():
    from torch_geometric.nn import AGNNConv
    g, ei = pyg_graph()
    conv = AGNNConv(add_self_loops=False)
    with torch.no_grad():
        conv.beta.fill_(1.7)
    x = torch.randn(g.num_nodes, 6)
    xn = F.normalize(x, p=2.0, dim=-1)[:, None]
    got = edge_attention(g, x[:, None], q=xn * conv.beta, k=xn, backend="torch")
    assert_close(got[:, 0], conv(x, ei), 1e-5, "AGNN out")


def test_transformer_matches_pyg():
    from torch_geometric.nn import TransformerConv
    torch.manual_seed(0)
    g, ei = pyg_graph()
    heads, ch = 2, 5
    conv = TransformerConv(6, ch, heads=heads, root_weight=False)
    x = torch.randn(g.num_nodes, 6)
    q, k, m = (lin(x).view(-1, heads, ch) for lin in (conv.lin_query, conv.lin_key, conv.lin_value))
    got = edge_attention(g, m, q=q, k=k, scale=1 / math.sqrt(ch), backend="torch")
    assert_close(got.reshape(g.num_nodes, -1), conv(x, ei), 1e-5, "Transformer out")
