"""``hector.nn.hgt._pieces``: HGT's per-type outputs as pieces of one split (a block's
destination rows leave gaps; a type may be empty or absent), equal to slicing, with one
concatenating backward instead of a zero-filled full-height gradient per type; and the layers'
parameter-dtype lookup, which reads one parameter."""
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
        if hi > lo:     # a copy of a split piece: the gradients meet in the split's backward
            assert type(got[t].grad_fn).__name__.startswith("Clone")
            assert type(got[t].grad_fn.next_functions[0][0]).__name__.startswith(
                "SplitWithSizes")
    weights = {t: torch.randn(hi - lo, 3) for t, lo, hi in slices}
    loss = sum((got[t] * w).sum() for t, w in weights.items())
    (grad,) = torch.autograd.grad(loss, out)
    want = torch.zeros(12, 3)
    for t, lo, hi in slices:
        want[lo:hi] += weights[t]
    torch.testing.assert_close(grad, want)


def test_pieces_can_be_modified_in_place_and_back_propagate():
    """A user's in-place activation on HGT's outputs (as on PyG's): the split's own pieces
    would refuse it under autograd."""
    torch.manual_seed(0)
    out = torch.randn(12, 3, requires_grad=True)
    slices = (("a", 0, 4), ("b", 6, 12))
    got = _pieces(out * 1, slices)
    loss = sum(p.relu_().sum() for p in got.values())
    (grad,) = torch.autograd.grad(loss, out)
    want = torch.zeros(12, 3)
    for _, lo, hi in slices:
        want[lo:hi] = (out[lo:hi] > 0).float()
    torch.testing.assert_close(grad, want)
    with torch.no_grad():           # without autograd the pieces are the split's views
        views = _pieces(out, slices)
    assert all(v._base is out for v in views.values())


def test_hgt_layer_outputs_can_be_modified_in_place():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_compile import make_case
    layer, (xs, eid) = make_case("hgt")

    def grads(inplace):
        x = {t: v.clone().requires_grad_() for t, v in xs.items()}
        out = layer(x, eid)
        act = (lambda o: o.relu_()) if inplace else torch.relu
        sum(act(o).square().sum() for o in out.values()).backward()
        return [x[t].grad for t in xs]
    for a, b in zip(grads(True), grads(False)):
        torch.testing.assert_close(a, b)


def test_param_dtype_stops_at_the_first_floating_tensor():
    """A layer's input check reads one parameter, not the list of all of them (HGT checks one
    input per node type: listing ~300 parameters each time was most of its eager forward on
    a 27-type graph)."""
    from hector.nn._common import param_dtype

    class Lazy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))

        def parameters(self, recurse=True):
            yield self.a
            raise AssertionError("read past the first parameter")
    assert param_dtype(Lazy()) == torch.bfloat16
    only_buffers = torch.nn.Module()
    only_buffers.register_buffer("ids", torch.zeros(3, dtype=torch.long))
    only_buffers.register_buffer("w", torch.zeros(3, dtype=torch.float16))
    assert param_dtype(only_buffers) == torch.float16
    assert param_dtype(torch.nn.Module()) is None
