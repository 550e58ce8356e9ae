"""Attention terms on rows other than the destinations': a destination term per (dst,
relation) row read per edge through ``dst_index`` (``spec.dst_edge``: RGAT's compiled
attention) against a float64 reference, output and every gradient, on both schedules with a
super node split over chunks; and a derived graph whose two sides have their own row counts
against the same graph on padded operands."""
import os
import sys
from pathlib import Path

import pytest
import torch

from hector.kernels.attention.custom_ops import edge_attention_grads_triton, edge_attention_triton
from hector.kernels.attention.plan import make_plan
from hector.kernels.attention.spec import AttentionSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_edge_attention import DEVICE, edge_schedule, make_graph  # noqa: E402

pytestmark = pytest.mark.skipif(
    DEVICE.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="no CUDA and TRITON_INTERPRET is not set")

ROLES = ("v", "q", "k", "a_src", "a_dst")


def _grads(g, plan, spec, t, dout, out, lse, dst_index=None):
    return edge_attention_grads_triton(g, spec, plan, [True] * 5, dout, *(t[r] for r in ROLES),
                                       out, lse, 0.6, 0.1, dst_index=dst_index)


def _reference(g, t, dst_index, dout):
    """float64 output and gradients of every role with the destination term read per edge
    (``a_dst[dst_index[e]]``): the softmax over each destination's edges written out with
    torch ops, differentiated by torch autograd."""
    t = {r: x.detach().double().cpu().requires_grad_() for r, x in t.items()}
    src, dst, idx = g.src.long().cpu(), g.dst.long().cpu(), dst_index.long().cpu()
    n, heads = g.num_nodes, t["v"].shape[1]
    s = 0.6 * (t["q"][dst] * t["k"][src]).sum(-1) + t["a_src"][src] + t["a_dst"][idx]
    s = torch.where(s > 0, s, 0.1 * s)
    top = torch.full((n, heads), float("-inf"), dtype=s.dtype).scatter_reduce(
        0, dst[:, None].expand_as(s), s, "amax")
    ex = torch.exp(s - top[dst])
    alpha = ex / torch.zeros(n, heads, dtype=s.dtype).index_add(0, dst, ex)[dst]
    out = torch.zeros(n, heads, t["v"].shape[2], dtype=s.dtype).index_add(
        0, dst, alpha[..., None] * t["v"][src])
    grads = torch.autograd.grad(out, [t[r] for r in ROLES], dout.double().cpu())
    return out.detach(), grads


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_destination_term_per_edge_matches_float64(strategy, dtype, tol):
    g = make_graph()
    n, e, heads, dk, dv, m = g.num_nodes, g.num_edges, 3, 5, 6, 9
    gen = torch.Generator().manual_seed(7)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)
    t = dict(v=rand(n, heads, dv), q=rand(n, heads, dk), k=rand(n, heads, dk),
             a_src=rand(n, heads), a_dst=rand(m, heads))       # m (dst, relation) rows
    # Each edge's row of a_dst, several edges per row and one row nobody reads (its
    # gradient must be exactly 0).
    dst_index = torch.randint(0, m - 1, (e,), generator=gen).to(DEVICE)
    dout = rand(n, heads, dv)
    spec = AttentionSpec.of(t["v"], t["q"], t["a_src"], t["a_dst"], 0.1, dst_index=dst_index)
    assert spec.dst_edge
    plan = make_plan(g, spec, strategy,
                     schedule=edge_schedule(heads) if strategy == "edge" else None)
    out, lse = edge_attention_triton(g, *(t[r] for r in ROLES), scale=0.6, negative_slope=0.1,
                                     spec=spec, plan=plan, return_lse=True, dst_index=dst_index)
    got = _grads(g, plan, spec, t, dout, out, lse, dst_index)
    want_out, want = _reference(g, t, dst_index, dout)
    torch.testing.assert_close(out.double().cpu(), want_out, rtol=tol, atol=tol)
    for name, a, b in zip(("dv", "dq", "dk", "da_src", "da_dst"), got, want):
        assert a.shape == b.shape and a.dtype == dtype, name
        torch.testing.assert_close(a.double().cpu(), b, rtol=tol, atol=tol, msg=name)
    assert (got[4][m - 1] == 0).all()


def _sided(src, dst, s_rows, d_rows, sided):
    from hector.graph.derived import AttentionGraph
    n = max(s_rows, d_rows)
    kw = dict(num_src=s_rows, num_dst=d_rows) if sided else {}
    return AttentionGraph(src.to(DEVICE), dst.to(DEVICE), n, **kw)


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("s_rows,d_rows", [(30, 17), (11, 26), (0, 9)])
def test_sided_graph_equals_padded_operands(strategy, s_rows, d_rows):
    """A derived graph whose sources and destinations have their own row counts (``num_src``
    / ``num_dst``: ids share ``[0, max)``): operands of each side with exactly its rows give
    the outputs and gradients of the same graph run on operands zero-padded to ``max`` rows
    (their side's rows of them), with no more rows than the side's; a hub destination split
    over edge-parallel chunks, destinations without edges, and a graph with no sources; the
    fake implementations say the same shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from hector.kernels.attention.custom_ops import (edge_attention_backward_op,
                                                     edge_attention_op, edge_attention_triton,
                                                     graph_handle)
    gen = torch.Generator().manual_seed(s_rows + d_rows)
    e = 60 if s_rows else 0
    src = torch.randint(0, max(s_rows, 1), (e,), generator=gen)
    dst = torch.randint(0, d_rows - 2, (e,), generator=gen)      # the last two get nothing
    dst[: e // 3] = 1                                              # a hub (chunks split it)
    heads, dk, dv = 2, 4, 5

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE)
    t = dict(v=rand(s_rows, heads, dv), q=rand(d_rows, heads, dk), k=rand(s_rows, heads, dk),
             a_src=rand(s_rows, heads), a_dst=rand(d_rows, heads))
    dout = rand(d_rows, heads, dv)
    n = max(s_rows, d_rows)

    def pad(x):
        return torch.cat([x, x.new_zeros((n - x.shape[0],) + x.shape[1:])])
    results = {}
    for sided in (False, True):
        g = _sided(src, dst, s_rows, d_rows, sided)
        terms = {r: (x if sided else pad(x)) for r, x in t.items()}
        spec = AttentionSpec.of(terms["v"], terms["q"], terms["a_src"], terms["a_dst"], 0.1)
        plan = make_plan(g, spec, strategy,
                         schedule=edge_schedule(heads, dk, dv) if strategy == "edge" else None)
        out, lse = edge_attention_triton(g, *(terms[r] for r in ("v", "q", "k", "a_src",
                                                                 "a_dst")), scale=0.6,
                                         negative_slope=0.1, spec=spec, plan=plan,
                                         return_lse=True)
        grads = _grads(g, plan, spec, terms, dout if sided else pad(dout), out, lse)
        results[sided] = (g, terms, out, lse, grads)
    g, terms, out, lse, grads = results[True]
    _, _, out0, lse0, grads0 = results[False]
    assert out.shape[0] == lse.shape[0] == d_rows
    torch.testing.assert_close(out, out0[:d_rows], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, lse0[:d_rows], rtol=1e-6, atol=1e-6)
    for name, a, b, rows in zip(("dv", "dq", "dk", "da_src", "da_dst"), grads, grads0,
                                (s_rows, d_rows, s_rows, s_rows, d_rows)):
        assert a.shape[0] == rows, name
        torch.testing.assert_close(a, b[:rows], rtol=1e-5, atol=1e-6, msg=name)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fk = [mode.from_tensor(terms[r]) for r in ("v", "q", "k", "a_src", "a_dst")]
        f_out, f_lse = edge_attention_op(graph_handle(g), *fk, 0.6, 0.1, 0.0, 0, "auto", 0)
        f_grads = edge_attention_backward_op(
            graph_handle(g), mode.from_tensor(dout), *fk, mode.from_tensor(out),
            mode.from_tensor(lse), 0.6, 0.1, 0.0, 0, "auto", 0, [True] * 5)
    assert (tuple(f_out.shape), tuple(f_lse.shape)) == (tuple(out.shape), tuple(lse.shape))
    assert [tuple(f.shape) for f in f_grads] == [tuple(x.shape) for x in grads]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [5, 200])
def test_fill_rows_writes_only_the_given_rows(dtype, width):
    """``fill_rows``: the rows an edge-parallel traversal skips get the value row (the output
    bias, or zeros); every other row keeps what it held, bit for bit."""
    from hector.kernels.attention.launch import fill_rows
    gen = torch.Generator().manual_seed(width)
    out = torch.randn(70, width, generator=gen).to(DEVICE, dtype)
    before = out.clone()
    ids = torch.randperm(70, generator=gen)[:33].to(DEVICE)
    value = torch.randn(width, generator=gen).to(DEVICE, dtype)
    fill_rows(ids, value, out)
    keep = torch.ones(70, dtype=torch.bool, device=DEVICE)
    keep[ids] = False
    assert torch.equal(out[ids], value.expand(33, width))
    assert torch.equal(out[keep], before[keep])
    fill_rows(ids[:0], value, out)                        # no rows: nothing launched
    assert torch.equal(out[keep], before[keep])
