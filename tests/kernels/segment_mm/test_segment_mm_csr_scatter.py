"""``segment_mm_csr_scatter`` (the segment GEMM whose output rows are added through a CSR: its
*CSR scatter epilogue*), ``hector::segment_mm_wgrad_csr`` (the weight gradient of a
CSR-prologue GEMM) and ``split_rows`` (CSR rows cut into short pieces), which the compiler
combines: each against a naive float64 loop; the Triton kernels' gradients against the
torch backend's; pieces against whole rows; the custom ops through ``opcheck``; input
validation.  Error measure as in test_segment_mm.py."""
import pytest
import torch

from hector.kernels.ptr import split_rows
from hector.kernels.segment_mm import custom_ops
from hector.kernels.segment_mm.op import segment_mm_csr, segment_mm_csr_scatter

from test_segment_mm import DEVICE, TOL, needs_triton, rel_err

BOUNDS = [0, 5, 5, 12, 16]       # an empty segment; 16 logical rows
NUM_CSR_ROWS = 16                 # rows == a permutation of the CSR rows is possible
EMPTY_ROWS = (2, 9)               # CSR rows without entries
NUM_OUT = 13                      # the CSR's columns: the output rows
NUM_X = 20                        # x rows when read through a gather
K, N = 12, 10


def make_csr(rows=NUM_CSR_ROWS, cols=NUM_OUT, max_len=4, seed=0, empty=EMPTY_ROWS,
             long_row=None):
    """(ptr int64, col int32, val float32) on DEVICE; rows in ``empty`` have no entry, row
    ``long_row`` (a (row, length) pair) has that many."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len + 1, (rows,), generator=gen)
    lens[list(empty)] = 0
    if long_row is not None:
        lens[long_row[0]] = long_row[1]
    ptr = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    nnz = int(ptr[-1])
    col = torch.randint(0, cols, (nnz,), generator=gen, dtype=torch.int32)
    val = torch.rand(nnz, generator=gen) + 0.25
    return ptr.to(DEVICE), col.to(DEVICE), val.to(DEVICE)


# --------------------------------------------------------------------------- split_rows


def check_pieces(ptr, limit):
    piece_ptr, row_of = split_rows(ptr, limit)
    p, lens = ptr.tolist(), (ptr[1:] - ptr[:-1]).tolist()
    pp, ro = piece_ptr.tolist(), row_of.tolist()
    assert row_of.dtype == torch.int64
    assert len(pp) == len(ro) + 1
    assert len(ro) == sum(-(-n // limit) for n in lens)          # ceil(n / limit) per row
    assert pp[0] == 0 and pp[-1] == p[-1]
    assert all(a <= b for a, b in zip(ro, ro[1:])), "row_of must not decrease"
    for j in range(len(ro)):
        assert 1 <= pp[j + 1] - pp[j] <= limit, (j, pp[j], pp[j + 1])
    for i in range(len(lens)):
        entries = [e for j in range(len(ro)) if ro[j] == i for e in range(pp[j], pp[j + 1])]
        assert entries == list(range(p[i], p[i + 1])), i
    return piece_ptr, row_of


@pytest.mark.parametrize("limit", [1, 3, 4, 7, 100])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_split_rows_tiles_each_row_in_order(limit, seed, index_dtype):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 6, (12,), generator=gen)
    lens[0] = 0                  # an empty first,
    lens[5] = 0                  # middle
    lens[-1] = 0                 # and last row
    lens[7] = 23                 # a long row: several pieces for every limit < 23
    ptr = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(index_dtype)
    piece_ptr, row_of = check_pieces(ptr, limit)
    if limit == 4:
        assert row_of.tolist().count(7) == 6                     # ceil(23 / 4)


def test_split_rows_examples():
    piece_ptr, row_of = split_rows(torch.tensor([0, 5, 5, 7, 8]), 2)
    assert piece_ptr.tolist() == [0, 2, 4, 5, 7, 8]
    assert row_of.tolist() == [0, 0, 0, 2, 3]


@pytest.mark.parametrize("ptr", [[0], [0, 0, 0, 0]], ids=["no_rows", "all_empty"])
def test_split_rows_without_entries(ptr):
    piece_ptr, row_of = split_rows(torch.tensor(ptr), 3)
    assert piece_ptr.tolist() == [0]
    assert row_of.numel() == 0 and row_of.dtype == torch.int64


@pytest.mark.parametrize("limit", [0, -2])
def test_split_rows_rejects_limit_below_one(limit):
    with pytest.raises(ValueError, match="limit"):
        split_rows(torch.tensor([0, 3, 4]), limit)


# --------------------------------------------------------------- segment_mm_csr_scatter


def naive_scatter(x, weight, bounds, ptr, col, val, rows, num_out, gather=None,
                  transpose=False):
    """float64, differentiable in ``x`` and ``weight``: y_r by a loop over the logical rows,
    then ``out = C y`` with ``C[col[e], r] += val[e]`` over the entries of CSR row rows[r]."""
    x, weight = x.double(), weight.double()
    ys, spread = [], torch.zeros(num_out, bounds[-1], dtype=torch.float64)
    for s in range(len(bounds) - 1):
        w = weight[s].T if transpose else weight[s]
        for r in range(bounds[s], bounds[s + 1]):
            ys.append(x[int(gather[r]) if gather is not None else r] @ w)
            i = int(rows[r])
            for e in range(int(ptr[i]), int(ptr[i + 1])):
                spread[int(col[e]), r] += float(val[e])
    n = weight.shape[1] if transpose else weight.shape[2]
    y = torch.stack(ys) if ys else x.new_zeros(0, n)
    return spread @ y


def _layouts():
    """name -> (gather or None, rows, transpose_weight, gather_unique)."""
    gen = torch.Generator().manual_seed(3)
    m = BOUNDS[-1]
    perm = torch.randperm(NUM_CSR_ROWS, generator=gen)
    repeat = torch.randint(0, NUM_CSR_ROWS, (m,), generator=gen)
    repeat[[1, 2, 3]] = 6                        # one CSR row for three logical rows,
    repeat[[8, 13]] = EMPTY_ROWS[0]              # an empty CSR row, read twice
    gather = torch.randint(0, NUM_X, (m,), generator=gen, dtype=torch.int32)
    gather[4] = gather[9]                        # an x row read twice
    gperm = torch.randperm(m, generator=gen)
    return {"plain": (None, perm, False, False),
            "gathered": (gather, repeat, False, False),
            "gather_unique": (gperm, perm.to(torch.int32), False, True),
            "transposed": (gather, repeat, True, False)}


LAYOUTS = list(_layouts())


def _scatter_inputs(dtype, layout, seed=1):
    gather, rows, transpose, unique = _layouts()[layout]
    gen = torch.Generator().manual_seed(seed)
    nx = BOUNDS[-1] if gather is None or unique else NUM_X
    x = torch.randn(nx, K, generator=gen).to(DEVICE, dtype).requires_grad_()
    wshape = (4, N, K) if transpose else (4, K, N)
    w = torch.randn(wshape, generator=gen).to(DEVICE, dtype).requires_grad_()
    kw = dict(rows=rows.to(DEVICE), num_out_rows=NUM_OUT, transpose_weight=transpose,
              gather=None if gather is None else gather.to(DEVICE), gather_unique=unique)
    return x, w, make_csr(), kw


def _naive_of(x, w, csr, kw):
    ptr, col, val = (t.cpu() for t in csr)
    g = kw["gather"]
    return naive_scatter(x.cpu(), w.cpu(), BOUNDS, ptr, col, val, kw["rows"].cpu(),
                         NUM_OUT, None if g is None else g.cpu(), kw["transpose_weight"])


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=needs_triton), "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_csr_scatter_matches_naive(backend, dtype, layout):
    x, w, csr, kw = _scatter_inputs(dtype, layout)
    with torch.no_grad():
        got = segment_mm_csr_scatter(x, w, BOUNDS, *csr, backend=backend, **kw)
    want = _naive_of(x.detach(), w.detach(), csr, kw)
    assert got.shape == (NUM_OUT, N) and got.dtype == dtype
    assert rel_err(got, want) < TOL[dtype]
    hit = set(csr[1].cpu()[torch.cat([torch.arange(int(csr[0][i]), int(csr[0][i + 1]))
                                      for i in kw["rows"].tolist()])].tolist())
    missed = [c for c in range(NUM_OUT) if c not in hit]
    assert bool((got[missed] == 0).all()), "rows no entry reaches must be zero"


@needs_triton
def test_csr_scatter_unweighted():
    """``csr_val=None`` adds with weight one."""
    x, w, csr, kw = _scatter_inputs(torch.float32, "gathered")
    ptr, col, _ = csr
    got = segment_mm_csr_scatter(x, w, BOUNDS, ptr, col, backend="triton", **kw)
    want = _naive_of(x.detach(), w.detach(), (ptr, col, torch.ones(col.shape)), kw)
    assert rel_err(got, want) < TOL[torch.float32]


def _scatter_grads(backend, dtype, layout):
    x, w, csr, kw = _scatter_inputs(dtype, layout)
    out = segment_mm_csr_scatter(x, w, BOUNDS, *csr, backend=backend, **kw)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out)
    return (out,) + torch.autograd.grad(out, (x, w), dy)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_csr_scatter_grads_triton_match_torch(dtype, layout):
    got = _scatter_grads("triton", dtype, layout)
    want = _scatter_grads("torch", dtype, layout)
    for name, g, t in zip(("out", "dx", "dW"), got, want):
        assert g.dtype == t.dtype == dtype, name
        assert rel_err(g, t) < TOL[dtype] * (1 if name == "out" else 4), name


@needs_triton
@pytest.mark.parametrize("layout", ["gathered", "transposed"])
def test_csr_scatter_grads_match_naive(layout):
    """The backward against autograd through the float64 loop (not the torch backend)."""
    got = _scatter_grads("triton", torch.float32, layout)
    x, w, csr, kw = _scatter_inputs(torch.float64, layout)
    want_out = _naive_of(x, w, csr, kw)
    dy = torch.randn(want_out.shape, generator=torch.Generator().manual_seed(5)).double()
    want = (want_out,) + torch.autograd.grad(want_out, (x, w), dy)
    for name, g, t in zip(("out", "dx", "dW"), got, want):
        assert rel_err(g, t) < TOL[torch.float32] * 4, name


def test_csr_scatter_op_passes_opcheck():
    x, w, (ptr, col, val), kw = _scatter_inputs(torch.float32, "gathered")
    torch.library.opcheck(custom_ops.segment_mm_csr_scatter_op,
                          (x, w, ptr, col, val, kw["gather"], kw["rows"], BOUNDS, NUM_OUT,
                           False, False))


def test_csr_scatter_op_passes_opcheck_unique_transposed():
    x, w, (ptr, col, val), kw = _scatter_inputs(torch.float32, "gather_unique")
    wt = w.detach().transpose(1, 2).contiguous().requires_grad_()
    torch.library.opcheck(custom_ops.segment_mm_csr_scatter_op,
                          (x, wt, ptr, col, val, kw["gather"], kw["rows"], BOUNDS, NUM_OUT,
                           True, True))


# ------------------------------------------------------------------- segment_mm_wgrad_csr


def naive_wgrad(x, dy, bounds, ptr, col, val, gather, scatter):
    """float64: ``dW[s] = sum_{r in s} a_r^T dy[scatter[r]]``, a_r CSR row gather[r] of x."""
    x, dy = x.double(), dy.double()
    dw = torch.zeros(len(bounds) - 1, x.shape[1], dy.shape[1], dtype=torch.float64)
    for s in range(len(bounds) - 1):
        for r in range(bounds[s], bounds[s + 1]):
            i = int(gather[r]) if gather is not None else r
            a = x.new_zeros(x.shape[1])
            for e in range(int(ptr[i]), int(ptr[i + 1])):
                a += float(val[e]) * x[int(col[e])]
            dw[s] += torch.outer(a, dy[int(scatter[r])])
    return dw


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gather", ["perm", None])
def test_wgrad_csr_matches_naive(dtype, gather):
    gen = torch.Generator().manual_seed(7)
    num_dy = 9
    x = torch.randn(NUM_X, K, generator=gen).to(DEVICE, dtype)
    dy = torch.randn(num_dy, N, generator=gen).to(DEVICE, dtype)
    ptr, col, val = make_csr(cols=NUM_X, seed=2)
    g = torch.randperm(NUM_CSR_ROWS, generator=gen).to(DEVICE) if gather else None
    scatter = torch.randint(0, num_dy, (BOUNDS[-1],), generator=gen)
    scatter[[0, 6, 14]] = 4                      # one dy row for three logical rows
    scatter = scatter.to(DEVICE, torch.int32)
    got = custom_ops.segment_mm_wgrad_csr_op(x, dy, ptr, col, val, g, scatter, BOUNDS)
    want = naive_wgrad(x.cpu(), dy.cpu(), BOUNDS, ptr.cpu(), col.cpu(), val.cpu(),
                       None if g is None else g.cpu(), scatter.cpu())
    assert got.shape == (4, K, N) and got.dtype == dtype
    assert bool((got[1] == 0).all()), "an empty segment has a zero gradient"
    assert rel_err(got, want) < TOL[dtype]


def test_wgrad_csr_op_passes_opcheck():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(NUM_X, K, generator=gen).to(DEVICE)
    dy = torch.randn(9, N, generator=gen).to(DEVICE)
    ptr, col, val = make_csr(cols=NUM_X, seed=2)
    g = torch.randperm(NUM_CSR_ROWS, generator=gen).to(DEVICE)
    scatter = torch.randint(0, 9, (BOUNDS[-1],), generator=gen).to(DEVICE)
    torch.library.opcheck(custom_ops.segment_mm_wgrad_csr_op,
                          (x, dy, ptr, col, val, g, scatter, BOUNDS))


# ------------------------------------------------------------- pieces against whole rows


def _piece_layout(ptr, limit, row_seg, num_segments):
    """(piece_ptr, order, row of each GEMM row, piece bounds) as the compiler builds them: the
    pieces of ``split_rows`` ordered by length within the segment of their row."""
    piece_ptr, row_of = split_rows(ptr, limit)
    seg = row_seg.index_select(0, row_of)
    order = torch.argsort(seg * (limit + 1) + (piece_ptr[1:] - piece_ptr[:-1]), stable=True)
    bounds = [0] + torch.bincount(seg, minlength=num_segments).cumsum(0).tolist()
    return piece_ptr, order, row_of.index_select(0, order), bounds


def _whole_and_pieces(dtype, limit=3):
    """A CSR over x's rows with a long row (longer than several pieces); rows grouped by
    segment (BOUNDS), each summed into a node row (repeats: the scatter sums)."""
    gen = torch.Generator().manual_seed(11)
    num_nodes = 7
    ptr, col, val = make_csr(cols=NUM_X, seed=4, max_len=5, long_row=(7, 14))
    row_seg = torch.repeat_interleave(torch.arange(4), torch.tensor(BOUNDS).diff()).to(DEVICE)
    node = torch.randint(0, num_nodes, (NUM_CSR_ROWS,), generator=gen).to(DEVICE)
    x = torch.randn(NUM_X, K, generator=gen).to(DEVICE, dtype)
    w = torch.randn(4, K, N, generator=gen).to(DEVICE, dtype)
    dy = torch.randn(num_nodes, N, generator=gen).to(DEVICE, dtype)
    piece_ptr, order, row_of, bounds = _piece_layout(ptr, limit, row_seg, 4)
    assert len(order) > NUM_CSR_ROWS - len(EMPTY_ROWS), "some row must be cut"
    return dict(x=x, w=w, dy=dy, ptr=ptr, col=col, val=val, node=node, num_nodes=num_nodes,
                piece_ptr=piece_ptr, order=order, row_of=row_of, bounds=bounds)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pieces_give_the_csr_gemm_of_whole_rows(dtype):
    c = _whole_and_pieces(dtype)
    whole = segment_mm_csr(c["x"], c["w"], BOUNDS, c["ptr"], c["col"], c["val"],
                           scatter=c["node"], num_out_rows=c["num_nodes"], backend="triton")
    pieces = segment_mm_csr(c["x"], c["w"], c["bounds"], c["piece_ptr"], c["col"], c["val"],
                            gather=c["order"], scatter=c["node"].index_select(0, c["row_of"]),
                            num_out_rows=c["num_nodes"], backend="triton", gather_unique=True)
    # float64: sum over rows r of (CSR row r of x) W_s, into node[r]
    ptr, col, val = c["ptr"].cpu(), c["col"].cpu(), c["val"].cpu()
    want = torch.zeros(c["num_nodes"], N, dtype=torch.float64)
    for s in range(4):
        for r in range(BOUNDS[s], BOUNDS[s + 1]):
            for e in range(int(ptr[r]), int(ptr[r + 1])):
                want[int(c["node"][r])] += float(val[e]) * (c["x"][int(col[e])].double().cpu()
                                                            @ c["w"][s].double().cpu())
    assert rel_err(whole, want) < TOL[dtype]
    assert rel_err(pieces, want) < TOL[dtype]
    assert rel_err(pieces, whole) < TOL[dtype] * 2


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pieces_give_the_wgrad_of_whole_rows(dtype):
    c = _whole_and_pieces(dtype)
    whole = custom_ops.segment_mm_wgrad_csr_op(c["x"], c["dy"], c["ptr"], c["col"], c["val"], None,
                                           c["node"], BOUNDS)
    pieces = custom_ops.segment_mm_wgrad_csr_op(c["x"], c["dy"], c["piece_ptr"], c["col"],
                                            c["val"], c["order"],
                                            c["node"].index_select(0, c["row_of"]),
                                            c["bounds"])
    # the same dW by autograd through the torch backend of the whole-row GEMM
    w = c["w"].detach().clone().requires_grad_()
    out = segment_mm_csr(c["x"], w, BOUNDS, c["ptr"], c["col"], c["val"], scatter=c["node"],
                         num_out_rows=c["num_nodes"], backend="torch")
    want, = torch.autograd.grad(out, w, c["dy"])
    naive = naive_wgrad(c["x"].cpu(), c["dy"].cpu(), BOUNDS, c["ptr"].cpu(), c["col"].cpu(),
                        c["val"].cpu(), None, c["node"].cpu())
    assert rel_err(want, naive) < TOL[dtype]
    assert rel_err(whole, naive) < TOL[dtype]
    assert rel_err(pieces, naive) < TOL[dtype]
    assert rel_err(pieces, whole) < TOL[dtype] * 2


# ------------------------------------------------------------------------- validation


BAD = [
    (dict(rows=torch.zeros(BOUNDS[-1] - 1, dtype=torch.int64)), ValueError, "rows"),
    (dict(rows=torch.zeros(BOUNDS[-1])), TypeError, "rows"),
    (dict(csr_val=torch.ones(1, dtype=torch.float64)), ValueError, "csr_val"),
    (dict(num_out_rows=-1), ValueError, "num_out_rows"),
]


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=needs_triton), "torch"])
@pytest.mark.parametrize("change,exc,match", BAD, ids=[b[2] + str(i) for i, b in enumerate(BAD)])
def test_csr_scatter_bad_input_names_the_argument(change, exc, match, backend):
    x, w, (ptr, col, val), kw = _scatter_inputs(torch.float32, "plain")
    args = dict(csr_val=val, rows=kw["rows"], num_out_rows=NUM_OUT)
    args.update(change)
    if args["csr_val"] is not val:                 # float64, csr_col's shape
        args["csr_val"] = torch.ones(col.shape, dtype=torch.float64)
    args = {k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in args.items()}
    with pytest.raises(exc, match=match):
        segment_mm_csr_scatter(x, w, BOUNDS, ptr, col, args["csr_val"], rows=args["rows"],
                               num_out_rows=args["num_out_rows"], backend=backend)
