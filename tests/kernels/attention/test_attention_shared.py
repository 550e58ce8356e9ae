"""k and v shared by the heads: ``[N, H, D]`` views of one row per node with head stride 0
(``x.unsqueeze(1).expand(N, H, D)``, a reordered multi-head Transformer's keys and values).
The kernels read that row for every head (``AttentionSpec.shared_kv``) instead of a copy
with a row per head; checked against the same kernels on the contiguous copy, output and
every gradient, on both schedules (an edge-parallel one whose chunks cut rows and skip
edgeless ones: ``test_attention_strided.make_graph``), with and without the q.k term."""
import os
import sys
from pathlib import Path

import pytest
import torch

from hector.kernels.attention.custom_ops import edge_attention_triton
from hector.kernels.attention.launch import attention_backward, kv_rows
from hector.kernels.attention.op import edge_attention
from hector.kernels.attention.plan import make_plan
from hector.kernels.attention.spec import AttentionSpec, shared_heads

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_attention_strided import N, SCALE, SLOPE, make_graph, schedule  # noqa: E402
from test_edge_attention import DEVICE  # noqa: E402

pytestmark = pytest.mark.skipif(
    DEVICE.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="no CUDA and TRITON_INTERPRET is not set")

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16] if DEVICE.type == "cuda" else [torch.float32]


def test_shared_heads_is_head_stride_zero_with_dense_columns():
    x = torch.randn(5, 8)
    assert shared_heads(x.unsqueeze(1).expand(5, 3, 8))
    assert shared_heads(x.unsqueeze(1).expand(5, 3, 8), x.unsqueeze(1).expand(5, 3, 8))
    assert not shared_heads(x.unsqueeze(1))                          # one head: nothing shared
    assert not shared_heads(x.unsqueeze(1).expand(5, 3, 8).contiguous())
    assert not shared_heads(x.t().unsqueeze(1).expand(8, 3, 5))      # columns not adjacent
    assert not shared_heads(x.unsqueeze(1).expand(5, 3, 8), torch.randn(5, 3, 8))
    spec = AttentionSpec.of(x.unsqueeze(1).expand(5, 3, 8))
    one_row = torch.randn(5, 3, 8)[:, :1].expand(5, 3, 8)
    assert spec.shared_kv and kv_rows(spec, one_row) is one_row       # read as it is, no copy
    with pytest.raises(ValueError, match="shared by the heads"):
        kv_rows(spec, torch.randn(5, 3, 8))


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("qk", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_shared_rows_equal_their_copy_with_a_row_per_head(strategy, qk, dtype):
    g, heads, dim = make_graph(), 3, 8
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(N, dim, generator=gen).to(DEVICE, dtype)
    q = torch.randn(N, heads, dim, generator=gen).to(DEVICE, dtype) if qk else None
    terms = torch.randn(N, 2 * heads, generator=gen).to(DEVICE, dtype)
    a_src, a_dst = (None, None) if qk else (terms[:, :heads], terms[:, heads:])
    results = []
    for shared in (True, False):
        leaves = [t.detach().clone().requires_grad_() for t in (x, q, a_src, a_dst)
                  if t is not None]
        xl, ql = leaves[0], (leaves[1] if qk else None)
        rows = xl.unsqueeze(1).expand(N, heads, dim)
        if not shared:
            rows = rows.contiguous()
        spec = AttentionSpec.of(rows, ql, *leaves[1:] if not qk else (None, None),
                                SLOPE if not qk else None, k=rows if qk else None)
        assert spec.shared_kv == shared
        plan = make_plan(g, spec, strategy, schedule=schedule(strategy, heads, dim, dim))
        out = edge_attention_triton(g, rows, ql, rows if qk else None,
                                    *(leaves[1:] if not qk else (None, None)), scale=SCALE,
                                    negative_slope=None if qk else SLOPE, spec=spec, plan=plan)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE, dtype)
        grads = torch.autograd.grad((out.float() * w.float()).sum(), leaves)
        results.append((out, grads))
    (out_s, g_s), (out_d, g_d) = results
    tol = TOL[dtype]
    torch.testing.assert_close(out_s.float(), out_d.float(), rtol=tol, atol=tol)
    for a, b in zip(g_s, g_d):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def test_shared_rows_match_the_torch_backend():
    g, heads, dim = make_graph(), 4, 8
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(N, dim, generator=gen).to(DEVICE)
    q = torch.randn(N, heads, dim, generator=gen).to(DEVICE)
    rows = x.unsqueeze(1).expand(N, heads, dim)
    got = edge_attention(g, rows, q=q, k=rows, scale=SCALE, backend="triton")
    want = edge_attention(g.to("cpu"), rows.cpu(), q=q.cpu(), k=rows.cpu(), scale=SCALE,
                          backend="torch")
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_joint_or_into_kv_refuse_shared_rows():
    g, heads, dim = make_graph(), 2, 4
    x = torch.randn(N, dim, device=DEVICE)
    rows = x.unsqueeze(1).expand(N, heads, dim)
    q = torch.randn(N, heads, dim, device=DEVICE)
    spec = AttentionSpec.of(rows, q, k=rows)
    plan = make_plan(g, spec, "node")
    out, lse = edge_attention_triton(g, rows, q, rows, scale=SCALE, spec=spec, plan=plan,
                                     return_lse=True)
    for kw in (dict(joint_kv=True), dict(into_kv=True)):
        with pytest.raises(ValueError, match="shared by the heads"):
            attention_backward(g, spec, plan, (SCALE, None, 0.0, 0), (True, True, True, False,
                               False), torch.ones_like(out), rows, q, rows, None, None, out,
                               lse, **kw)
