"""HGT's per-type inputs stacked without a copy when they are consecutive row blocks of one
tensor (``nn._common.stacked_rows``): a view whose backward splits the gradient as
``torch.cat``'s does; anything else is concatenated."""
import pytest
import torch

from hector.nn import HGTConv
from hector.nn._common import stacked_rows


def _blocks(rows=(3, 0, 4, 2), width=5, requires_grad=True):
    base = torch.randn(sum(rows), width, requires_grad=requires_grad)
    return base, list(base.split(list(rows), 0))


def test_consecutive_blocks_give_a_view_with_cats_gradients(monkeypatch):
    base, xs = _blocks()
    calls = []
    real = torch.cat
    monkeypatch.setattr(torch, "cat", lambda *a, **k: calls.append(1) or real(*a, **k))
    y = stacked_rows(xs)
    assert not calls and y.data_ptr() == base.data_ptr() and torch.equal(y, base)
    w = torch.randn(y.shape)
    got = torch.autograd.grad((y * w).sum(), xs[2:3] + [base])
    assert torch.equal(got[0], w[3:7]) and torch.equal(got[1], w)


@pytest.mark.parametrize("case", ["separate", "gap", "order", "strided", "dtype", "empty"])
def test_anything_else_is_concatenated(case):
    base = torch.randn(10, 4)
    xs = {"separate": [torch.randn(2, 4), torch.randn(3, 4)],
          "gap": [base[0:2], base[3:5]],
          "order": [base[2:4], base[0:2]],
          "strided": [base[0:2, :2], base[2:4, :2]],
          "dtype": [base[0:2], base[2:4].double()],
          "empty": [base[0:0], torch.empty(0, 4)]}[case]
    y = stacked_rows(xs)
    assert y.numel() == 0 or y.data_ptr() != base.data_ptr() or case == "separate"
    assert torch.equal(y, torch.cat(xs, 0))


def test_hgt_on_slices_of_one_tensor_equals_separate_tensors():
    """HGT fed views of one tensor (no copy) and fed separate copies: same output and
    gradients, per type and for the shared tensor."""
    torch.manual_seed(0)
    meta = (["a", "b"], [("a", "r", "b"), ("b", "s", "a"), ("a", "t", "a")])
    layer = HGTConv(6, 6, meta, heads=2)
    ei = {("a", "r", "b"): torch.tensor([[0, 1, 2], [0, 1, 0]]),
          ("b", "s", "a"): torch.tensor([[0, 1], [2, 0]]),
          ("a", "t", "a"): torch.tensor([[0, 1], [1, 2]])}
    base = torch.randn(5, 6, requires_grad=True)
    views = {"a": base[:3], "b": base[3:]}
    copies = {t: v.detach().clone().requires_grad_() for t, v in views.items()}
    out_v, out_c = layer(views, ei), layer(copies, ei)
    w = {t: torch.randn(o.shape) for t, o in out_v.items()}
    for t in out_v:
        torch.testing.assert_close(out_v[t], out_c[t], rtol=0, atol=0)
    sum((out_v[t] * w[t]).sum() for t in w).backward()
    sum((out_c[t] * w[t]).sum() for t in w).backward()
    torch.testing.assert_close(base.grad, torch.cat([copies["a"].grad, copies["b"].grad]))
