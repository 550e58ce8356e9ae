"""hector.nn._bias: a linear layer's bias gradient as a GEMV gives what torch's reduction gives."""
import pytest
import torch

from hector.nn._bias import column_sum, linear


@pytest.mark.parametrize("shape", [(37, 5), (4, 6, 5), (0, 5)])
def test_column_sum_is_the_sum_over_leading_dims(shape):
    torch.manual_seed(0)
    dy = torch.randn(*shape, dtype=torch.float64)
    torch.testing.assert_close(column_sum(dy), dy.reshape(-1, shape[-1]).sum(0))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(23,), (3, 7)])
def test_linear_matches_nn_linear(bias, lead):
    torch.manual_seed(1)
    ref = torch.nn.Linear(6, 4, bias=bias).double()
    x = torch.randn(*lead, 6, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(*lead, 4, dtype=torch.float64)
    out = linear(x, ref)
    grads = torch.autograd.grad(out, (x,) + tuple(ref.parameters()), dy)
    x2 = x.detach().clone().requires_grad_()
    out2 = ref(x2)
    grads2 = torch.autograd.grad(out2, (x2,) + tuple(ref.parameters()), dy)
    torch.testing.assert_close(out, out2)
    for a, b in zip(grads, grads2):
        torch.testing.assert_close(a, b)


def test_linear_skips_gradients_nobody_needs():
    ref = torch.nn.Linear(6, 4)
    ref.weight.requires_grad_(False)
    x = torch.randn(5, 6)          # no gradient for x either: only the bias gets one
    out = linear(x, ref)
    (db,) = torch.autograd.grad(out.sum(), (ref.bias,))
    torch.testing.assert_close(db, torch.full((4,), 5.0))


def test_float32_gradients_within_reduction_rounding():
    torch.manual_seed(3)
    dy = torch.randn(20000, 16)
    torch.testing.assert_close(column_sum(dy), dy.sum(0), rtol=1e-5, atol=1e-3)


def test_traces_under_compile():
    ref = torch.nn.Linear(6, 4)
    x = torch.randn(9, 6, requires_grad=True)
    f = torch.compile(lambda t: linear(t, ref).sum(), fullgraph=True, backend="eager")
    f(x).backward()
    db = ref.bias.grad.clone()
    torch.testing.assert_close(db, torch.full((4,), 9.0))


def test_bfloat16_accumulates_in_float32():
    # 20000 ones: a bf16 accumulator would stall at 256
    dy = torch.ones(20000, 3, dtype=torch.bfloat16)
    torch.testing.assert_close(column_sum(dy).float(), dy.float().sum(0), rtol=4e-3, atol=0)
