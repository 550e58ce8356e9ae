"""The attention backward kernels' ``dst_map``: destination rows that read their query,
output gradient, output and log-sum-exp at ``dst_map[row]`` of smaller tensors (RGAT's (dst,
relation) groups reading their node's rows in place) give exactly the gradients of the same
kernels run on those rows gathered into row-aligned copies (``dq`` per destination row), on
both schedules and with the super node split over chunks; and a derived graph whose two
sides have their own row counts against the same graph on padded operands."""
import os
import sys
from pathlib import Path

import pytest
import torch

from hector.kernels.attention.launch import edge_attention_grads_triton, make_plan
from hector.kernels.attention.spec import AttentionSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_edge_attention import DEVICE, edge_schedule, make_graph  # noqa: E402

pytestmark = pytest.mark.skipif(
    DEVICE.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="no CUDA and TRITON_INTERPRET is not set")


def _grads(g, plan, spec, t, dout, out, lse, dst_map=None):
    return edge_attention_grads_triton(g, spec, plan, [True] * 5, dout, t["v"], t["q"], t["k"],
                                       t["a_src"], t["a_dst"], out, lse, 0.6, 0.1,
                                       dst_map=dst_map)


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-6)])
def test_mapped_rows_equal_gathered_rows(strategy, dtype, tol):
    g = make_graph()
    n, heads, dk, dv, m = g.num_nodes, 3, 5, 6, 9
    gen = torch.Generator().manual_seed(7)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)
    t = dict(v=rand(n, heads, dv), k=rand(n, heads, dk), a_src=rand(n, heads),
             a_dst=rand(n, heads))
    # m "node" rows; every destination row of the graph points at one of them
    dst_map = torch.randint(0, m, (n,), generator=gen).to(DEVICE)
    q, dout, out = rand(m, heads, dk), rand(m, heads, dv), rand(m, heads, dv)
    lse = (torch.randn(m, heads, generator=gen) + 3).to(DEVICE)
    spec = AttentionSpec.of(t["v"], q, t["a_src"], t["a_dst"], 0.1)
    plan = make_plan(g, spec, strategy,
                     schedule=edge_schedule(heads) if strategy == "edge" else None)
    want = _grads(g, plan, spec, dict(t, q=q[dst_map]), dout[dst_map], out[dst_map],
                  lse[dst_map])
    got = _grads(g, plan, spec, dict(t, q=q), dout, out, lse, dst_map)
    for name, a, b in zip(("dv", "dq", "dk", "da_src", "da_dst"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol, msg=name)


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
    from hector.kernels.attention.launch import (edge_attention_backward_op, edge_attention_op,
                                                 edge_attention_triton, graph_handle)
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
