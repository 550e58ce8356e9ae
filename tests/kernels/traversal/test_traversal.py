"""``hector.kernels.traversal``: weighted CSRs (construction, composition) against dense
matrices, the Triton traversal kernels (every row-bin variant, forward and every gradient)
against a dense float64 reference, bf16 storage with fp32 accumulation, and input validation.

Tensors live on CUDA when there is a GPU (the kernels run compiled there) and on the CPU
otherwise, where conftest.py runs Triton under its interpreter."""
import os

import pytest
import torch

from hector.kernels.traversal.csr import WeightedCSR, compose, from_coo, scaled
from hector.kernels.traversal.launch import launch, transposed
from hector.kernels.traversal.op import traverse
from hector.kernels.traversal.schedule import Tiles, row_bins

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TRITON_OK = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="no CUDA and TRITON_INTERPRET unset")
TOLS = [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)]


def dense(m):
    ptr, col, val = m.ptr.cpu(), m.col.cpu(), m.val.cpu()
    d = torch.zeros(m.rows, m.cols, dtype=torch.float64)
    for r in range(m.rows):
        for j in range(int(ptr[r]), int(ptr[r + 1])):
            d[r, int(col[j])] += float(val[j])
    return d


def random_map(rows, cols, nnz, seed, device=DEV):
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, rows, (nnz,), generator=g)
    c = torch.randint(0, cols, (nnz,), generator=g)
    v = torch.rand(nnz, generator=g) + 0.5
    want = torch.zeros(rows, cols, dtype=torch.float64)
    want.index_put_((r, c), v.double(), accumulate=True)
    return from_coo(r.to(device), c.to(device), v.to(device), rows, cols), want


def rand(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=DEV, dtype=dtype)


def test_from_coo_sums_duplicates_and_keeps_empty_rows():
    m, want = random_map(9, 7, 40, 0)
    assert torch.allclose(dense(m), want, atol=1e-6)
    assert m.nnz == int((want != 0).sum())      # one entry per distinct (row, col)
    assert m.ptr.shape == (10,)


def test_compose_and_transpose_match_dense_products():
    a, da = random_map(6, 11, 30, 1)
    b, db = random_map(11, 5, 25, 2)
    assert torch.allclose(dense(compose(a, b)), da @ db, atol=1e-5)
    assert torch.allclose(dense(a.transpose()), da.t(), atol=1e-6)
    assert torch.allclose(dense(scaled(a, -2.0)), -2 * da, atol=1e-5)
    with pytest.raises(ValueError, match="compose"):
        compose(b, b)


def test_row_bins_split_rows_by_length_and_cut_hubs():
    # rows: 0 empty, 1 one entry, 2 three, 3 ten, 4 twenty-five
    ptr = torch.tensor([0, 0, 1, 4, 14, 39])
    b = row_bins(ptr, short_max=3, chunk=8)
    assert (b.num_short, b.num_long) == (3, 2)
    assert b.short.tolist() == [0, 1, 2] and b.long.tolist() == [3, 4]
    assert b.short_max == 3 and b.long_mean == 17.5
    # row 3 -> [4, 12) [12, 14); row 4 -> [14, 22) [22, 30) [30, 38) [38, 39)
    assert b.chunk_start.tolist() == [4, 12, 14, 22, 30, 38]
    assert b.chunk_end.tolist() == [12, 14, 22, 30, 38, 39]
    assert b.chunk_of.tolist() == [0, 2, 6]
    every = row_bins(ptr, short_max=100)        # one bin: no row list
    assert every.num_long == 0 and every.short is None and every.short_max == 25
    assert row_bins(ptr, short_max=3, chunk=None).chunk_start is None



@pytest.mark.parametrize("seed", range(4))
def test_row_bins_facts_in_twelve_ops_equal_a_reference(seed):
    """The pending facts of a CSR's bins (read once per CSR of every new mini-batch block)
    take at most 12 aten ops (17 before) and give the bins a plain reference gives."""
    import sys
    from pathlib import Path

    from hector.kernels.traversal.schedule import PendingBins
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from helpers import aten_ops
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 6, (50,), generator=g)
    lengths[torch.randint(0, 50, (3,), generator=g)] = torch.randint(9, 40, (3,), generator=g)
    if seed == 3:
        lengths = torch.randint(0, 4, (20,), generator=g)        # every row short
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    for chunk in (8, None):
        pending, ops = aten_ops(lambda: PendingBins.of(ptr, 3, chunk))
        assert sum(ops.values()) <= 12, ops
        b = pending.finish(pending.facts.tolist())
        short, long = lengths <= 3, lengths > 3
        assert (b.num_short, b.num_long) == (int(short.sum()), int(long.sum()))
        assert b.short_max == int(lengths[short].max())
        if long.any():
            assert b.long_mean == float(lengths[long].sum()) / int(long.sum())
            if b.short is not None:
                assert b.long.tolist() == long.nonzero().squeeze(1).tolist()
        if chunk is not None and int(lengths.max()) > chunk:
            assert b.num_chunks == int(((lengths[long] + chunk - 1) // chunk).sum())
            assert b.chunk_of[-1] == b.num_chunks

def with_bins(m: WeightedCSR, short_max: int, chunk) -> WeightedCSR:
    """``m`` and its transpose with row bins forced by the given thresholds."""
    out = WeightedCSR(m.ptr, m.col, m.val, m.rows, m.cols, row_bins(m.ptr, short_max, chunk))
    t = m.transpose()
    object.__setattr__(out, "_transposed", WeightedCSR(t.ptr, t.col, t.val, t.rows, t.cols,
                                                       row_bins(t.ptr, short_max, chunk)))
    return out


#: (short_max, chunk) forcing each variant on random_map(13, 37, 120): every row on the
#: multi-row kernel; every row on the row kernel; both bins (row lists); both with hub rows
#: cut into chunks; every row long and chunked (no row list).
VARIANTS = {"multi-row": (1000, None), "row": (-1, None), "mixed": (9, None),
            "mixed+chunks": (9, 5), "chunks": (-1, 4)}


@needs_triton
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("dtype,tol", TOLS)
def test_traverse_variants_forward_and_gradients(variant, dtype, tol):
    # 13 output rows (some empty), 37 input rows, 120 entries (rows of 0 to ~16 entries).
    m, dm = random_map(13, 37, 120, 3)
    m = with_bins(m, *VARIANTS[variant])
    x = rand(37, 2, 3, seed=4, dtype=dtype).requires_grad_()
    a = rand(13, 2, 3, seed=5, dtype=dtype).requires_grad_()
    b = rand(6, seed=6, dtype=dtype).requires_grad_()
    out = traverse(m, x, [a], [-1.0], b, backend="triton")
    assert out.dtype == dtype
    want = (dm @ x.double().cpu().reshape(37, 6) - a.double().cpu().reshape(13, 6)
            + b.double().cpu()).reshape(13, 2, 3)
    assert (out.double().cpu() - want).abs().max() / want.abs().max() < tol
    again = traverse(m, x, [a], [-1.0], b, backend="triton")
    assert torch.equal(out, again)                  # no atomics: bitwise the same
    dy = rand(13, 2, 3, seed=7, dtype=dtype)
    gx, ga, gb = torch.autograd.grad(out, (x, a, b), dy)
    dyd = dy.double().cpu().reshape(13, 6)
    want_gx = dm.t() @ dyd
    assert (gx.double().cpu().reshape(37, 6) - want_gx).abs().max() / want_gx.abs().max() < tol
    assert torch.equal(ga.double(), -dy.double())
    assert (gb.double().cpu() - dyd.sum(0)).abs().max() / dyd.sum(0).abs().max() < tol


@needs_triton
@pytest.mark.parametrize("variant", ["multi-row", "mixed+chunks"])
def test_small_tiles_cover_feature_blocks_and_partial_row_blocks(variant):
    # 3-wide tiles on 7 features and 2 rows a program over 13 rows: every mask edge is hit.
    m, dm = random_map(13, 37, 120, 8)
    m = with_bins(m, *VARIANTS[variant])
    x = rand(37, 7, seed=9)
    out = launch(m, x, (), (), None, tiles=Tiles(block_f=4, block_r=2, block_e=2, num_warps=1))
    want = dm @ x.double().cpu()
    assert (out.double().cpu() - want).abs().max() / want.abs().max() < 1e-5


@needs_triton
def test_pure_gather_and_identity_maps():
    # A gather to 50 edge rows (one entry each), and the transpose: a scatter-sum.
    g = torch.Generator().manual_seed(10)
    idx = torch.randint(0, 8, (50,), generator=g)
    m = from_coo(torch.arange(50).to(DEV), idx.to(DEV), None, 50, 8)
    assert m.layout.num_long == 0 and m.layout.short is None and m.layout.short_max == 1
    x = rand(8, 5, seed=11).requires_grad_()
    out = traverse(m, x, backend="triton")
    assert torch.equal(out, x.detach()[idx.to(DEV)])          # a copy: exact
    dy = rand(50, 5, seed=12)
    gx, = torch.autograd.grad(out, x, dy)
    want = torch.zeros(8, 5, dtype=torch.float64).index_add_(0, idx, dy.double().cpu())
    assert (gx.double().cpu() - want).abs().max() < 1e-5


@needs_triton
def test_triton_matches_torch_backend():
    m, _ = random_map(8, 20, 50, 5)
    x = rand(20, 1, 5, seed=13)
    got = traverse(m, x, backend="triton")
    want = traverse(m, x, backend="torch")
    assert torch.allclose(got, want, atol=1e-5)


@needs_triton
def test_transposed_is_built_once():
    m, _ = random_map(5, 6, 12, 14)
    assert transposed(m) is transposed(m)


def test_bad_inputs_are_named():
    m, _ = random_map(4, 6, 10, 6)
    x = torch.randn(6, 1, 3, device=DEV)
    with pytest.raises(TypeError, match="m must be a WeightedCSR"):
        traverse(None, x)
    with pytest.raises(ValueError, match="x must be"):
        traverse(m, torch.randn(5, 1, 3, device=DEV))
    with pytest.raises(ValueError, match=r"addends\[0\]"):
        traverse(m, x, [torch.randn(3, 1, 3, device=DEV)])
    with pytest.raises(ValueError, match="coefs"):
        traverse(m, x, [torch.randn(4, 1, 3, device=DEV)], [1.0, 2.0])
    with pytest.raises(ValueError, match="bias"):
        traverse(m, x, bias=torch.randn(4, device=DEV))
    with pytest.raises(TypeError, match="x must be a floating"):
        traverse(m, torch.ones(6, 1, 3, dtype=torch.int64, device=DEV))


@needs_triton
def test_every_autotuning_config_gives_the_same_result():
    # The autotuner may pick any config of the list: each must be valid for any shape.
    from hector.kernels.traversal.schedule import pick_tiles, tile_configs
    m, dm = random_map(13, 37, 120, 15)
    m = with_bins(m, *VARIANTS["mixed+chunks"])
    x = rand(37, 5, seed=16)
    want = dm @ x.double().cpu()
    configs = set(tile_configs(pick_tiles(m.layout, 5), True)) | set(
        tile_configs(pick_tiles(m.layout, 5), False))
    assert len(configs) >= 4
    for c in configs:
        out = launch(m, x, (), (), None, tiles=c)
        assert (out.double().cpu() - want).abs().max() / want.abs().max() < 1e-5, c
