"""``graph.build.take_rows``: rows of a tensor by index, narrow rows through ``torch.take``
(a slow ``index_select`` path on the GPU), equal to ``index_select`` in value and gradient."""
import pytest
import torch

from hector.graph.build import take_rows


@pytest.mark.parametrize("shape", [(4, 4, 1), (5, 3), (6, 2, 2), (6, 8, 16), (7,), (3, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_take_rows_equals_index_select(shape, dtype):
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(shape, generator=gen).to(dtype).requires_grad_()
    idx = torch.randint(0, shape[0], (13,), generator=gen)
    got = take_rows(t, idx)
    want = t.index_select(0, idx)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want)
    w = torch.randn(want.shape, generator=gen).to(dtype)
    (g_got,) = torch.autograd.grad((got * w).sum(), t)
    (g_want,) = torch.autograd.grad((want * w).sum(), t)
    # (bf16 gradients sum repeated rows in another order: one bf16 step apart at most)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-6
    assert torch.allclose(g_got.float(), g_want.float(), atol=tol, rtol=tol)


def test_take_rows_of_no_rows_and_no_index():
    assert take_rows(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)).shape == (0, 4)
    assert take_rows(torch.ones(3, 4), torch.zeros(0, dtype=torch.long)).shape == (0, 4)
