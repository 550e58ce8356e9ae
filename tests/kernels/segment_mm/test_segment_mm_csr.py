"""``segment_mm_csr``: the segment GEMM whose input rows are CSR sums of ``x``'s rows (its CSR
prologue).  The torch backend against a naive float64 loop; the Triton kernel against the
torch backend, output and every gradient (x, weight, bias), with and without a row
permutation, a scatter that sums rows, empty CSR rows and segments, half precision; the
custom op through ``opcheck``; input validation.  Error measure as in test_segment_mm.py."""
import pytest
import torch

from hector.kernels.segment_mm import custom_ops
from hector.kernels.segment_mm.op import segment_mm_csr

from test_segment_mm import DEVICE, TOL, needs_triton, rel_err

BOUNDS = [0, 4, 4, 13, 17]          # an empty segment; 17 CSR rows


def make_csr(rows=17, num_x=30, max_len=5, seed=0, empty_rows=True):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(0 if empty_rows else 1, max_len + 1, (rows,), generator=gen)
    ptr = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    col = torch.randint(0, num_x, (int(ptr[-1]),), generator=gen, dtype=torch.int32)
    val = torch.rand(int(ptr[-1]), generator=gen)
    return ptr.to(DEVICE), col.to(DEVICE), val.to(DEVICE)


def naive(x, weight, bounds, ptr, col, val, gather=None, scatter=None, num_out_rows=None,
          bias=None):
    x, weight = x.double(), weight.double()
    ys = []
    for s in range(len(bounds) - 1):
        for r in range(bounds[s], bounds[s + 1]):
            i = int(gather[r]) if gather is not None else r
            a = sum((float(val[e]) * x[int(col[e])] for e in range(int(ptr[i]), int(ptr[i + 1]))),
                    x.new_zeros(x.shape[1]))
            ys.append(a @ weight[s] + (bias[s].double() if bias is not None else 0))
    y = torch.stack(ys)
    if scatter is None:
        return y
    return y.new_zeros(num_out_rows, y.shape[1]).index_add(0, scatter.long().cpu(), y)


def _inputs(dtype, k=12, n=20, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(30, k, generator=gen).to(DEVICE, dtype).requires_grad_()
    w = torch.randn(4, k, n, generator=gen).to(DEVICE, dtype).requires_grad_()
    b = torch.randn(4, n, generator=gen).to(DEVICE, dtype).requires_grad_()
    return x, w, b


def _layouts():
    gen = torch.Generator().manual_seed(3)
    perm = torch.randperm(17, generator=gen).to(DEVICE)
    return {"plain": {},
            "permuted": dict(gather=perm, scatter=perm, num_out_rows=17, gather_unique=True,
                             scatter_unique=True),
            "summed": dict(scatter=torch.randint(0, 6, (17,), generator=gen).to(DEVICE),
                           num_out_rows=6)}


def _grads(backend, dtype, layout, bias):
    x, w, b = _inputs(dtype)
    ptr, col, val = make_csr()
    kw = dict(_layouts()[layout])
    if bias:
        kw["bias"] = b
    out = segment_mm_csr(x, w, BOUNDS, ptr, col, val, backend=backend, **kw)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out)
    wrt = (x, w, b) if bias else (x, w)
    return (out,) + torch.autograd.grad(out, wrt, dy)


@pytest.mark.parametrize("layout", ["plain", "permuted", "summed"])
def test_torch_backend_matches_naive(layout):
    x, w, b = _inputs(torch.float64)
    ptr, col, val = make_csr()
    kw = _layouts()[layout]
    got = segment_mm_csr(x, w, BOUNDS, ptr, col, val, backend="torch", bias=b, **kw)
    want = naive(x.detach().cpu(), w.detach().cpu(), BOUNDS, ptr.cpu(), col.cpu(), val.cpu(),
                 kw.get("gather"), kw.get("scatter"), kw.get("num_out_rows"), b.detach().cpu())
    assert rel_err(got, want) < 1e-12


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["plain", "permuted", "summed"])
@pytest.mark.parametrize("bias", [False, True])
def test_triton_matches_torch(dtype, layout, bias):
    got = _grads("triton", dtype, layout, bias)
    want = _grads("torch", dtype, layout, bias)
    for name, g, t in zip(("out", "dx", "dW", "db"), got, want):
        assert rel_err(g, t) < TOL[dtype] * (1 if name == "out" else 4), name


@needs_triton
def test_triton_unweighted_csr_and_long_rows():
    """``csr_val=None`` sums with weight one; rows longer than the reduction tile."""
    x, w, _ = _inputs(torch.float32, k=40, n=8)
    ptr, col, _ = make_csr(max_len=40, empty_rows=False)
    got = segment_mm_csr(x, w, BOUNDS, ptr, col, backend="triton")
    want = segment_mm_csr(x, w, BOUNDS, ptr, col, torch.ones(col.shape, device=DEVICE),
                          backend="torch")
    assert rel_err(got, want) < TOL[torch.float32]


def test_op_passes_opcheck():
    x, w, b = _inputs(torch.float32)
    ptr, col, val = make_csr()
    perm = _layouts()["permuted"]["gather"]
    torch.library.opcheck(custom_ops.segment_mm_csr_op,
                          (x, w, ptr, col, val, perm, perm, BOUNDS, 17, False, True, True, b))


BAD = [
    (dict(csr_ptr=torch.zeros(3, 2, dtype=torch.int64)), ValueError, "csr_ptr"),
    (dict(csr_ptr=torch.zeros(18)), TypeError, "csr_ptr"),
    (dict(csr_col=torch.zeros(5)), TypeError, "csr_col"),
    (dict(csr_val=torch.zeros(3, dtype=torch.float64)), ValueError, "csr_val"),
    (dict(seg_ptr=[0, 4, 4, 13, 16]), ValueError, "seg_ptr"),
    (dict(csr_ptr=torch.zeros(10, dtype=torch.int64)), ValueError, "seg_ptr"),
]


@pytest.mark.parametrize("change,exc,match", BAD, ids=[b[2] + str(i) for i, b in enumerate(BAD)])
def test_bad_input_names_the_argument(change, exc, match):
    x, w, _ = _inputs(torch.float32)
    ptr, col, val = make_csr()
    args = dict(seg_ptr=BOUNDS, csr_ptr=ptr, csr_col=col, csr_val=val)
    args.update({k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in change.items()})
    with pytest.raises(exc, match=match):
        segment_mm_csr(x, w, args["seg_ptr"], args["csr_ptr"], args["csr_col"], args["csr_val"],
                       backend="torch")


def test_csr_schedules_span_k():
    from hector.kernels.segment_mm.spec import GemmSpec, default_schedule, tune_configs
    spec = GemmSpec(has_gather=True, has_scatter=True, transpose_weight=False,
                    dtype=torch.float32, K=40, N=20, gather_unique=True, scatter_unique=True,
                    has_csr=True)
    cfgs = tune_configs(spec) + (default_schedule(spec), default_schedule(spec, True))
    assert all(c.block_k >= 40 for c in cfgs)
    with pytest.raises(ValueError, match="block_k=16 must be >= K=40"):
        cfgs[0].__class__(block_m=16, block_n=32, block_k=16).check_fits(spec)
