"""``hector::cosine_qk`` (AGNN's ``q = beta k``, ``k = F.normalize(x)``): the Triton kernels
(CUDA, or the interpreter on the CPU) and the torch path, output and both gradients, against
torch autograd of ``F.normalize`` in float64; zero rows (the clamped norm), widths that are
not a tile multiple and wider than one tile, bf16, empty inputs, opcheck, bad arguments."""
import pytest
import torch
import torch.nn.functional as F

from hector.kernels.attention import cosine
from hector.kernels.attention.cosine import cosine_qk, cosine_qk_op

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")    # interpreter chatter
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: dict(rtol=2e-5, atol=2e-6), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _data(rows, dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g)
    if rows > 3:
        x[1] = 0.0                               # norm 0: clamped, k = 0, dx = g / eps
        x[3] *= 1e-3                             # small but not clamped
    beta = torch.tensor([1.7])
    dq, dk = torch.randn(rows, dim, generator=g), torch.randn(rows, dim, generator=g)
    return [t.to(DEVICE, dtype) for t in (x, beta, dq, dk)]


def _reference(x, beta, dq, dk):
    """(q, k, dx, dbeta) by torch autograd in float64."""
    x64 = x.detach().double().requires_grad_()
    b64 = beta.detach().double().requires_grad_()
    k = F.normalize(x64, p=2.0, dim=-1)
    q = k * b64
    dx, db = torch.autograd.grad((q, k), (x64, b64), (dq.double(), dk.double()))
    return q.detach(), k.detach(), dx, db


def _ours(x, beta, dq, dk):
    xg, bg = x.detach().clone().requires_grad_(), beta.detach().clone().requires_grad_()
    q, k = cosine_qk(xg, bg)
    dx, db = torch.autograd.grad((q, k), (xg, bg), (dq, dk))
    return q, k, dx, db


def _compare(ours, ref, dtype, eps_rows=()):
    for name, a, b in zip(("q", "k", "dx", "dbeta"), ours, ref):
        assert a.dtype == dtype, name
        b = b.clone()
        a = a.double()
        if name == "dx":
            # a zero row's gradient is g / 1e-12: compare it relatively, apart
            for r in eps_rows:
                torch.testing.assert_close(a[r], b[r], rtol=TOL[dtype]["rtol"] * 10, atol=0,
                                           msg=f"dx of zero row {r}")
                a[r] = b[r] = 0
            scale = max(b.abs().max().item(), 1.0)
            torch.testing.assert_close(a / scale, b / scale, **TOL[dtype], msg=name)
        else:
            torch.testing.assert_close(a, b, **TOL[dtype], msg=name)


@pytest.mark.parametrize("rows,dim", [(37, 5), (21, 128), (19, 200)])
def test_kernel_matches_normalize_autograd(rows, dim):
    x, beta, dq, dk = _data(rows, dim, torch.float32)
    _compare(_ours(x, beta, dq, dk), _reference(x, beta, dq, dk), torch.float32, eps_rows=(1,))


def test_torch_path_matches_normalize_autograd(monkeypatch):
    monkeypatch.setattr(cosine, "triton_available", lambda device: False)
    x, beta, dq, dk = _data(23, 9, torch.float32, seed=1)
    _compare(_ours(x, beta, dq, dk), _reference(x, beta, dq, dk), torch.float32, eps_rows=(1,))


def test_bf16_accumulates_in_fp32():
    x, beta, dq, dk = _data(33, 64, torch.bfloat16, seed=2)
    x[1] = 1.0                                 # no zero row: bf16 g / eps overflows anyway
    _compare(_ours(x, beta, dq, dk), _reference(x, beta, dq, dk), torch.bfloat16)


def test_norm_output_is_the_clamped_norm():
    x, beta, _, _ = _data(20, 7, torch.float32, seed=3)
    _, _, norm = cosine_qk_op(x, beta)
    want = torch.linalg.vector_norm(x.double(), dim=-1).clamp_min(1e-12)
    torch.testing.assert_close(norm.double(), want, rtol=1e-6, atol=0)
    assert norm[1].item() == pytest.approx(1e-12)


def test_empty_input():
    x = torch.empty(0, 6, device=DEVICE, requires_grad=True)
    beta = torch.ones(1, device=DEVICE, requires_grad=True)
    q, k = cosine_qk(x, beta)
    assert q.shape == k.shape == (0, 6)
    (q.sum() + k.sum()).backward()
    assert x.grad.shape == (0, 6) and beta.grad.item() == 0.0


def test_ops_pass_opcheck():
    x, beta, dq, dk = _data(18, 6, torch.float32, seed=4)
    torch.library.opcheck(cosine_qk_op, (x.requires_grad_(), beta.requires_grad_()))
    _, _, norm = cosine_qk_op(x.detach(), beta.detach())
    torch.library.opcheck(cosine.cosine_qk_backward_op,
                          (dq, dk, x.detach(), norm, beta.detach()),
                          test_utils=("test_schema", "test_faketensor"))


def test_bad_arguments_name_themselves():
    x = torch.randn(4, 3, device=DEVICE)
    with pytest.raises(ValueError, match="x must be"):
        cosine_qk(x[None], torch.ones(1, device=DEVICE))
    with pytest.raises(ValueError, match="beta must be"):
        cosine_qk(x, torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match="beta must be"):
        cosine_qk(x, torch.ones(1, device=DEVICE, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_features_without_gradient_give_beta_its_gradient_alone(dtype):
    """A first layer's fixed features: k carries no gradient (the attention then skips dk)
    and beta's gradient is <dq, k>."""
    x, beta, dq, _ = _data(29, 12, dtype, seed=5)
    bg = beta.detach().clone().requires_grad_()
    q, k = cosine_qk(x, bg)
    assert q.requires_grad and not k.requires_grad
    (db,) = torch.autograd.grad(q, bg, dq)
    _, _, _, want = _reference(x, beta, dq, torch.zeros_like(dq))
    torch.testing.assert_close(db.double(), want, **TOL[dtype])
