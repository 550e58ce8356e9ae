"""``segment_mm(..., addend=)``: the GEMM's addend epilogue (each output row adds its row of
a given tensor before the one rounding).  The Triton kernels against the torch backend, output
and every gradient (x, weight, bias, addend), for plain rows, gathered rows and a permutation
scatter, fp32 and bf16, an fp32 addend on a bf16 product, the pinned-schedule path, the custom
op through ``opcheck``, and input validation.  Error measure as in test_segment_mm.py."""
import pytest
import torch

from hector.kernels.segment_mm import custom_ops
from hector.kernels.segment_mm.op import segment_mm
from hector.kernels.segment_mm.spec import GemmSpec

from test_segment_mm import DEVICE, TILE, TOL, needs_triton, rel_err

BOUNDS = [0, 7, 7, 30, 36]        # an empty segment, one longer than the 16-row test tile
ROWS, K, N = 36, 19, 24


def _inputs(dtype, addend_dtype=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    S = len(BOUNDS) - 1

    def t(*shape, d=dtype):
        return torch.randn(*shape, generator=gen).to(DEVICE, d).requires_grad_()
    return t(ROWS, K), t(S, K, N), t(S, N), t(ROWS, N, d=addend_dtype or dtype)


def _layouts():
    gen = torch.Generator().manual_seed(1)
    perm = torch.randperm(ROWS, generator=gen).to(DEVICE)
    return {"plain": {},
            "gathered": dict(gather=torch.randint(0, ROWS, (ROWS,), generator=gen).to(DEVICE)),
            "permuted": dict(gather=perm, scatter=perm.flip(0), num_out_rows=ROWS,
                             gather_unique=True, scatter_unique=True)}


@needs_triton
@pytest.mark.parametrize("layout", ["plain", "gathered", "permuted"])
@pytest.mark.parametrize("dtype, addend_dtype", [(torch.float32, None),
                                                 (torch.bfloat16, None),
                                                 (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("pinned", [False, True])
def test_addend_matches_the_torch_backend(layout, dtype, addend_dtype, pinned):
    x, w, b, a = _inputs(dtype, addend_dtype)
    kw = _layouts()[layout]
    got = segment_mm(x, w, BOUNDS, bias=b, addend=a, backend="triton",
                     schedule=TILE if pinned else None, **kw)
    want = segment_mm(x, w, BOUNDS, bias=b, addend=a, backend="torch", **kw)
    assert got.dtype == dtype and got.shape == want.shape
    tol = TOL[dtype]
    assert rel_err(got, want) < tol
    dy = torch.randn_like(got)
    g_got = torch.autograd.grad(got, (x, w, b, a), dy)
    g_want = torch.autograd.grad(want, (x, w, b, a), dy)
    for name, gg, gw in zip(("x", "weight", "bias", "addend"), g_got, g_want):
        assert gg.dtype == gw.dtype, name
        assert rel_err(gg, gw) < tol * 5, name
    # The addend's gradient is the output's, row for row.
    assert torch.equal(g_got[3], dy.to(a.dtype))


def test_torch_backend_adds_the_addend_once():
    x, w, b, a = _inputs(torch.float64)
    with torch.no_grad():
        plain = segment_mm(x, w, BOUNDS, bias=b, backend="torch")
        added = segment_mm(x, w, BOUNDS, bias=b, addend=a, backend="torch")
    assert torch.allclose(added, plain + a, atol=1e-12)


def test_op_passes_opcheck():
    x, w, b, a = _inputs(torch.float32)
    perm = _layouts()["permuted"]["gather"]
    torch.library.opcheck(custom_ops.segment_mm_op,
                          (x, w, perm, perm.flip(0), BOUNDS, ROWS, False, True, True, b, "", a))


def test_spec_refuses_an_addend_on_summed_rows():
    with pytest.raises(ValueError, match="addend"):
        GemmSpec(has_gather=False, has_scatter=True, transpose_weight=False,
                 dtype=torch.float32, K=4, N=4, has_addend=True)


BAD = [
    (lambda a: a[:-1], ValueError, "addend must have the output's shape"),
    (lambda a: a.long(), TypeError, "floating point"),
    (lambda a: [1.0], TypeError, "addend must be a torch.Tensor"),
]


@pytest.mark.parametrize("change,exc,match", BAD, ids=["shape", "dtype", "type"])
def test_bad_addend_names_the_argument(change, exc, match):
    x, w, _, a = _inputs(torch.float32)
    with pytest.raises(exc, match=match):
        segment_mm(x, w, BOUNDS, addend=change(a.detach()), backend="torch")


def test_addend_with_a_summing_scatter_is_refused():
    x, w, _, _ = _inputs(torch.float32)
    scatter = torch.zeros(ROWS, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="stored once"):
        segment_mm(x, w, BOUNDS, scatter=scatter, num_out_rows=3,
                   addend=torch.zeros(3, N, device=DEVICE), backend="torch")
