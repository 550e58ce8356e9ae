"""The attention backward kernels' ``dst_map``: destination rows that read their query,
output gradient, output and log-sum-exp at ``dst_map[row]`` of smaller tensors (RGAT's (dst,
relation) groups reading their node's rows in place; HGT's padded derived graph reading its
unpadded queries) give exactly the gradients of the same kernels run on those rows gathered
into row-aligned copies (``dq`` per destination row), on both schedules and with the
super node split over chunks."""
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


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_dq_rows_copies_out_the_first_rows(strategy, keep):
    """``dq_rows``: dq comes back with that many rows when the graph has many more (copied
    out before the source side runs), else whole; the other gradients are untouched, and
    the fake implementation says the same shapes."""
    from hector.kernels.attention.launch import edge_attention_backward_op
    g = make_graph()
    n, heads, dk, dv = g.num_nodes, 2, 4, 4
    gen = torch.Generator().manual_seed(3)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE)
    t = dict(v=rand(n, heads, dv), q=rand(n, heads, dk), k=rand(n, heads, dk),
             a_src=rand(n, heads), a_dst=rand(n, heads))
    dout, out, lse = rand(n, heads, dv), rand(n, heads, dv), rand(n, heads) + 3
    spec = AttentionSpec.of(t["v"], t["q"], t["a_src"], t["a_dst"], 0.1)
    plan = make_plan(g, spec, strategy,
                     schedule=edge_schedule(heads) if strategy == "edge" else None)
    rows = int(n * keep)
    whole = _grads(g, plan, spec, t, dout, out, lse)
    got = edge_attention_grads_triton(g, spec, plan, [True] * 5, dout, t["v"], t["q"], t["k"],
                                      t["a_src"], t["a_dst"], out, lse, 0.6, 0.1, dq_rows=rows)
    narrowed = 4 * n > 5 * rows
    assert got[1].shape[0] == (rows if narrowed else n)
    torch.testing.assert_close(got[1], whole[1][:got[1].shape[0]], rtol=0, atol=0)
    for a, b in zip(got[:1] + got[2:], whole[:1] + whole[2:]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from hector.kernels.attention.launch import graph_handle
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = edge_attention_backward_op(
            graph_handle(g), *[mode.from_tensor(x) for x in (dout, t["v"], t["q"], t["k"],
                                                              t["a_src"], t["a_dst"], out, lse)],
            0.6, 0.1, 0.0, 0, "auto", 0, [True] * 5, dq_rows=rows)
    assert [tuple(f.shape) for f in fake] == [tuple(x.shape) for x in got]
