"""``hector.kernels.eager.call``: a custom op's body run directly in plain eager code gives
bitwise the op's result, and every case where the dispatcher matters (gradients recorded,
dispatch modes such as fake tensors and the launch counter, compilation) still goes through
the op."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from hector.compiler.launches import CallCounter
from hector.kernels.eager import call, direct
from hector.kernels.segment_mm.custom_ops import segment_mm_op
from hector.kernels.traversal.csr import from_coo
from hector.kernels.traversal.launch import csr_handle, traverse_op

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")    # interpreter chatter
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def randn(*shape, **kw):
    return torch.randn(*shape, device=DEV, **kw)


def _csr(seed=0, rows=40, cols=30, nnz=200):
    g = torch.Generator().manual_seed(seed)
    return from_coo(torch.randint(0, rows, (nnz,), generator=g).to(DEV),
                    torch.randint(0, cols, (nnz,), generator=g).to(DEV),
                    torch.rand(nnz, generator=g).to(DEV), rows, cols)


def _segment_args():
    return randn(12, 8), randn(3, 8, 5), None, None, [0, 4, 4, 12], 12, False


def test_direct_body_equals_the_dispatched_op_bitwise():
    m = _csr()
    x = randn(30, 16)
    add = randn(40, 16)
    args = (csr_handle(m), x, [add], [0.5], None)
    assert direct(args)
    assert torch.equal(call(traverse_op, *args), traverse_op(*args))
    seg = _segment_args()
    assert torch.equal(call(segment_mm_op, *seg), segment_mm_op(*seg))


def test_inputs_that_record_gradients_go_through_the_op_and_its_autograd():
    m = _csr(1)
    x = randn(30, 16, requires_grad=True)
    args = (csr_handle(m), x, [], [], None)
    assert not direct(args)
    out = call(traverse_op, *args)
    assert out.grad_fn is not None
    out.sum().backward()
    want = torch.zeros(40, 30, device=DEV)
    want.index_put_((m.row_ids(), m.col.long()), m.val, accumulate=True)
    torch.testing.assert_close(x.grad, want.sum(0)[:, None].expand(30, 16))
    with torch.no_grad():            # no gradient recorded: the body runs directly
        assert direct(args)
        assert call(traverse_op, *args).grad_fn is None


def test_a_gradient_inside_a_list_argument_is_seen():
    add = randn(40, 16, requires_grad=True)
    m = _csr(2)          # (kept alive: a handle names a live CSR)
    args = (csr_handle(m), randn(30, 16), [add], [1.0], None)
    assert not direct(args)
    call(traverse_op, *args).sum().backward()
    assert torch.equal(add.grad, torch.ones(40, 16, device=DEV))


def test_dispatch_modes_see_the_op():
    m = _csr(3)
    args = (csr_handle(m), randn(30, 16), [], [], None)
    with CallCounter() as counter:
        call(traverse_op, *args)
    assert counter.custom["hector::traverse"] == 1
    with FakeTensorMode() as mode:                   # fake tensors: the op's fake kernel
        fake = mode.from_tensor(randn(30, 16))
        out = call(traverse_op, args[0], fake, [], [], None)
        assert out.shape == (40, 16) and type(out) is not torch.Tensor


def test_compiled_code_calls_the_op():
    m = _csr(4)
    args = (csr_handle(m), randn(30, 16), [], [], None)
    seen = []

    def fn(x):
        seen.append(direct((x,)))
        return call(traverse_op, args[0], x, [], [], None)
    out = torch.compile(fn, backend="eager", fullgraph=True)(args[1])
    assert seen == [False]                            # traced once, as the op
    assert torch.equal(out, traverse_op(*args))


def test_parameters_are_plain_tensors_to_the_fast_path():
    x, w, *rest = _segment_args()
    w = torch.nn.Parameter(w)
    with torch.no_grad():       # a layer's weight inside the compiled plans' own autograd
        assert direct((x, w, *rest))
        assert torch.equal(call(segment_mm_op, x, w, *rest), segment_mm_op(x, w, *rest))
    assert not direct((x, w, *rest))                # grad mode: the op records the gradient
    call(segment_mm_op, x, w, *rest).sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


def test_recorded_gradients_use_the_ops_formula_around_its_body():
    """Grad mode with inputs requiring grad: the op's registered autograd formula runs around
    its body without the dispatcher (keywords placed as the schema orders them); values and
    gradients equal the dispatched op's bitwise."""
    x, w, gather, scatter, bounds, rows, transpose = _segment_args()
    x.requires_grad_()
    w = torch.nn.Parameter(w)
    out = call(segment_mm_op, x, w, gather, scatter, bounds, num_out_rows=rows,
               transpose_weight=transpose)
    assert type(out.grad_fn).__name__ == "Eager_hector_segment_mmBackward"
    ref = segment_mm_op(x, w, gather, scatter, bounds, rows, transpose)
    assert "Eager" not in type(ref.grad_fn).__name__
    g = randn(*out.shape)
    got, want = (torch.autograd.grad(o, (x, w), g) for o in (out, ref))
    assert torch.equal(out, ref) and all(map(torch.equal, got, want))


def test_tensor_list_ops_keep_the_dispatched_autograd():
    """``hector::traverse`` takes its addends as a tensor list, whose gradients an
    ``autograd.Function`` cannot return: dispatched."""
    m = _csr(5)
    x = randn(30, 16, requires_grad=True)
    out = call(traverse_op, csr_handle(m), x, [], [], None)
    assert "Eager" not in type(out.grad_fn).__name__
