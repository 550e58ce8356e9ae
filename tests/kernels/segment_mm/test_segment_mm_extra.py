"""``segment_mm(..., extra_weight=V)``: the GEMM's extra product (each fp32 output row times a
shared ``[N, E]`` weight in the epilogue, returned beside the output).  The Triton kernels
against the torch backend and against a float64 product, output and every gradient (x,
weight, V), for plain, gathered and permuted rows, fp32 and bf16, one to twenty extra
columns, N up to the 128 the compiler gives it; the schedule's whole-row tile; the custom
op through ``opcheck``; input validation.  Error measure as in test_segment_mm.py."""
import pytest
import torch

from hector.kernels.segment_mm import custom_ops, launch
from hector.kernels.segment_mm.op import segment_mm
from hector.kernels.segment_mm.spec import GemmSchedule, GemmSpec, default_schedule, tune_configs

from test_segment_mm import DEVICE, TILE, TOL, needs_triton, rel_err

BOUNDS = [0, 7, 7, 30, 36]        # an empty segment, one longer than the 16-row test tile
ROWS = 36


def _inputs(dtype, k, n, e, seed=0):
    gen = torch.Generator().manual_seed(seed)
    S = len(BOUNDS) - 1

    def t(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype).requires_grad_()
    return t(ROWS, k), t(S, k, n), t(n, e)


def _layout(name):
    gen = torch.Generator().manual_seed(1)
    if name == "gathered":       # rows read many times and some never
        return dict(gather=torch.randint(0, ROWS, (ROWS,), generator=gen).to(DEVICE))
    if name == "permuted":
        return dict(gather=torch.randperm(ROWS, generator=gen).to(DEVICE), gather_unique=True)
    return {}


@needs_triton
@pytest.mark.parametrize("layout", ["plain", "gathered", "permuted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k, n, e", [(19, 24, 8), (16, 32, 1), (8, 16, 20), (12, 128, 3),
                                     (12, 48, 6)])     # N not a power of two, over a tile
def test_extra_product_matches_the_torch_backend(layout, dtype, k, n, e):
    x, w, v = _inputs(dtype, k, n, e)
    kw = _layout(layout)
    y, p = segment_mm(x, w, BOUNDS, extra_weight=v, backend="triton", **kw)
    y_ref, p_ref = segment_mm(x, w, BOUNDS, extra_weight=v, backend="torch", **kw)
    assert y.shape == (ROWS, n) and p.shape == (ROWS, e) and y.dtype == p.dtype == dtype
    tol = TOL[dtype]
    assert rel_err(y, y_ref) < tol and rel_err(p, p_ref) < tol
    dy, dp = torch.randn_like(y), torch.randn_like(p)
    got = torch.autograd.grad((y, p), (x, w, v), (dy, dp))
    want = torch.autograd.grad((y_ref, p_ref), (x, w, v), (dy, dp))
    for name, g, r in zip(("x", "weight", "extra_weight"), got, want):
        assert g.dtype == r.dtype, name
        assert rel_err(g, r) < tol * 5, name


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["plain", "gathered"])
def test_extra_product_reads_a_transposed_weight(layout, dtype):
    """A weight stored ``[S, N, K]`` (``transpose_weight``, PyG's ``nn.Linear`` layout) gives
    what its ``[S, K, N]`` copy gives, output, extra product and every gradient, the
    weight's in its own layout."""
    x, w, v = _inputs(dtype, 19, 24, 5)
    wt = w.detach().transpose(1, 2).contiguous().requires_grad_()
    kw = _layout(layout)
    y, p = segment_mm(x, wt, BOUNDS, extra_weight=v, transpose_weight=True, backend="triton",
                      **kw)
    y_ref, p_ref = segment_mm(x, w, BOUNDS, extra_weight=v, backend="torch", **kw)
    tol = TOL[dtype]
    assert rel_err(y, y_ref) < tol and rel_err(p, p_ref) < tol
    dy, dp = torch.randn_like(y), torch.randn_like(p)
    gx, gw, gv = torch.autograd.grad((y, p), (x, wt, v), (dy, dp))
    rx, rw, rv = torch.autograd.grad((y_ref, p_ref), (x, w, v), (dy, dp))
    assert gw.shape == wt.shape
    for g, r in ((gx, rx), (gw, rw.transpose(1, 2)), (gv, rv)):
        assert rel_err(g, r) < tol * 5


@needs_triton
def test_only_the_extra_output_needs_a_gradient():
    x, w, v = _inputs(torch.float32, 19, 24, 5)
    y, p = segment_mm(x, w, BOUNDS, extra_weight=v, backend="triton")
    y_ref, p_ref = segment_mm(x, w, BOUNDS, extra_weight=v, backend="torch")
    got = torch.autograd.grad(p.sum(), (x, w, v))
    want = torch.autograd.grad(p_ref.sum(), (x, w, v))
    for g, r in zip(got, want):
        assert rel_err(g, r) < TOL[torch.float32] * 5


def test_torch_backend_is_the_float64_product():
    x, w, v = _inputs(torch.float64, 5, 6, 2)
    y, p = segment_mm(x, w, BOUNDS, extra_weight=v, backend="torch")
    plain = segment_mm(x, w, BOUNDS, backend="torch")
    assert torch.equal(y, plain)
    assert torch.allclose(p, plain @ v, atol=1e-12)


def test_schedules_span_the_whole_row():
    spec = GemmSpec(has_gather=True, has_scatter=False, transpose_weight=False,
                    dtype=torch.float32, K=128, N=128, extra_cols=8)
    for sched in (default_schedule(spec), *tune_configs(spec)):
        assert sched.block_n >= 128
        sched.check_fits(spec)
    assert default_schedule(spec).num_warps == 8     # a 64 x 128 fp32 tile
    # The tuner also tries fewer rows on 4 warps (the row sums' registers).
    assert any((c.block_m, c.block_n, c.num_warps) == (32, 128, 4) for c in tune_configs(spec))
    with pytest.raises(ValueError, match="block_n=64 must be >= N=128"):
        GemmSchedule(block_n=64).check_fits(spec)
    # Without the extra product the fp32 heuristic keeps its 64-wide tiles.
    assert default_schedule(GemmSpec(has_gather=True, has_scatter=False, transpose_weight=False,
                                     dtype=torch.float32, K=128, N=128)).block_n == 64


@pytest.mark.parametrize("change", [dict(has_scatter=True), dict(has_bias=True), dict(N=1),
                                    dict(extra_cols=129), dict(extra_cols=-1)])
def test_spec_refuses_what_the_epilogue_cannot_do(change):
    kw = dict(has_gather=False, has_scatter=False, transpose_weight=False,
              dtype=torch.float32, K=8, N=16, extra_cols=4)
    with pytest.raises(ValueError, match="extra"):
        GemmSpec(**dict(kw, **change))


@needs_triton
def test_op_passes_opcheck():
    x, w, v = _inputs(torch.float32, 19, 24, 5)
    g = _layout("gathered")["gather"]
    torch.library.opcheck(custom_ops.segment_mm_extra_op, (x, w, g, BOUNDS, v, False))
    wt = w.detach().transpose(1, 2).contiguous().requires_grad_()
    torch.library.opcheck(custom_ops.segment_mm_extra_op, (x, wt, g, BOUNDS, v, False, None,
                                                           True))


BAD = [
    (dict(extra_weight=torch.zeros(23, 4)), ValueError, r"extra_weight must be \[N, E\]"),
    (dict(extra_weight=torch.zeros(24, 4, dtype=torch.float64)), TypeError, "x's dtype"),
    (dict(extra_weight=[1.0]), TypeError, "extra_weight must be a torch.Tensor"),
    (dict(extra_weight=torch.zeros(24, 4), bias=torch.zeros(4, 24)), ValueError, "no scatter"),
    (dict(extra_weight=torch.zeros(24, 4), prologue="relu"), ValueError, "no scatter"),
    (dict(extra_weight=torch.zeros(24, 4), scatter=torch.zeros(ROWS, dtype=torch.int64),
          num_out_rows=2), ValueError, "no scatter"),
]


@pytest.mark.parametrize("kw,exc,match", BAD,
                         ids=["shape", "dtype", "type", "bias", "prologue", "scatter"])
def test_bad_extra_weight_names_the_argument(kw, exc, match):
    x, w, _ = _inputs(torch.float32, 19, 24, 4)
    kw = {k: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for k, t in kw.items()}
    with pytest.raises(exc, match=match):
        segment_mm(x.detach(), w.detach(), BOUNDS, backend="torch", **kw)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_narrow_fp32_product_is_refused_on_every_backend(backend):
    """K = 1 in fp32 runs on the narrow kernel (no epilogue product): refused by the op's
    checks, the same way on both backends, naming the argument."""
    x, w, v = (t.detach() for t in _inputs(torch.float32, 1, 24, 2))
    with pytest.raises(ValueError, match=r"extra_weight needs min\(K, N\) > 1.*K = 1"):
        segment_mm(x, w, BOUNDS, extra_weight=v, backend=backend)
    y, p = segment_mm(x.bfloat16(), w.bfloat16(), BOUNDS, extra_weight=v.bfloat16(),
                      backend="torch")                  # (half types: tl.dot, so allowed)
    assert p.shape == (ROWS, 2)


@needs_triton
def test_a_pinned_schedule_is_refused_with_extra_weight():
    x, w, v = _inputs(torch.float32, 19, 24, 4)
    with pytest.raises(ValueError, match="pinned"):
        segment_mm(x, w, BOUNDS, extra_weight=v, backend="triton", schedule=TILE)


@needs_triton
@pytest.mark.parametrize("k, n, e", [(64, 64, 1), (128, 128, 8)])
def test_every_tuner_config_gives_the_same_product(k, n, e):
    """The autotuner may pick any config of the list (the 4-warp tiles added for the extra
    product among them): each one's output and extra product equal the torch backend's."""
    x, w, v = (t.detach() for t in _inputs(torch.float32, k, n, e))
    g = _layout("gathered")["gather"]
    y_ref, p_ref = segment_mm(x, w, BOUNDS, gather=g, extra_weight=v, backend="torch")
    spec = GemmSpec.of(x, g, None, False, n, extra_cols=e)
    configs = tune_configs(spec)
    assert len(configs) >= 3
    for cfg in configs:
        y, p = launch.launch_gemm(spec, cfg, tuple(BOUNDS), x, w, g, None, ROWS,
                                  extra_weight=v)
        assert rel_err(y, y_ref) < TOL[torch.float32], cfg
        assert rel_err(p, p_ref) < TOL[torch.float32], cfg
