"""``hector.nn.hgt._pieces``: HGT's per-type outputs as pieces of one split (a block's
destination rows leave gaps; a type may be empty or absent), equal to slicing, with one
concatenating backward instead of a zero-filled full-height gradient per type."""
import pytest
import torch

from hector.nn.hgt import _pieces


@pytest.mark.parametrize("slices", [
    (("a", 0, 4), ("b", 4, 9), ("c", 9, 12)),          # every row, types in order
    (("a", 1, 3), ("c", 5, 5), ("d", 7, 10)),          # gaps before, between, after; empty c
    (("b", 0, 0),),
])
def test_pieces_equal_slices_and_their_gradient(slices):
    torch.manual_seed(0)
    out = torch.randn(12, 3, requires_grad=True)
    got = _pieces(out, slices)
    assert list(got) == [t for t, _, _ in slices]
    for t, lo, hi in slices:
        assert torch.equal(got[t], out[lo:hi])
        if hi > lo:
            assert type(got[t].grad_fn).__name__.startswith("SplitWithSizes")
    weights = {t: torch.randn(hi - lo, 3) for t, lo, hi in slices}
    loss = sum((got[t] * w).sum() for t, w in weights.items())
    (grad,) = torch.autograd.grad(loss, out)
    want = torch.zeros(12, 3)
    for t, lo, hi in slices:
        want[lo:hi] += weights[t]
    torch.testing.assert_close(grad, want)
