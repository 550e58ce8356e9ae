"""``segment_mm(..., capacity=C)``: segment bounds kept on the device (a mini-batch's
per-relation row counts, replayed from one CUDA graph).  The device-built tile map equals the
host one on its live tiles and ends in empty tiles; outputs and every gradient (x, weight,
bias, extra weight) equal the same call on the real rows alone, on both backends, with the
rows past ``seg_ptr[-1]`` zero, whatever lies in the index arrays' padding; the Triton path
reads nothing back to the host; input validation."""
import sys
from pathlib import Path

import pytest
import torch

from hector.kernels.segment_mm import launch
from hector.kernels.segment_mm.bounds import DeviceBounds, device_tile_map
from hector.kernels.segment_mm.op import segment_mm

from test_segment_mm import DEVICE, TOL, needs_triton, rel_err

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # tests/helpers.py
from helpers import host_reads  # noqa: E402

CAP = 48
#: (real bounds, capacity): empty segments, one longer than a 16-row tile, all empty, full
CASES = [([0, 7, 7, 30, 36], CAP), ([0, 0, 0, 0, 0], CAP), ([0, 12, 20, 44, 48], CAP),
         ([0, 3, 3, 3, 19], CAP)]


@pytest.mark.parametrize("bounds, cap", CASES)
@pytest.mark.parametrize("block", [1, 4, 16, 64])
def test_device_tile_map_is_the_host_map_then_empty_tiles(bounds, cap, block):
    got = device_tile_map(DeviceBounds(torch.tensor(bounds), cap), block)
    want = launch.tile_map(tuple(bounds), block, torch.device("cpu")).long()
    assert got.shape == (-(-cap // block) + len(bounds) - 1, 3)
    assert torch.equal(got[:len(want)], want)
    assert not got[len(want):].any()


def _inputs(bounds, dtype, k=12, n=20, seed=0, layout="gathered"):
    """x, weight, bias, gather/scatter kwargs: the index arrays' padding (past the real rows)
    points at rows the real ones never read, so reading it would show."""
    gen = torch.Generator().manual_seed(seed)
    m, s = bounds[-1], len(bounds) - 1

    def t(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype).requires_grad_()
    x, w, b = t(CAP, k), t(s, k, n), t(s, n)
    kw = {}
    if layout in ("gathered", "scattered"):
        real = torch.randint(0, CAP // 2, (m,), generator=gen)
        pad = torch.full((CAP - m,), CAP - 1)
        kw["gather"] = torch.cat([real, pad]).to(DEVICE)
    if layout == "scattered":
        real = torch.randint(0, 10, (m,), generator=gen)
        kw["scatter"] = torch.cat([real, torch.full((CAP - m,), 10)]).to(DEVICE)
        kw["num_out_rows"] = 11
    return x, w, b, kw


def _real(kw, m):
    return {k: (v[:m] if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("layout", ["plain", "gathered", "scattered"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_capacity_call_equals_the_real_rows_alone(backend, layout, case, dtype):
    bounds, cap = CASES[case]
    m = bounds[-1]
    x, w, b, kw = _inputs(bounds, dtype, layout=layout)
    ptr = torch.tensor(bounds, device=DEVICE)
    y = segment_mm(x, w, ptr, capacity=cap, bias=b, backend=backend, **kw)
    xr = x if "gather" in kw else x[:m]
    want = segment_mm(xr, w, bounds, bias=b, backend="torch", **_real(kw, m))
    rows = kw.get("num_out_rows", cap)
    assert y.shape == (rows, w.shape[2]) and y.dtype == dtype
    tol = TOL[dtype]
    assert rel_err(y[:want.shape[0]], want) < tol
    if "scatter" not in kw:
        assert not y[m:].any(), "rows past seg_ptr[-1] must be zero"
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, w, b), dy)
    ref = torch.autograd.grad(want, (x, w, b), dy[:want.shape[0]])
    for name, g, r in zip(("x", "weight", "bias"), got, ref):
        if name == "x" and "gather" not in kw:
            assert not g[m:].any(), "x rows past the real ones get no gradient"
        assert rel_err(g, r) < tol * 5, name


@needs_triton
def test_extra_product_within_capacity():
    bounds = CASES[0][0]
    m = bounds[-1]
    x, w, _, kw = _inputs(bounds, torch.float32, k=16, n=24)
    v = torch.randn(24, 3, device=DEVICE).requires_grad_()
    ptr = torch.tensor(bounds, device=DEVICE)
    y, p = segment_mm(x, w, ptr, capacity=CAP, extra_weight=v, backend="triton", **kw)
    yr, pr = segment_mm(x, w, bounds, extra_weight=v, backend="torch", **_real(kw, m))
    assert rel_err(y[:m], yr) < TOL[torch.float32] and rel_err(p[:m], pr) < TOL[torch.float32]
    assert not y[m:].any() and not p[m:].any()
    dy, dp = torch.randn_like(y), torch.randn_like(p)
    got = torch.autograd.grad((y, p), (x, w, v), (dy, dp))
    want = torch.autograd.grad((yr, pr), (x, w, v), (dy[:m], dp[:m]))
    for name, g, r in zip(("x", "weight", "extra_weight"), got, want):
        assert rel_err(g, r) < TOL[torch.float32] * 5, name


@needs_triton
@pytest.mark.parametrize("layout", ["plain", "gathered", "scattered"])
def test_triton_path_reads_nothing_back(layout):
    bounds = CASES[0][0]
    x, w, b, kw = _inputs(bounds, torch.float32, layout=layout)
    ptr = torch.tensor(bounds, device=DEVICE)
    with host_reads() as seen:
        y = segment_mm(x, w, ptr, capacity=CAP, bias=b, backend="triton", **kw)
        y.square().sum().backward()
    assert seen == [], [(name, where) for name, _, where in seen]
    assert x.grad is not None and w.grad is not None and b.grad is not None


def test_capacity_inputs_are_checked():
    x, w = torch.randn(CAP, 4), torch.randn(2, 4, 3)
    with pytest.raises(TypeError, match="seg_ptr must be a tensor"):
        segment_mm(x, w, [0, 2, 5], capacity=CAP)
    with pytest.raises(ValueError, match="S \\+ 1 = 3 entries"):
        segment_mm(x, w, torch.tensor([0, 5]), capacity=CAP)
    with pytest.raises(ValueError, match="48 rows, got 40"):
        segment_mm(torch.randn(40, 4), w, torch.tensor([0, 2, 5]), capacity=CAP)
    with pytest.raises(ValueError, match="capacity"):
        segment_mm(x, w, torch.tensor([0, 2, 5]), capacity=-1)


def test_debug_mode_checks_the_device_bounds(monkeypatch):
    monkeypatch.setenv("HECTOR_DEBUG", "1")
    x, w = torch.randn(CAP, 4), torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match="at most capacity"):
        segment_mm(x, w, torch.tensor([0, 2, CAP + 1]), capacity=CAP)
    with pytest.raises(ValueError, match="non-decreasing"):
        segment_mm(x, w, torch.tensor([0, 5, 2]), capacity=CAP)
