"""``hector.kernels.segment_mm.op.segment_mm``: the torch backend against a naive float64
per-row loop, the Triton kernels against the torch backend (forward, dx, dW; every
gather/scatter/transpose combination, empty segments, segments longer than a tile, K/N off
multiples of 16, half types), random segment layouts (hypothesis), the tile map, and input
validation.

Error measure: ``max |got - want| / max |want|`` (relative to the tensor's scale, so rows that
sum to ~0 do not blow it up).  fp32: 1e-5 (the interpreter's ``tl.dot`` with
``input_precision="ieee"`` is numpy's fp32 matmul); fp16/bf16: 2e-2.
"""
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hector.kernels.segment_mm.op import segment_mm
from hector.kernels.segment_mm.spec import (PROLOGUES, GemmSchedule, GemmSpec, default_schedule,
                                           tune_configs)
from hector.kernels.segment_mm.launch import tile_map
from hector.kernels.sizes import next_pow2
from helpers import aten_ops

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TRITON_OK = DEVICE.type == "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_triton = pytest.mark.skipif(
    not TRITON_OK, reason="no CUDA and TRITON_INTERPRET is not set (tests/conftest.py sets "
                          "it unless TRITON_INTERPRET=0 was given)")
TOL = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 2e-2, torch.float64: 1e-12}
# Empty first, middle and last segments, and one (45 rows) longer than the 16-row test tile.
LENGTHS = (0, 7, 0, 45, 3, 0)
# Small tiles: several row tiles per segment; wgrad runs of 16 rows split the long segment
# (atomic merge of partial dW tiles).  WHOLE keeps every segment in one wgrad run (stores).
TILE = GemmSchedule(block_m=16, block_n=16, block_k=16, num_warps=1, num_stages=1)
# Its dW tile (32x32) and reduction step (32 rows) differ from the forward's.
WHOLE = GemmSchedule(block_m=16, block_n=16, block_k=16, num_warps=1, num_stages=1,
                     wgrad_rows=64, wgrad_block_k=32, wgrad_block_n=32, wgrad_warps=2,
                     wgrad_block_m=32)


def rel_err(got, want):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if want.numel() == 0:
        return 0.0
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def make_case(lengths=LENGTHS, k=17, n=5, gather=True, scatter=True, transpose=False,
              dtype=torch.float32, seed=0, num_x=23, num_out=11):
    gen = torch.Generator().manual_seed(seed)
    s, m = len(lengths), sum(lengths)
    seg_ptr = torch.zeros(s + 1, dtype=torch.int64)
    seg_ptr[1:] = torch.tensor(lengths).cumsum(0)
    rows = num_x if gather else m
    wshape = (s, n, k) if transpose else (s, k, n)
    case = dict(x=torch.randn(rows, k, generator=gen), weight=torch.randn(wshape, generator=gen),
                seg_ptr=seg_ptr.to(DEVICE), transpose_weight=transpose)
    case["x"] = case["x"].to(DEVICE, dtype).requires_grad_()
    case["weight"] = case["weight"].to(DEVICE, dtype).requires_grad_()
    if gather:   # int32 gather and int64 scatter: both index dtypes get exercised
        case["gather"] = torch.randint(0, rows, (m,), generator=gen, dtype=torch.int32).to(DEVICE)
    if scatter:
        case["scatter"] = torch.randint(0, num_out, (m,), generator=gen).to(DEVICE)
        case["num_out_rows"] = num_out
    return case


def naive(x, weight, seg_ptr, gather=None, scatter=None, num_out_rows=None,
          transpose_weight=False):
    """One logical row at a time, straight from the definition, in float64."""
    bounds = seg_ptr.tolist()
    n = weight.shape[1] if transpose_weight else weight.shape[2]
    ys = []
    for s in range(weight.shape[0]):
        w = weight[s].T if transpose_weight else weight[s]
        for r in range(bounds[s], bounds[s + 1]):
            ys.append(x[int(gather[r]) if gather is not None else r] @ w)
    if scatter is None:
        return torch.stack(ys) if ys else x.new_zeros(0, n)
    out = [x.new_zeros(n) for _ in range(num_out_rows)]
    for r, y in enumerate(ys):
        out[int(scatter[r])] = out[int(scatter[r])] + y
    return torch.stack(out) if out else x.new_zeros(0, n)


def run_with_grads(fn, case, dy_seed=5):
    """Output and (dx, dW) for a fixed random upstream gradient."""
    out = fn(**case)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(dy_seed))
    dy = dy.to(out.device, out.dtype)
    grads = torch.autograd.grad(out, (case["x"], case["weight"]), dy, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(t)
             for g, t in zip(grads, (case["x"], case["weight"]))]
    return out, *grads


def as_f64(case):
    out = dict(case)
    for name in ("x", "weight"):
        out[name] = case[name].detach().double().requires_grad_()
    return out


FLAGS = [(g, s, t) for g in (False, True) for s in (False, True) for t in (False, True)]


@pytest.mark.parametrize("gather,scatter,transpose", FLAGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_backend_matches_naive(gather, scatter, transpose, dtype):
    case = make_case(gather=gather, scatter=scatter, transpose=transpose, dtype=dtype)
    got = run_with_grads(lambda **c: segment_mm(**c, backend="torch"), case)
    want = run_with_grads(naive, as_f64(case))
    for name, g, w in zip(("out", "dx", "dW"), got, want):
        assert g.dtype == dtype
        assert rel_err(g, w) < TOL[dtype], name


def check_triton(case, schedule=TILE, tol=None):
    got = run_with_grads(lambda **c: segment_mm(**c, backend="triton", schedule=schedule), case)
    want = run_with_grads(lambda **c: segment_mm(**c, backend="torch"), case)
    tol = tol or TOL[case["x"].dtype]
    for name, g, w in zip(("out", "dx", "dW"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        assert rel_err(g, w) < tol, (name, rel_err(g, w))


@needs_triton
@pytest.mark.parametrize("gather,scatter,transpose", FLAGS)
@pytest.mark.parametrize("k,n", [(17, 5), (5, 17), (32, 32)])
def test_triton_matches_torch(gather, scatter, transpose, k, n):
    check_triton(make_case(k=k, n=n, gather=gather, scatter=scatter, transpose=transpose))


@needs_triton
@pytest.mark.parametrize("gather,scatter", [(False, False), (True, True)])
def test_triton_wgrad_one_run_per_segment(gather, scatter):
    # wgrad_rows=64 > every segment: the non-atomic store path of the weight gradient.
    check_triton(make_case(gather=gather, scatter=scatter), schedule=WHOLE)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gather,scatter,transpose", [(False, False, False), (True, True, True)])
def test_triton_half(dtype, gather, scatter, transpose):
    check_triton(make_case(dtype=dtype, gather=gather, scatter=scatter, transpose=transpose))


@needs_triton
@pytest.mark.parametrize("schedule", [None, "autotune"])
def test_triton_default_and_autotune_schedules(schedule):
    check_triton(make_case(k=32, n=17), schedule=schedule)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gather,scatter,transpose", [(False, False, False), (True, True, True),
                                                      (True, False, True)])
@pytest.mark.parametrize("k,n", [(40, 1), (1, 40), (19, 3), (8, 8)])
def test_triton_narrow_products(dtype, gather, scatter, transpose, k, n):
    """An fp32 output or reduction of one column (RGAT's one-head score, its dx) multiplies
    without tl.dot, on tiles that narrow; other narrow sides (per-head scores, N = heads)
    and half types run tl.dot tiles padded to 16.  Output, dx and dW against the torch
    backend, with the heuristic's tiles and the tuner's list."""
    case = make_case(k=k, n=n, gather=gather, scatter=scatter, transpose=transpose,
                     dtype=dtype)
    spec = GemmSpec(gather, scatter, transpose, dtype, k, n)
    narrow = min(k, n) == 1 and dtype == torch.float32
    assert spec.narrow == spec.grad_input_spec().narrow == narrow
    sched = default_schedule(spec)
    if narrow:      # the narrow side whole
        assert (sched.block_n if n == 1 else sched.block_k) == 1
    else:           # tl.dot: every side at least 16
        w = sched.wgrad_meta
        assert min(sched.block_n, sched.block_k, w["BLOCK_N"], w["BLOCK_K"]) >= 16
    for schedule in (None, sched, tune_configs(spec)[-1]):
        check_triton(case, schedule=schedule)


@needs_triton
def test_triton_strided_inputs_and_expanded_grad():
    """Non-contiguous x and weight (read through strides) and a stride-0 upstream gradient."""
    case = make_case(gather=True, scatter=False, k=17, n=5)
    gen = torch.Generator().manual_seed(3)
    xt = torch.randn(17, 23, generator=gen).to(DEVICE).requires_grad_()
    wt = torch.randn(6, 5, 17, generator=gen).to(DEVICE).requires_grad_()
    case.update(x=xt.T, weight=wt.transpose(1, 2))
    for backend in ("triton", "torch"):
        out = segment_mm(**case, backend=backend, schedule=TILE if backend == "triton" else None)
        grads = torch.autograd.grad(out.sum(), (xt, wt))
        if backend == "triton":
            got = (out, *grads)
    for g, w in zip(got, (out, *grads)):
        assert rel_err(g, w) < 1e-5


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("lengths", [(0, 0, 0), ()], ids=["M0", "S0"])
def test_no_rows(backend, lengths):
    case = make_case(lengths=lengths, gather=True, scatter=True)
    out, dx, dw = run_with_grads(lambda **c: segment_mm(**c, backend=backend), case)
    assert out.shape == (11, 5) and not out.any()
    assert dx.shape == case["x"].shape and not dx.any() and not dw.any()
    plain = make_case(lengths=lengths, gather=False, scatter=False)
    assert segment_mm(**plain, backend=backend).shape == (0, 5)


@needs_triton
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4),
       k=st.integers(1, 33), n=st.integers(1, 33), gather=st.booleans(),
       scatter=st.booleans(), transpose=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_triton_random_layouts(lengths, k, n, gather, scatter, transpose, seed):
    check_triton(make_case(lengths=tuple(lengths), k=k, n=n, gather=gather, scatter=scatter,
                           transpose=transpose, seed=seed), tol=2e-5)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 50), min_size=1, max_size=6),
       block=st.sampled_from([1, 16, 64]))
def test_tile_map_covers_every_row_once(lengths, block):
    bounds = (0, *torch.tensor(lengths).cumsum(0).tolist())
    tiles = tile_map(bounds, block, torch.device("cpu")).long()
    assert tiles.shape[0] == sum(-(-n // block) for n in lengths)
    covered = torch.zeros(bounds[-1], dtype=torch.long)
    for seg, lo, hi in tiles.tolist():
        assert bounds[seg] <= lo < hi <= bounds[seg + 1] and hi - lo <= block
        covered[lo:hi] += 1
    assert bool((covered == 1).all())


def test_tile_map_runs_no_torch_op_on_cpu():
    """The table is built with numpy: a new mini-batch block builds 4-10 maps per step, and
    the torch version ran ~22 aten ops each (55-135 of a block's first step)."""
    bounds = (0, 7, 7, 52, 55, 1001)      # a layout no other test uses (not cached yet)
    got, ops = aten_ops(lambda: tile_map(bounds, 16, torch.device("cpu")))
    assert sum(ops.values()) <= 2, ops      # from_numpy (lift_fresh), the no-op .to(device)
    assert got.dtype == torch.int32 and got.tolist()[:5] == [
        [0, 0, 7], [2, 7, 23], [2, 23, 39], [2, 39, 52], [3, 52, 55]]
    assert got.tolist()[-1] == [4, 999, 1001] and got.shape == (1 + 3 + 1 + 60, 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinned async copy)")
def test_tile_map_on_cuda_is_the_cpu_table_copied_without_a_sync():
    bounds = (0, 7, 7, 52, 55, 1000)      # a layout no other test uses (not cached yet)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = tile_map(bounds, 16, torch.device("cuda", torch.cuda.current_device()))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), tile_map(bounds, 16, torch.device("cpu")))


def test_specs_and_schedules():
    x = torch.randn(4, 40)
    spec = GemmSpec.of(x, x.new_zeros(0, dtype=torch.long), None, False, 24)
    back = spec.grad_input_spec()
    assert (back.K, back.N, back.has_gather, back.has_scatter, back.transpose_weight) == \
        (24, 40, False, True, True)
    assert back.grad_input_spec() == spec
    for interp in (False, True):
        sched = default_schedule(spec, interpreting=interp)
        assert sched.block_n >= 16 and sched.block_k >= 16
    assert len(set(tune_configs(spec))) == len(tune_configs(spec)) > 0
    with pytest.raises(ValueError, match="block_k"):
        GemmSchedule(block_k=12)
    with pytest.raises(ValueError, match="block_m must be a power of two >= 16"):
        GemmSchedule(block_m=8)          # the weight gradient's tl.dot reduction step
    # tiles narrower than 16 only where tl.dot is not used (fp32, min(K, N) == 1)
    with pytest.raises(ValueError, match=r"block_n=64, block_k=8 \(weight gradient 64, 8\) "
                                         "must be >= 16"):
        GemmSchedule(block_k=8).check_fits(spec)
    with pytest.raises(ValueError, match=r"\(weight gradient 4, 32\) must be >= 16"):
        GemmSchedule(wgrad_block_n=4).check_fits(spec)   # the weight gradient's tl.dot too
    narrow = GemmSpec(True, False, False, torch.float32, K=64, N=1)
    GemmSchedule(block_n=1, block_k=8).check_fits(narrow)
    assert narrow.narrow and not spec.narrow
    # per-head scores (N = 8) and half types take padded tl.dot tiles (measured faster)
    for other in (GemmSpec(True, False, False, torch.float32, K=128, N=8),
                  GemmSpec(True, False, False, torch.bfloat16, K=64, N=1)):
        assert not other.narrow and default_schedule(other).block_n == 16
        with pytest.raises(ValueError, match="fp32 and min"):
            GemmSchedule(block_n=other.N, block_k=8).check_fits(other)
    assert (default_schedule(narrow).block_n, default_schedule(narrow).block_k) == (1, 32)
    assert len(set(tune_configs(narrow))) == len(tune_configs(narrow)) > 1
    # the narrow weight gradient: [K, N] whole (N = 1 not padded), rows per step in budget
    w = default_schedule(narrow).wgrad_meta
    assert (w["BLOCK_K"], w["BLOCK_N"], w["BLOCK_M"]) == (64, 1, 128)
    with pytest.raises(ValueError, match="wgrad_block_n"):
        GemmSchedule(wgrad_block_n=24)
    with pytest.raises(ValueError, match="wgrad_warps"):
        GemmSchedule(wgrad_warps=3)
    assert GemmSchedule(block_k=32).wgrad_meta["BLOCK_K"] == 32
    with pytest.raises(ValueError, match="wgrad_rows"):
        GemmSchedule(block_m=32, wgrad_rows=48)
    with pytest.raises(ValueError, match="block_m=64"):      # the weight gradient's step
        GemmSchedule(block_m=16, wgrad_block_m=64, wgrad_rows=32)
    with pytest.raises(ValueError, match="wgrad_block_m"):
        GemmSchedule(wgrad_block_m=24)
    # FMA-bound (fp32, ieee) dW tiles of 64 x 64 or less: 32-row steps on 4 warps; wider
    # ones keep the forward's 64 rows on 8 warps
    small = GemmSpec(True, False, False, torch.float32, K=64, N=64, input_precision="ieee")
    wide = GemmSpec(True, False, False, torch.float32, K=64, N=128, input_precision="ieee")
    meta = [default_schedule(sp).wgrad_meta for sp in (small, wide)]
    assert [(m["BLOCK_M"], m["num_warps"]) for m in meta] == [(32, 4), (64, 8)]


def _bad(**change):
    case = make_case()
    # Bad index tensors live where the case does (on CUDA too), so each case trips the check
    # it is about rather than the device check, which test_bad_devices_and_backends covers.
    for name in ("gather", "scatter"):
        t = change.get(name)
        if isinstance(t, torch.Tensor) and t.device.type != "meta":   # meta: the device tests
            change[name] = t.to(case["x"].device)
    case.update(change)
    return case


BAD = [
    (dict(x=[1.0]), TypeError, "x must be a torch.Tensor"),
    (dict(x=torch.zeros(23, 17, dtype=torch.int64)), TypeError, "x must be a floating"),
    (dict(x=torch.zeros(23, 17, 1)), ValueError, r"x must have shape \[rows, K\]"),
    (dict(weight=torch.zeros(6, 17, 5, dtype=torch.float64)), TypeError, "weight has dtype"),
    (dict(weight=torch.zeros(6, 16, 5)), ValueError, "weight must have shape"),
    (dict(weight=torch.zeros(6, 17, 5), transpose_weight=True), ValueError,
     r"weight must have shape \[S, N, K\]"),
    (dict(transpose_weight=1), TypeError, "transpose_weight must be a bool"),
    (dict(seg_ptr=torch.tensor([0, 60.0])), TypeError, "seg_ptr must have an integer dtype"),
    (dict(seg_ptr=torch.tensor([0, 1, 2], dtype=torch.int16)), TypeError, "seg_ptr must be int32"),
    (dict(seg_ptr=torch.tensor([0, 60])), ValueError, "seg_ptr must have S [+] 1 = 7"),
    (dict(seg_ptr=torch.tensor([1, 7, 7, 52, 55, 55, 55])), ValueError, r"seg_ptr\[0\] must be 0"),
    (dict(seg_ptr=torch.tensor([0, 7, 5, 52, 55, 55, 55])), ValueError, "non-decreasing"),
    (dict(seg_ptr=torch.tensor([0, 7, 7, 52, 55, 55, 56])), ValueError,
     r"gather has 55 entries but seg_ptr\[-1\] = 56"),
    (dict(gather=torch.zeros(55)), TypeError, "gather must have an integer dtype"),
    (dict(gather=torch.zeros(55, dtype=torch.uint8)), TypeError, "gather must be int32 or int64"),
    (dict(gather=torch.zeros(54, dtype=torch.long)), ValueError, "gather has 54 entries"),
    (dict(gather=torch.zeros(55, 1, dtype=torch.long)), ValueError, "gather must have 1 dim"),
    (dict(gather=None), ValueError, r"without gather, x must have seg_ptr\[-1\] = 55 rows"),
    (dict(scatter=torch.zeros(56, dtype=torch.long)), ValueError, "scatter has 56 entries"),
    (dict(scatter=torch.zeros(55, dtype=torch.float32)), TypeError, "scatter must have an integer"),
    (dict(num_out_rows=None), ValueError, "num_out_rows is required with scatter"),
    (dict(num_out_rows=-1), ValueError, "num_out_rows must be >= 0"),
    (dict(num_out_rows=2.0), TypeError, "num_out_rows must be an int"),
    (dict(scatter=None, num_out_rows=3), ValueError, "num_out_rows=3 without scatter"),
    (dict(scatter_unique=True), ValueError, "scatter must be a permutation of the seg_ptr"),
    (dict(gather_unique=True), ValueError, "gather must be a permutation of the seg_ptr"),
    (dict(gather_unique=1), TypeError, "gather_unique must be a bool"),
    (dict(backend="cuda"), ValueError, "backend must be one of"),
    (dict(schedule="fast"), TypeError, "schedule must be None"),
]


@pytest.mark.parametrize("change,exc,match", BAD, ids=[b[2][:40] for b in BAD])
def test_bad_input_names_the_argument(change, exc, match):
    with pytest.raises(exc, match=match):
        segment_mm(**_bad(**change))


def test_bad_devices_and_backends():
    meta = torch.zeros(6, 17, 5, device="meta")
    with pytest.raises(ValueError, match="weight is on meta but x is on"):
        segment_mm(**_bad(weight=meta))
    with pytest.raises(ValueError, match="gather is on meta"):
        segment_mm(**_bad(gather=torch.zeros(55, dtype=torch.long, device="meta")))
    with pytest.raises(TypeError, match="backend='triton' supports"):
        case = make_case(dtype=torch.float64)
        if not TRITON_OK:
            pytest.skip("Triton path unavailable")
        segment_mm(**case, backend="triton")


def _permuted_case(transpose, dtype=torch.float32, lengths=LENGTHS):
    """Gather and scatter both permutations of the M rows (a node-type GEMM's node_perm)."""
    m = sum(lengths)
    case = make_case(lengths=lengths, gather=True, scatter=True, transpose=transpose,
                     dtype=dtype, num_x=m, num_out=m)
    gen = torch.Generator().manual_seed(3)
    case["gather"] = torch.randperm(m, generator=gen).to(DEVICE, torch.int32)
    case["scatter"] = torch.randperm(m, generator=gen).to(DEVICE)
    return case


@needs_triton
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_permutations_are_stored_not_summed(monkeypatch, transpose, dtype):
    """``gather_unique`` / ``scatter_unique``: output rows stored through the permutation (no
    zeroed buffer: the output is allocated uninitialised, no atomics) and dx likewise, equal
    to the summing path's result; ``HECTOR_DEBUG=1`` rejects an index that repeats a row."""
    case = _permuted_case(transpose, dtype)
    zeros = []
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: zeros.append(a) or real_zeros(*a, **k))
    check_triton(dict(case, gather_unique=True, scatter_unique=True), tol=TOL[dtype])
    m = case["x"].shape[0]
    assert not [a for a in zeros if a and a[0] == m], "a row buffer was zero-filled"
    monkeypatch.setattr(torch, "zeros", real_zeros)
    monkeypatch.setenv("HECTOR_DEBUG", "1")
    bad = dict(case, scatter=case["scatter"].clone(), scatter_unique=True)
    bad["scatter"][0] = bad["scatter"][1]
    with pytest.raises(ValueError, match="scatter_unique=True but scatter repeats a row"):
        segment_mm(**bad)


@needs_triton
@pytest.mark.parametrize("unique", [(True, True), (False, True), (True, False)])
def test_triton_permutation_flags_on_the_custom_op(unique):
    """The unpinned call (the ``hector::segment_mm`` custom op and its backward op) with each
    combination of the two flags gives the summing path's output and gradients."""
    case = _permuted_case(False)
    got = run_with_grads(lambda **c: segment_mm(**c, backend="triton", gather_unique=unique[0],
                                                scatter_unique=unique[1]), case)
    want = run_with_grads(lambda **c: segment_mm(**c, backend="torch"), case)
    for name, g, w in zip(("out", "dx", "dW"), got, want):
        assert rel_err(g, w) < TOL[torch.float32], name


def _with_bias_grads(fn, case, bias, dy_seed=5):
    out = fn(**case, bias=bias)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(dy_seed))
    return (out,) + torch.autograd.grad(out, (case["x"], case["weight"], bias),
                                        dy.to(out.device, out.dtype))


@pytest.mark.parametrize("backend,pinned", [("torch", False),
                                            pytest.param("triton", False, marks=needs_triton),
                                            pytest.param("triton", True, marks=needs_triton)])
@pytest.mark.parametrize("gather,scatter,transpose", [(False, False, False), (True, True, True),
                                                      (True, False, False)])
def test_bias_epilogue(backend, gather, scatter, transpose, pinned):
    """``bias [S, N]``: each logical row of segment s gets b_s before the scatter; output and
    the gradients of x, W and b against a float64 loop (empty segments get no rows, so their
    bias gradient is 0), through the custom op and the pinned-schedule path alike."""
    case = make_case(gather=gather, scatter=scatter, transpose=transpose)
    s, n = case["weight"].shape[0], (case["weight"].shape[1] if transpose
                                     else case["weight"].shape[2])
    bias = torch.randn(s, n, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    bias.requires_grad_()
    got = _with_bias_grads(lambda **c: segment_mm(**c, backend=backend,
                                                  schedule=TILE if pinned else None), case, bias)
    c64 = as_f64(case)
    b64 = bias.detach().double().requires_grad_()

    def with_bias(bias=None, **c):
        ptr = c["seg_ptr"].tolist()
        seg = torch.repeat_interleave(torch.arange(s), torch.tensor(ptr).diff()).to(DEVICE)
        plain = dict(c, scatter=None, num_out_rows=None)
        y = naive(**plain) + bias.index_select(0, seg)
        if c.get("scatter") is None:
            return y
        return y.new_zeros(c["num_out_rows"], n).index_add(0, c["scatter"], y)
    want = _with_bias_grads(with_bias, c64, b64)
    for name, g, w in zip(("out", "dx", "dW", "db"), got, want):
        assert rel_err(g, w) < TOL[torch.float32], (name, rel_err(g, w))
    assert torch.all(got[3][[i for i, length in enumerate(LENGTHS) if length == 0]] == 0)


def test_bias_shape_is_checked():
    case = make_case()
    with pytest.raises(ValueError, match=r"bias must have shape \[S, N\] = \[6, 5\]"):
        segment_mm(**case, bias=torch.zeros(6, 4, device=DEVICE))
    with pytest.raises(TypeError, match="bias has dtype"):
        segment_mm(**case, bias=torch.zeros(6, 5, dtype=torch.float64, device=DEVICE))


def test_debug_mode_checks_index_ranges(monkeypatch):
    monkeypatch.setenv("HECTOR_DEBUG", "1")
    with pytest.raises(ValueError, match="gather contains id 23, out of range for x.shape"):
        segment_mm(**_bad(gather=torch.full((55,), 23, device=DEVICE)), backend="torch")
    with pytest.raises(ValueError, match="scatter contains a negative id"):
        segment_mm(**_bad(scatter=torch.full((55,), -1, device=DEVICE)), backend="torch")


@pytest.mark.parametrize("backend,pinned", [("torch", False),
                                            pytest.param("triton", False, marks=needs_triton),
                                            pytest.param("triton", True, marks=needs_triton)])
@pytest.mark.parametrize("prologue", sorted(PROLOGUES))
@pytest.mark.parametrize("gather,scatter,transpose,k,n", [(False, False, False, 17, 5),
                                                          (True, True, True, 17, 5),
                                                          (True, False, False, 3, 20)])
def test_prologue(backend, pinned, prologue, gather, scatter, transpose, k, n):
    """``prologue=f``: the product of ``f(x)`` (each loaded tile transformed; padded columns
    meet zero weight rows even where ``f(0) != 0``), and the gradients ``dx = (dy W^T)
    f'(x)`` and ``dW`` of ``f(x)``, against the float64 loop on ``f(x)`` -- through the
    custom op, the pinned path and a narrow reduction (k = 3)."""
    case = make_case(gather=gather, scatter=scatter, transpose=transpose, k=k, n=n)
    got = run_with_grads(lambda **c: segment_mm(**c, backend=backend, prologue=prologue,
                                                schedule=TILE if pinned else None), case)
    f = PROLOGUES[prologue][0]
    want = run_with_grads(lambda x, **c: naive(f(x), **c), as_f64(case))
    for name, g, w in zip(("out", "dx", "dW"), got, want):
        assert rel_err(g, w) < 1e-5, (name, rel_err(g, w))


@needs_triton
@pytest.mark.parametrize("sums", [False, True])
def test_wgrad_ops_apply_the_prologue(sums):
    """The compiler's weight-gradient ops with ``prologue``: ``dW`` of ``f(x)`` (and the dy
    sums unchanged), equal to the ops on a transformed copy of x."""
    from hector.kernels.segment_mm.custom_ops import segment_mm_wgrad_op, segment_mm_wgrad_sums_op
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(30, 12, generator=gen).to(DEVICE)
    dy = torch.randn(50, 20, generator=gen).to(DEVICE)
    gather = torch.randint(0, 30, (50,), generator=gen).to(DEVICE)
    bounds = [0, 20, 20, 50]
    op = segment_mm_wgrad_sums_op if sums else segment_mm_wgrad_op
    got = op(x, dy, gather, None, bounds, "gelu")
    want = op(torch.nn.functional.gelu(x), dy, gather, None, bounds)
    for g, w in zip(got if sums else [got], want if sums else [want]):
        assert rel_err(g, w) < 1e-5


def test_prologue_names_are_checked_and_registered():
    from hector.compiler.lower_gemm import PROLOGUE_OPS
    from hector.kernels import registry
    case = make_case()
    with pytest.raises(ValueError, match="prologue must be None or one of"):
        segment_mm(**case, prologue="softplus")
    assert set(registry.KERNELS["segment_mm"].params["prologue"]) == set(PROLOGUES) | {""}
    assert set(PROLOGUE_OPS) == set(PROLOGUES)      # the compiler's IR op names


def test_prologue_in_float64_is_exact_on_the_torch_backend():
    """The reference computes f in x's own precision when it is wider than fp32."""
    case = as_f64(make_case(gather=True, scatter=False))
    got = segment_mm(**case, backend="torch", prologue="gelu")
    want = naive(torch.nn.functional.gelu(case["x"]), **{k: v for k, v in case.items()
                                                         if k != "x"})
    assert rel_err(got, want) < 1e-12


def test_tune_configs_keep_the_heuristics_weight_gradient_tiles():
    spec = GemmSpec(True, False, False, torch.float32, K=64, N=64, input_precision="ieee")
    want = default_schedule(spec).wgrad_meta
    for cfg in tune_configs(spec):
        got = cfg.wgrad_meta
        assert (got["BLOCK_M"], got["BLOCK_N"], got["BLOCK_K"], got["num_warps"]) == \
            (want["BLOCK_M"], want["BLOCK_N"], want["BLOCK_K"], want["num_warps"])
