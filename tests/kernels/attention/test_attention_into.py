"""The attention backward writing dk and dv over k and v (``into_kv``).

A compiled backward reads the forward's k and v for the last time in the attention backward,
so ``hector::edge_attention_backward_into`` writes their gradients into their own rows
instead of a second buffer of their size.  Checked against the same kernels writing fresh
buffers, on both schedules (the edge-parallel one cuts rows across programs and skips source
rows without out-edges, whose gradient must come out exactly 0), with k and v as column
slices of one joint buffer and as separate tensors; the autotune trials put the overwritten
rows back before each run; inputs that cannot be written in place are refused."""
import os
import sys
from pathlib import Path

import pytest
import torch

from hector.kernels import autotune
from hector.kernels.attention import custom_ops
from hector.kernels.attention.custom_ops import edge_attention_grads_triton
from hector.kernels.attention.launch import overlap
from hector.kernels.attention.plan import AttentionPlan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_attention_strided import (DIMS, N, NO_OUT, ROLES, SCALE, SLOPE, forward,  # noqa: E402
                                    inputs, make_graph, plan_for)
from test_edge_attention import DEVICE  # noqa: E402

pytestmark = pytest.mark.skipif(
    DEVICE.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="no CUDA and TRITON_INTERPRET is not set")


def _case(strategy, dk, dv, dtype=torch.float32, joint=True):
    g, heads = make_graph(), 2
    t, dense, kv = inputs(heads, dk, dv, dtype)
    if not joint:
        t = dict(dense)
    spec, plan = plan_for(g, t, strategy, heads, dk, dv)
    out, lse = forward(g, dense, spec, plan)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out)
    return g, t, dense, kv, spec, plan, out, lse, dout


@pytest.mark.parametrize("strategy", ["node", "edge"])
@pytest.mark.parametrize("dk,dv", DIMS)
@pytest.mark.parametrize("joint", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_written_over_k_and_v_equal_fresh_ones(strategy, dk, dv, joint, dtype):
    g, t, dense, kv, spec, plan, out, lse, dout = _case(strategy, dk, dv, dtype, joint)
    needs = [True] * 5
    want = edge_attention_grads_triton(g, spec, plan, needs, dout, *(dense[r] for r in ROLES),
                                       out, lse, SCALE, SLOPE, joint_kv=joint)
    k, v = t["k"], t["v"]
    k_ptr, v_ptr = k.data_ptr(), v.data_ptr()
    got = edge_attention_grads_triton(g, spec, plan, needs, dout, *(t[r] for r in ROLES),
                                      out, lse, SCALE, SLOPE, joint_kv=joint, into_kv=True)
    for i in (1, 3, 4):
        assert torch.equal(got[i], want[i]), ROLES[i]
    if joint:      # the joint gradient is the buffer k and v were slices of
        assert got[0].numel() == 0 and got[2] is kv
        assert torch.equal(got[2], want[2])
    else:          # the gradients are k and v themselves
        assert got[2].data_ptr() == k_ptr and got[0].data_ptr() == v_ptr
        assert torch.equal(got[2], want[2]) and torch.equal(got[0], want[0])
    assert torch.equal(k, (want[2][:, :k[0].numel()] if joint else want[2]).view(k.shape))
    for i in NO_OUT:   # source rows without out-edges: exactly 0, not the old k and v
        assert (k[i] == 0).all() and (v[i] == 0).all()


@pytest.mark.parametrize("needs", [[True, False, False, True, True],
                                   [False, True, True, False, False]])
def test_only_the_asked_gradient_is_written(needs):
    """dv alone (v written, k untouched) or dk alone (k written, v untouched)."""
    g, t, dense, kv, spec, plan, out, lse, dout = _case("edge", 8, 8, joint=False)
    want = edge_attention_grads_triton(g, spec, plan, needs, dout, *(dense[r] for r in ROLES),
                                       out, lse, SCALE, SLOPE)
    before = {r: t[r].clone() for r in ("k", "v")}
    got = edge_attention_grads_triton(g, spec, plan, needs, dout, *(t[r] for r in ROLES),
                                      out, lse, SCALE, SLOPE, into_kv=True)
    for i, name in enumerate(ROLES):
        if needs[i]:
            assert torch.equal(got[i], want[i]), name
        else:
            assert got[i].numel() == 0, name
    for name, i in (("v", 0), ("k", 2)):
        assert torch.equal(t[name], want[i] if needs[i] else before[name]), name


def test_autotune_trials_restore_the_overwritten_rows(monkeypatch, tmp_path):
    """Each trial of a tuned launch reads the original k and v: with three configs timed
    (a fake timer, one run each), the result still equals the untuned kernels'."""
    monkeypatch.setenv("HECTOR_CACHE_DIR", str(tmp_path))
    g, t, dense, kv, spec, plan, out, lse, dout = _case("edge", 8, 8, joint=False)
    needs = [True] * 5
    want = edge_attention_grads_triton(g, spec, plan, needs, dout, *(dense[r] for r in ROLES),
                                       out, lse, SCALE, SLOPE)
    runs = []

    def timer(fn):
        fn()
        runs.append(1)
        return float(len(runs))
    monkeypatch.setattr(autotune, "enabled", lambda device: True)
    monkeypatch.setattr(autotune, "_timer", timer)
    autotune.clear_memo()
    tuned = AttentionPlan(plan.dst, plan.src, tune=True)
    try:
        got = edge_attention_grads_triton(g, spec, tuned, needs, dout, *(t[r] for r in ROLES),
                                          out, lse, SCALE, SLOPE, into_kv=True)
    finally:
        autotune.clear_memo()
    assert len(runs) >= 2 * 2        # both kernels tuned over more than one config
    for i, name in enumerate(ROLES):
        torch.testing.assert_close(got[i], want[i], rtol=1e-5, atol=1e-5, msg=name)


def test_refuses_what_cannot_be_written_in_place():
    g, t, dense, kv, spec, plan, out, lse, dout = _case("node", 8, 8)
    needs = [True] * 5
    args = dict(t)
    args["k"] = kv[:, :16].view(-1, 2, 8)
    args["v"] = kv[:, 8:24].view(-1, 2, 8)      # half of k's columns
    with pytest.raises(ValueError, match="overlap"):
        edge_attention_grads_triton(g, spec, plan, needs, dout, *(args[r] for r in ROLES),
                                    out, lse, SCALE, SLOPE, into_kv=True)
    args = dict(dense)
    args["v"] = torch.randn(dense["v"].shape[0], 8, 2).to(DEVICE).transpose(1, 2)
    with pytest.raises(ValueError, match="dense heads and columns"):
        edge_attention_grads_triton(g, spec, plan, needs, dout, *(args[r] for r in ROLES),
                                    out, lse, SCALE, SLOPE, into_kv=True)


def test_overlap():
    buf = torch.randn(5, 12)
    k, v = buf[:, :4].view(5, 2, 2), buf[:, 4:12].view(5, 2, 4)
    assert not overlap(k, v) and not overlap(v, k)
    assert overlap(buf[:, :6].view(5, 3, 2), buf[:, 4:12].view(5, 2, 4))
    assert overlap(k, k)
    assert not overlap(buf[:2], buf[2:])                 # disjoint rows
    assert overlap(buf[:, :4], buf[1:, 4:8])             # different rows, shared span
    assert not overlap(torch.randn(5, 4), torch.randn(5, 4))
    assert not overlap(buf[:0], buf)


def test_into_op_fake_shapes_and_opcheck():
    """``hector::edge_attention_backward_into`` returns [dq, d a_src, d a_dst] (its fake
    implementation gives the real shapes) and declares that it writes v and k: opcheck's
    schema check (mutations declared, outputs alias nothing) and fake-tensor check pass."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    g, t, dense, kv, spec, plan, out, lse, dout = _case("edge", 4, 8)
    args = (custom_ops.graph_handle(g), dout, *(t[r] for r in ROLES), out, lse, SCALE, SLOPE,
            custom_ops.launch_handle(g, spec, plan), [True] * 5)
    real = custom_ops.edge_attention_backward_into_op(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = custom_ops.edge_attention_backward_into_op(
            *(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    assert [tuple(f.shape) for f in fake] == [tuple(r.shape) for r in real]
    assert [f.dtype for f in fake] == [r.dtype for r in real]
    buf = kv.clone()         # (the real call above wrote its gradients over k and v)
    k, v = buf[:, :8].view(N, 2, 4), buf[:, 8:].view(N, 2, 8)
    args = args[:2] + (v, t["q"], k) + args[5:]
    torch.library.opcheck(custom_ops.edge_attention_backward_into_op, args,
                          test_utils=("test_schema", "test_faketensor"))
