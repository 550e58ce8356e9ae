"""q, k, v and the score terms with strided rows, and dk / dv written into one joint buffer.

A compiler computes K and V with one GEMM into a ``[R, H*DK + H*DV]`` buffer; k and v are then
column slices of it (row stride ``H*DK + H*DV``), which the kernels read in place (no
``.contiguous()`` copy), and the backward can write dk and dv into one such buffer
(``joint_kv``), the gradient of that GEMM's output.  Checked against the same kernels on
contiguous copies, on both schedules: an edge-parallel one whose chunks cut rows on both
sides (so the partials' combine pass writes into the strided outputs) and skips edgeless
rows (a source node without out-edges: its joint gradient row must be exactly 0)."""
import os
import sys
from pathlib import Path

import pytest
import torch

from hector import Graph
from hector.kernels.attention import launch
from hector.kernels.attention.custom_ops import (edge_attention_backward_op,
                                                 edge_attention_grads_triton,
                                                 edge_attention_triton, graph_handle,
                                                 launch_handle)
from hector.kernels.attention.launch import attention_backward, rows_dense, term_rows
from hector.kernels.attention.op import edge_attention
from hector.kernels.attention.plan import make_plan
from hector.kernels.attention.spec import AttentionSpec, Schedule
from hector.kernels.sizes import next_pow2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_edge_attention import DEVICE  # noqa: E402

pytestmark = pytest.mark.skipif(
    DEVICE.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="no CUDA and TRITON_INTERPRET is not set")

N = 30
HUB_DST, HUB_SRC = 5, 3          # a high in-degree and a high out-degree node
NO_OUT = (10, 26, 27, 28, 29)    # nodes without out-edges (skipped source rows)
NO_IN = (27, 28, 29)             # nodes without in-edges (skipped destination rows)
SCALE, SLOPE = 0.6, 0.1
ROLES = ("v", "q", "k", "a_src", "a_dst")


def make_graph(seed=0):
    """30 nodes, 150 edges: random ones plus a hub destination (40 in-edges) and a hub
    source (30 out-edges), both longer than the test chunk; NO_OUT send nothing, NO_IN
    receive nothing."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 26, (80,), generator=gen)
    src[src == 10] = 11
    dst = torch.randint(0, 27, (80,), generator=gen)
    hub_in = torch.randint(0, 26, (40,), generator=gen)
    hub_in[hub_in == 10] = 12
    hub_out = torch.randint(0, 27, (30,), generator=gen)
    ei = torch.stack([torch.cat([src, hub_in, torch.full((30,), HUB_SRC)]),
                      torch.cat([dst, torch.full((40,), HUB_DST), hub_out])])
    g = Graph(ei, num_nodes=N).to(DEVICE)
    deg_out = torch.bincount(g.src.long().cpu(), minlength=N)
    deg_in = torch.bincount(g.dst.long().cpu(), minlength=N)
    assert all(deg_out[i] == 0 for i in NO_OUT) and all(deg_in[i] == 0 for i in NO_IN)
    return g


def schedule(strategy, heads, dk, dv):
    # An odd chunk below both hubs' degrees, so boundaries cut rows on both sides.
    return Schedule(strategy, block_e=8, block_h=min(2, next_pow2(heads)),
                    block_dk=next_pow2(dk), block_dv=next_pow2(dv),
                    chunk=13 if strategy == "edge" else 0)


def inputs(heads, dk, dv, dtype, qk=True, seed=1):
    """(terms with k and v as column slices of one joint buffer, the same terms contiguous,
    the joint buffer).  Without q.k (GAT), v is a slice of a wider buffer at a column offset."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)
    # The score terms as GAT makes them: the two column halves of one [N, 2H] product.
    terms = rand(N, 2 * heads)
    a_src, a_dst = terms[:, :heads], terms[:, heads:]
    if qk:
        kv = rand(N, heads * (dk + dv))
        k = kv[:, :heads * dk].view(N, heads, dk)
        v = kv[:, heads * dk:].view(N, heads, dv)
        q = rand(N, heads * dk + 3)[:, 3:].view(N, heads, dk)    # a slice at a column offset
        t = dict(v=v, q=q, k=k, a_src=a_src, a_dst=a_dst)
    else:
        kv = rand(N, 3 + heads * dv + 2)
        v = kv[:, 3:3 + heads * dv].view(N, heads, dv)
        t = dict(v=v, q=None, k=None, a_src=a_src, a_dst=a_dst)
    for name in ("q", "k", "v"):
        if t[name] is not None:
            assert not t[name].is_contiguous() and rows_dense(t[name]) is t[name]
    for name in ("a_src", "a_dst"):
        assert heads == 1 or not t[name].is_contiguous()
        assert term_rows(t[name]) is t[name]
    dense = {r: (x.contiguous() if x is not None else None) for r, x in t.items()}
    return t, dense, kv


def plan_for(g, t, strategy, heads, dk, dv):
    spec = AttentionSpec.of(t["v"], t["q"], t["a_src"], t["a_dst"], SLOPE)
    return spec, make_plan(g, spec, strategy, schedule=schedule(strategy, heads, dk, dv))


def forward(g, t, spec, plan):
    return edge_attention_triton(g, *(t[r] for r in ROLES), scale=SCALE, negative_slope=SLOPE,
                                 spec=spec, plan=plan, return_lse=True)


DIMS = [(8, 8), (4, 8)]


def test_rows_dense_keeps_row_strided_views_and_copies_the_rest():
    buf = torch.randn(6, 2 * 4 + 2 * 8)
    k = buf[:, :8].view(6, 2, 4)
    assert rows_dense(k) is k and k.stride(0) == 24
    heads_apart = torch.randn(6, 4, 2).transpose(1, 2)       # heads not adjacent
    assert rows_dense(heads_apart).is_contiguous()
    torch.testing.assert_close(rows_dense(heads_apart), heads_apart, rtol=0, atol=0)
    cols_apart = torch.randn(6, 2, 8)[:, :, ::2]              # features not adjacent
    assert rows_dense(cols_apart).is_contiguous()
    one_head = torch.randn(6, 5, 4)[:, 2:3]                   # size-1 dim: any stride
    assert rows_dense(one_head) is one_head
    assert rows_dense(None) is None
    pair = torch.randn(6, 6)
    assert term_rows(pair[:, :3]) is not None and term_rows(pair[:, :3]).data_ptr() == \
        pair.data_ptr()                                        # a column slice: read in place
    assert term_rows(pair[:, ::2]).is_contiguous()            # heads not adjacent: copied
    assert term_rows(None) is None


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("dk,dv", DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_strided_equals_contiguous(strategy, dk, dv, dtype):
    g, heads = make_graph(), 2
    t, dense, _ = inputs(heads, dk, dv, dtype)
    spec, plan = plan_for(g, t, strategy, heads, dk, dv)
    out, lse = forward(g, t, spec, plan)
    out0, lse0 = forward(g, dense, spec, plan)
    assert torch.equal(out, out0) and torch.equal(lse, lse0)
    assert (out[list(NO_IN)] == 0).all()


@pytest.mark.parametrize("strategy", ["node", "edge"])
def test_forward_strided_v_without_qk(strategy):
    """GAT's terms (no k: the dummy in k's slot gets a consistent stride); v at a column
    offset of a wider buffer."""
    g, heads, dv = make_graph(), 2, 8
    t, dense, _ = inputs(heads, 4, dv, torch.float32, qk=False)
    spec, plan = plan_for(g, t, strategy, heads, 4, dv)
    out, lse = forward(g, t, spec, plan)
    out0, lse0 = forward(g, dense, spec, plan)
    assert torch.equal(out, out0) and torch.equal(lse, lse0)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out)
    needs = [True, False, False, True, True]
    got = edge_attention_grads_triton(g, spec, plan, needs, dout, *(t[r] for r in ROLES),
                                      out, lse, SCALE, SLOPE)
    want = edge_attention_grads_triton(g, spec, plan, needs, dout, *(dense[r] for r in ROLES),
                                       out0, lse0, SCALE, SLOPE)
    for name, a, b in zip(ROLES, got, want):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="joint_kv"):
        edge_attention_grads_triton(g, spec, plan, needs, dout, *(t[r] for r in ROLES),
                                    out, lse, SCALE, SLOPE, joint_kv=True)


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("dk,dv", DIMS)
def test_backward_strided_and_joint_equal_contiguous(strategy, dk, dv):
    g, heads = make_graph(), 2
    n_w = heads * (dk + dv)
    t, dense, _ = inputs(heads, dk, dv, torch.float32)
    spec, plan = plan_for(g, t, strategy, heads, dk, dv)
    out, lse = forward(g, dense, spec, plan)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out)
    needs = [True] * 5
    want = edge_attention_grads_triton(g, spec, plan, needs, dout, *(dense[r] for r in ROLES),
                                       out, lse, SCALE, SLOPE)
    # strided k and v in, separate gradients out
    got = edge_attention_grads_triton(g, spec, plan, needs, dout, *(t[r] for r in ROLES),
                                      out, lse, SCALE, SLOPE)
    for name, a, b in zip(ROLES, got, want):
        assert a.is_contiguous() and torch.equal(a, b), name
    dk_want, dv_want = want[2], want[0]
    joint_want = torch.cat([dk_want.flatten(1), dv_want.flatten(1)], 1)
    for i in NO_OUT:   # skipped source rows (edge-parallel) or edgeless ones: exactly 0
        assert (joint_want[i] == 0).all()

    # the op with joint_kv: [empty, dq, dkv, da_src, da_dst]
    got = edge_attention_grads_triton(g, spec, plan, needs, dout, *(t[r] for r in ROLES),
                                      out, lse, SCALE, SLOPE, joint_kv=True)
    assert len(got) == 5 and got[0].numel() == 0
    dkv = got[2]
    assert tuple(dkv.shape) == (N, n_w) and dkv.is_contiguous() and dkv.dtype == torch.float32
    assert torch.equal(dkv, joint_want)
    for i in (1, 3, 4):
        assert torch.equal(got[i], want[i]), ROLES[i]

    # attention_backward itself: dk and dv as views of one buffer
    params = (SCALE, SLOPE, 0.0, 0)
    grads = attention_backward(g, spec, plan, params, tuple(needs), dout,
                               *(t[r] for r in ROLES), out, lse, joint_kv=True)
    dv_j, dk_j = grads[0], grads[2]
    assert dk_j.untyped_storage().data_ptr() == dv_j.untyped_storage().data_ptr()
    assert dk_j.stride(0) == dv_j.stride(0) == n_w
    assert dv_j.data_ptr() == dk_j.data_ptr() + heads * dk * dk_j.element_size()
    assert torch.equal(dk_j, dk_want) and torch.equal(dv_j, dv_want)
    assert torch.equal(launch.joint_of(dk_j, dv_j), joint_want)
    for i in (1, 3, 4):
        assert torch.equal(grads[i], want[i]), ROLES[i]


@pytest.mark.parametrize("strategy", ["node", "edge"])
def test_joint_buffer_rows_skipped_by_the_traversal_are_zero(monkeypatch, strategy):
    """Even when the allocator hands back dirty memory: the joint buffer's skipped rows
    (edge-parallel, sources without out-edges) are zero, and node-parallel writes them."""
    real_empty = torch.empty

    def dirty(*shape, **kw):
        return real_empty(*shape, **kw).fill_(float("nan"))
    g, heads, dk, dv = make_graph(), 2, 4, 8
    t, _, _ = inputs(heads, dk, dv, torch.float32)
    spec, plan = plan_for(g, t, strategy, heads, dk, dv)
    out, lse = forward(g, t, spec, plan)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out)
    monkeypatch.setattr(torch, "empty", dirty)
    grads = attention_backward(g, spec, plan, (SCALE, SLOPE, 0.0, 0), (True,) * 5, dout,
                               *(t[r] for r in ROLES), out, lse, joint_kv=True)
    monkeypatch.undo()
    dkv = launch.joint_of(grads[2], grads[0])
    assert torch.isfinite(dkv).all()
    assert (dkv[list(NO_OUT)] == 0).all()
    assert (dkv[HUB_SRC] != 0).any()


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_autograd_through_the_joint_buffer(strategy, dropout):
    """The public op with a pinned schedule (autograd.Function, which saves the strided k
    and v): the joint buffer's gradient equals the contiguous leaves' gradients side by
    side, q's too; dropout draws the same mask."""
    g, heads, dk, dv = make_graph(), 2, 4, 8
    gen = torch.Generator().manual_seed(5)
    kv = torch.randn(N, heads * (dk + dv), generator=gen).to(DEVICE).requires_grad_()
    q = torch.randn(N, heads, dk, generator=gen).to(DEVICE).requires_grad_()
    a_src = torch.randn(N, heads, generator=gen).to(DEVICE).requires_grad_()
    k_c = kv.detach()[:, :heads * dk].reshape(N, heads, dk).clone().requires_grad_()
    v_c = kv.detach()[:, heads * dk:].reshape(N, heads, dv).clone().requires_grad_()
    kw = dict(scale=SCALE, negative_slope=SLOPE, dropout=dropout, training=dropout > 0,
              seed=11, backend="triton", schedule=schedule(strategy, heads, dk, dv))
    out = edge_attention(g, kv[:, heads * dk:].view(N, heads, dv), q,
                         kv[:, :heads * dk].view(N, heads, dk), a_src, **kw)
    out0 = edge_attention(g, v_c, q, k_c, a_src, **kw)
    assert torch.equal(out, out0)
    gout = torch.randn(out.shape, generator=gen).to(out)
    got = torch.autograd.grad(out, [kv, q, a_src], gout)
    want = torch.autograd.grad(out0, [k_c, v_c, q, a_src], gout)
    assert torch.equal(got[0], torch.cat([want[0].flatten(1), want[1].flatten(1)], 1))
    assert torch.equal(got[1], want[2]) and torch.equal(got[2], want[3])


def test_joint_kv_needs_both_k_and_v_gradients():
    g, heads, dk, dv = make_graph(), 2, 4, 8
    t, _, _ = inputs(heads, dk, dv, torch.float32)
    spec, plan = plan_for(g, t, "node", heads, dk, dv)
    out, lse = forward(g, t, spec, plan)
    dout = torch.zeros_like(out)
    for needs in ([True, True, False, True, True], [False, True, True, True, True]):
        with pytest.raises(ValueError, match="joint_kv"):
            attention_backward(g, spec, plan, (SCALE, SLOPE, 0.0, 0), tuple(needs), dout,
                               *(t[r] for r in ROLES), out, lse, joint_kv=True)
        with pytest.raises(ValueError, match="joint_kv"):
            edge_attention_grads_triton(g, spec, plan, needs, dout, *(t[r] for r in ROLES),
                                        out, lse, SCALE, SLOPE, joint_kv=True)


def test_joint_kv_op_fake_shapes_and_opcheck():
    """The op's fake implementation says the joint output's shape (the real one's), an empty
    dv slot; opcheck's schema (outputs alias nothing) and fake-tensor checks pass."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    g, heads, dk, dv = make_graph(), 2, 4, 8
    t, _, _ = inputs(heads, dk, dv, torch.float32)
    spec, plan = plan_for(g, t, "edge", heads, dk, dv)
    out, lse = forward(g, t, spec, plan)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out)
    args = (graph_handle(g), dout, *(t[r] for r in ROLES), out, lse, SCALE, SLOPE, 0.0, 0,
            "auto", launch_handle(g, spec, plan), [True] * 5)
    real = edge_attention_backward_op(*args, joint_kv=True)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = edge_attention_backward_op(
            *(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args),
            joint_kv=True)
    assert [tuple(f.shape) for f in fake] == [tuple(r.shape) for r in real]
    assert [f.dtype for f in fake] == [r.dtype for r in real]
    assert tuple(real[2].shape) == (N, heads * (dk + dv)) and real[0].numel() == 0
    assert real[2]._base is None                       # the buffer itself, not a view
    torch.library.opcheck(edge_attention_backward_op, args, dict(joint_kv=True),
                          test_utils=("test_schema", "test_faketensor"))
