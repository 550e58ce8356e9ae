"""The weight gradient of one dense segment (rows neither gathered nor scattered, not too
many of them) on a GPU is cuBLAS's product (``launch.dense_wgrad_rows``): which cases take
it, that its result equals the segment kernel's (dW plain and stored transposed, with and
without the bias sums), and that every other case keeps the kernel."""
import pytest
import torch

from hector.kernels.segment_mm import launch
from hector.kernels.segment_mm.spec import GemmSpec, default_schedule

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the "
                                "cuBLAS path is taken on a GPU only)")


def _spec(x, gather=None, scatter=None, transpose=False, prologue=None, n=6):
    return GemmSpec.of(x, gather, scatter, transpose, n, prologue=prologue)


def test_the_dense_case_is_chosen_only_on_a_gpu_for_one_plain_segment(monkeypatch):
    x, dy = torch.randn(10, 4), torch.randn(10, 6)
    assert launch.dense_wgrad_rows(_spec(x), (0, 10), x, dy) is None      # the CPU
    monkeypatch.setattr(launch, "interpreting", lambda: False)

    class OnGpu:  # what the rule reads of x: its device, its dtype
        device, dtype = torch.device("cuda"), torch.float32
    g = OnGpu()
    assert launch.dense_wgrad_rows(_spec(x), (2, 9), g, dy) == (2, 9)
    idx = torch.arange(10)
    assert launch.dense_wgrad_rows(_spec(x, gather=idx), (0, 10), g, dy) is None
    assert launch.dense_wgrad_rows(_spec(x, scatter=idx), (0, 10), g, dy) is None
    assert launch.dense_wgrad_rows(_spec(x, prologue="relu"), (0, 10), g, dy) is None
    assert launch.dense_wgrad_rows(_spec(x), (0, 4, 10), g, dy) is None   # two segments
    assert launch.dense_wgrad_rows(_spec(x), (0, 10), g, dy, csr=(idx,) * 3) is None
    assert launch.dense_wgrad_rows(_spec(x), (0, 10), g, dy.double()) is None
    tall = launch.DENSE_WGRAD_MAX_ROWS
    assert launch.dense_wgrad_rows(_spec(x), (5, 5 + tall), g, dy) == (5, 5 + tall)
    assert launch.dense_wgrad_rows(_spec(x), (0, tall + 1), g, dy) is None   # the kernel's
    monkeypatch.setattr(launch, "interpreting", lambda: True)
    assert launch.dense_wgrad_rows(_spec(x), (0, 10), g, dy) is None


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("sums", [False, True])
def test_the_dense_product_is_the_weight_gradient_of_its_rows(transpose, sums):
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(13, 5, generator=g), torch.randn(13, 7, generator=g)
    like = torch.empty((1, 7, 5) if transpose else (1, 5, 7))
    got = launch._wgrad_dense((3, 11), x, dy, like, transpose, sums)
    want = x[3:11].double().t() @ dy[3:11].double()
    dw = got[0] if sums else got
    assert dw.shape == like.shape
    torch.testing.assert_close(dw[0].double(), want.t() if transpose else want, rtol=1e-5,
                               atol=1e-5)
    if sums:
        torch.testing.assert_close(got[1][0].double(), dy[3:11].double().sum(0), rtol=1e-5,
                                   atol=1e-5)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("sums", [False, True])
def test_cublas_and_the_kernel_agree_on_a_gpu(dtype, transpose, sums, monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(3000, 96, device="cuda", dtype=dtype)
    dy = torch.randn(3000, 80, device="cuda", dtype=dtype)
    spec = _spec(x, transpose=transpose, n=80)
    like = torch.empty((1, 80, 96) if transpose else (1, 96, 80), device="cuda", dtype=dtype)
    sched = default_schedule(spec)
    args = (spec, sched, (0, 3000), x, None, dy, None, like, sums)
    assert launch.dense_wgrad_rows(spec, (0, 3000), x, dy) == (0, 3000)
    fast = launch.launch_wgrad(*args)
    monkeypatch.setattr(launch, "dense_wgrad_rows", lambda *a, **k: None)
    kernel = launch.launch_wgrad(*args)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for a, b in zip(fast if sums else (fast,), kernel if sums else (kernel,)):
        err = (a.float() - b.float()).abs().max() / b.float().abs().max()
        assert err < tol, err
