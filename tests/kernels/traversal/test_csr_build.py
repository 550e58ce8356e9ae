"""Building weighted CSRs without sparse tensors (``from_coo``, ``transpose``, ``compose``):
the same CSRs as torch's sparse-tensor path they replaced (``coalesce``, ``sparse.mm``), bit
for bit on the CPU; duplicates summed in input order; empty rows, no entries, sizes past
int32 and keys past int64.  Host-only: no kernel runs."""
import sys
from pathlib import Path

import pytest
import torch

from hector.kernels.traversal.csr import (WeightedCSR, compose, from_coo, from_groups,
                                          one_per_row)
from hector.kernels.traversal.schedule import row_bins

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/helpers.py
from helpers import host_reads  # noqa: E402


def sparse_csr(sp: torch.Tensor):
    """(ptr, col, val) of a coalesced sparse tensor: what the old ``from_coo`` returned."""
    rows = sp.shape[0]
    idx = sp.indices()
    ptr = torch.zeros(rows + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(idx[0], minlength=rows), 0, out=ptr[1:])
    return ptr, idx[1], sp.values().float()


def old_from_coo(row, col, val, rows, cols):
    return sparse_csr(torch.sparse_coo_tensor(torch.stack([row, col]), val.float(),
                                              (rows, cols)).coalesce())


def old_compose(outer: WeightedCSR, inner: WeightedCSR):
    return sparse_csr(torch.sparse.mm(outer.to_sparse(), inner.to_sparse()).coalesce())


def assert_same(m: WeightedCSR, want):
    ptr, col, val = want
    assert torch.equal(m.ptr, ptr)
    assert torch.equal(m.col.long(), col.long())
    assert torch.equal(m.val, val)          # bitwise, not close
    assert m.layout.num_short + m.layout.num_long == m.rows


def entries(rows, cols, nnz, seed, scale=1.0):
    """Random entries; values spread over many magnitudes so that summation order shows."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, rows, (nnz,), generator=g)
    c = torch.randint(0, cols, (nnz,), generator=g)
    v = torch.randn(nnz, generator=g) * torch.exp(scale * torch.randn(nnz, generator=g))
    return r, c, v


def pairs_at_most(r, c, v, cols, most):
    """The entries with at most ``most`` copies of each (row, col) kept."""
    key = r * cols + c
    seen = {}
    keep = []
    for j, k in enumerate(key.tolist()):
        seen[k] = seen.get(k, 0) + 1
        keep.append(seen[k] <= most)
    keep = torch.tensor(keep)
    return r[keep], c[keep], v[keep]


@pytest.mark.parametrize("seed", range(4))
def test_from_coo_equals_the_sparse_path_with_duplicate_pairs(seed):
    # 12 x 9 with 300 entries: every (row, col) repeats; at most 2 copies, whose sum does
    # not depend on the order, so the old path's (unstable-sort) order gives the same bits.
    r, c, v = pairs_at_most(*entries(12, 9, 300, seed, scale=4.0), 9, 2)
    assert r.numel() > 108        # some keys do repeat
    assert_same(from_coo(r, c, v, 12, 9), old_from_coo(r, c, v, 12, 9))


def test_from_coo_sums_many_duplicates_in_input_order():
    r, c, v = entries(5, 4, 400, 7, scale=6.0)
    m = from_coo(r, c, v, 5, 4)
    sums = {}
    for k, x in zip((r * 4 + c).tolist(), v.tolist()):      # fp32, left to right
        sums[k] = (sums.get(k, torch.tensor(0.0)) + torch.tensor(x, dtype=torch.float32))
    keys = sorted(sums)
    assert torch.equal(m.row_ids() * 4 + m.col.long(), torch.tensor(keys))
    assert torch.equal(m.val, torch.stack([sums[k] for k in keys]))
    # and what the sparse path gives, up to the order of the fp32 additions
    ptr, col, val = old_from_coo(r, c, v, 5, 4)
    assert torch.equal(m.ptr, ptr) and torch.equal(m.col.long(), col)
    assert torch.allclose(m.val, val, rtol=1e-4, atol=1e-3 * float(v.abs().max()))


def test_from_coo_distinct_entries_and_default_ones():
    g = torch.Generator().manual_seed(3)
    keys = torch.randperm(20 * 30, generator=g)[:150]
    r, c = keys // 30, keys % 30
    v = torch.rand(150, generator=g)
    assert_same(from_coo(r, c, v, 20, 30, distinct=True), old_from_coo(r, c, v, 20, 30))
    assert_same(from_coo(r, c, None, 20, 30), old_from_coo(r, c, torch.ones(150), 20, 30))


def test_from_coo_empty_rows_columns_and_no_entries():
    r = torch.tensor([6, 0, 6, 6, 3])     # rows 1, 2, 4, 5, 7 empty; columns 0, 2, 5 unused
    c = torch.tensor([4, 1, 3, 4, 1])
    v = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    m = from_coo(r, c, v, 8, 6)
    assert m.ptr.tolist() == [0, 1, 1, 1, 2, 2, 2, 4, 4]
    assert m.col.tolist() == [1, 1, 3, 4] and m.val.tolist() == [2.0, 5.0, 3.0, 5.0]
    assert_same(m, old_from_coo(r, c, v, 8, 6))
    none = torch.zeros(0, dtype=torch.long)
    e = from_coo(none, none, None, 3, 4)
    assert e.ptr.tolist() == [0, 0, 0, 0] and e.nnz == 0
    assert from_coo(none, none, None, 0, 0).ptr.tolist() == [0]


def test_from_coo_sizes_past_int32_and_keys_past_int64():
    big = 2 ** 40                              # columns past int32: int64 column ids
    r = torch.tensor([2, 0, 2, 1, 2])
    c = torch.tensor([big - 1, 5, 7, big - 2, 7])
    m = from_coo(r, c, None, 3, big)
    assert m.col.dtype == torch.int64
    assert m.ptr.tolist() == [0, 1, 2, 4]
    assert m.col.tolist() == [5, big - 2, 7, big - 1] and m.val.tolist() == [1, 1, 2, 1]
    huge = 2 ** 62                             # rows * cols >= 2^63: no single int64 key
    c = torch.tensor([huge - 1, 5, 7, huge - 2, 7])
    m = from_coo(r, c, None, 3, huge)
    assert m.ptr.tolist() == [0, 1, 2, 4]
    assert m.col.tolist() == [5, huge - 2, 7, huge - 1] and m.val.tolist() == [1, 1, 2, 1]


@pytest.mark.parametrize("seed", range(3))
def test_transpose_and_compose_equal_the_sparse_path(seed):
    # duplicates in both factors; many paths per product entry with spread values
    a = from_coo(*entries(10, 14, 90, seed, scale=3.0), 10, 14)
    b = from_coo(*entries(14, 7, 80, seed + 10, scale=3.0), 14, 7)
    assert_same(a.transpose(), old_from_coo(a.col.long(), a.row_ids(), a.val, 14, 10))
    assert_same(compose(a, b), old_compose(a, b))
    assert_same(compose(b.transpose(), a.transpose()), old_compose(b.transpose(), a.transpose()))


@pytest.mark.parametrize("seed", range(3))
def test_col_sorted_entries_give_the_same_csr(seed):
    """Columns non-decreasing (a scatter's arange, a transpose's row ids): the sort by row
    alone gives the CSR of the (row, col) sort, duplicates merged alike."""
    r, c, v = entries(11, 50, 60, seed)
    c = torch.sort(c).values                                  # non-decreasing, repeats kept
    for distinct in (False, True):
        fast = from_coo(r, c, v, 11, 50, distinct=distinct, col_sorted=True)
        want = from_coo(r, c, v, 11, 50, distinct=distinct)
        assert_same(fast, (want.ptr, want.col, want.val))
    rows = torch.arange(60)                                   # a scatter: one entry per col
    fast = from_coo(r, rows, v, 11, 60, distinct=True, col_sorted=True)
    assert_same(fast, old_from_coo(r, rows, v, 11, 60))


def test_compose_with_no_paths_and_empty_factors():
    a = from_coo(torch.tensor([0, 2]), torch.tensor([1, 1]), None, 3, 4)
    b = from_coo(torch.tensor([0, 3]), torch.tensor([2, 0]), None, 4, 5)   # row 1 empty
    p = compose(a, b)
    assert p.nnz == 0 and p.ptr.tolist() == [0, 0, 0, 0] and (p.rows, p.cols) == (3, 5)
    none = torch.zeros(0, dtype=torch.long)
    z = compose(from_coo(none, none, None, 2, 4), b)
    assert z.nnz == 0 and z.ptr.tolist() == [0, 0, 0]


def test_from_coo_rejects_mismatched_inputs():
    r = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="row and col"):
        from_coo(r, torch.tensor([0]), None, 2, 2)
    with pytest.raises(ValueError, match="val"):
        from_coo(r, r, torch.ones(3), 2, 2)
    with pytest.raises(ValueError, match="rows and cols"):
        from_coo(r, r, None, -1, 2)


@pytest.mark.parametrize("n", [0, 1, 37])
def test_one_per_row_equals_from_coo_of_a_gather(n):
    g = torch.Generator().manual_seed(n)
    idx = torch.randint(0, 5, (n,), generator=g)
    v = torch.rand(n, generator=g)
    for val in (v, None):
        fast, want = one_per_row(idx, val, 5), from_coo(torch.arange(n), idx, val, n, 5)
        assert (fast.rows, fast.cols) == (want.rows, want.cols)
        for a, b in ((fast.ptr, want.ptr), (fast.col, want.col), (fast.val, want.val)):
            assert a.dtype == b.dtype and torch.equal(a, b)
        assert fast.bins.__dict__ == row_bins(want.ptr).__dict__     # no tensors: n short rows


def same_bins(a, b) -> bool:
    """RowBins equal field by field (tensors by value)."""
    for name, x in a.__dict__.items():
        y = b.__dict__[name]
        same = (x is None and y is None) if x is None or y is None else (
            torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y)
        if not same:
            return False
    return True


@pytest.mark.parametrize("rows,cols,nnz", [(9, 6, 40), (4, 3000, 7000)])
def test_row_bins_are_found_on_first_use_or_with_the_merge_read(rows, cols, nnz):
    """A CSR of distinct entries holds no bins (a host read) until a launch asks for them; a
    merged one gets them from its duplicate merge's read, equal to a read of their own (the
    second case: rows past SHORT_MAX and past CHUNK, cut into chunks)."""
    r, c, v = entries(rows, cols, nnz, 3)
    m = from_coo(r, c, v, rows, cols, distinct=True)    # (duplicates kept: the caller's word)
    assert m.bins is None
    assert same_bins(m.layout, row_bins(m.ptr)) and m.bins is m.layout
    t = m.transpose()
    assert t.bins is None and t.layout.num_short + t.layout.num_long == cols
    with host_reads() as seen:
        merged = from_coo(r, c, v, rows, cols)
    assert len(seen) == 1 and merged.bins is not None
    assert same_bins(merged.bins, row_bins(merged.ptr))
    assert rows == 9 or merged.bins.num_chunks > merged.bins.num_long > 0


@pytest.mark.parametrize("seed", range(3))
def test_compose_after_a_gather_reads_no_path_count_and_equals_the_general_path(seed):
    """A gather's bins say one entry per row: its paths are the outer entries, known without
    a read.  The product equals the sparse path and the general path (same gather without
    bins) bit for bit; only the duplicate merge reads the host."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 8, (30,), generator=g)           # 30 edges -> 8 nodes
    gather = one_per_row(idx, torch.rand(30, generator=g), 8)
    outer = from_coo(torch.randint(0, 5, (30,), generator=g), torch.arange(30),
                     torch.rand(30, generator=g), 5, 30, distinct=True)    # scatter to 5 rows
    with host_reads() as seen:
        fast = compose(outer, gather)
    assert len(seen) == 1, seen           # the duplicate merge's (bins in it); no path count
    assert outer.bins is None and same_bins(fast.bins, row_bins(fast.ptr))
    unbinned = WeightedCSR(gather.ptr, gather.col, gather.val, gather.rows, gather.cols)
    for want in (old_compose(outer, gather), compose(outer, unbinned)):
        want = want if isinstance(want, tuple) else (want.ptr, want.col, want.val)
        assert_same(fast, want)


@pytest.mark.parametrize("seed", range(3))
def test_two_scatters_compose_without_a_read_and_equal_the_general_path(seed):
    """Scatters given as groups (every column in one entry): their product is a scatter with
    one entry per column, sized and built with no read, bit for bit the general path's (a
    partition flag that lies would be caught: the general path merges, this one does not)."""
    g = torch.Generator().manual_seed(seed)

    def scatter(rows, cols):
        owner = torch.randint(0, rows, (cols,), generator=g)    # empty rows included
        perm = torch.sort(owner, stable=True).indices
        ptr = torch.zeros(rows + 1, dtype=torch.int64)
        ptr[1:] = torch.cumsum(torch.bincount(owner, minlength=rows), 0)
        return from_groups(ptr, perm, torch.rand(cols, generator=g), rows, cols)
    inner, outer = scatter(9, 40), scatter(4, 9)       # 40 edges -> 9 rows -> 4 nodes
    assert inner.partition and outer.partition
    with host_reads() as seen:
        fast = compose(outer, inner)
    assert seen == [] and fast.partition and fast.nnz == 40
    general = compose(*(WeightedCSR(m.ptr, m.col, m.val, m.rows, m.cols)
                        for m in (outer, inner)))
    for want in (old_compose(outer, inner), (general.ptr, general.col, general.val)):
        assert_same(fast, want)


def test_compose_after_one_entry_per_row_on_average_is_not_taken_for_a_gather():
    """nnz == rows but rows of 2, 0 and 1 entries: the path count must be read."""
    inner = from_coo(torch.tensor([0, 0, 2]), torch.tensor([1, 3, 0]), torch.tensor([1., 2, 3]),
                     3, 4, distinct=True)
    inner.layout                                            # bins known: longest row 2
    outer = from_coo(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2]), None, 2, 3)
    assert_same(compose(outer, inner), old_compose(outer, inner))


@pytest.mark.parametrize("short_max,chunk", [(3, 5), (3, None), (-1, 4), (100, 8)])
def test_row_bins_from_one_read_match_the_row_lengths(short_max, chunk):
    g = torch.Generator().manual_seed(short_max + 7)
    counts = torch.randint(0, 12, (40,), generator=g)
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    b = row_bins(ptr.to(torch.int32), short_max, chunk)
    lens = counts.tolist()
    short = [i for i, c in enumerate(lens) if c <= short_max]
    long = [i for i, c in enumerate(lens) if c > short_max]
    assert (b.num_short, b.num_long) == (len(short), len(long))
    assert b.short_max == max([lens[i] for i in short], default=0)
    if not long:
        assert b.short is None and b.long is None and b.long_mean == 0.0
        return
    assert b.long_mean == sum(lens[i] for i in long) / len(long)
    if short:
        assert b.short.tolist() == short and b.long.tolist() == long
    if chunk is None or max(lens) <= chunk:
        assert b.chunk_start is None
        return
    want = [(p + s, min(p + s + chunk, p + lens[i])) for i in long
            for p in [int(ptr[i])] for s in range(0, lens[i], chunk)]
    assert list(zip(b.chunk_start.tolist(), b.chunk_end.tolist())) == want
    assert b.num_chunks == len(want)


def test_pointer_search_equals_the_count():
    from hector.graph.build import ptr_of, search_ptr     # (the CUDA path of sorted_ptr)
    g = torch.Generator().manual_seed(5)
    for n, size in ((1, 0), (7, 30), (50, 400)):
        keys = torch.sort(torch.randint(0, n + 3, (size,), generator=g)).values  # some >= n
        for dtype in (torch.int64, torch.int32):
            assert torch.equal(search_ptr(keys.to(dtype), n), ptr_of(keys, n))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_same_csrs_on_cuda_as_on_the_cpu():
    """The merge order is fixed (input order, paths in k order): bitwise equal on devices."""
    r, c, v = entries(40, 30, 3000, 11, scale=5.0)     # many duplicates per entry
    a, b = from_coo(r, c, v, 40, 30), from_coo(*entries(30, 20, 2000, 12, scale=5.0), 30, 20)
    ga = from_coo(r.cuda(), c.cuda(), v.cuda(), 40, 30)
    gb = WeightedCSR(b.ptr.cuda(), b.col.cuda(), b.val.cuda(), b.rows, b.cols)
    for cpu, gpu in ((a, ga), (compose(a, b), compose(ga, gb)), (a.transpose(), ga.transpose())):
        assert torch.equal(cpu.ptr, gpu.ptr.cpu()) and torch.equal(cpu.col, gpu.col.cpu())
        assert torch.equal(cpu.val, gpu.val.cpu())
        assert (cpu.layout.num_short, cpu.layout.num_long) == (gpu.layout.num_short, gpu.layout.num_long)


@pytest.mark.parametrize("seed", range(3))
def test_compose_after_a_gather_equals_the_general_path(seed):
    """A gather first (bins known: one entry a row) takes the short path; the same gather
    without known bins takes the general one: bit for bit the same CSR."""
    r, c, v = entries(9, 20, 40, seed)
    outer = from_coo(r, c, v, 9, 20)                        # duplicates merged, rows empty
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 6, (20,), generator=g)
    gather = one_per_row(idx, torch.rand(20, generator=g), 6)
    plain = WeightedCSR(gather.ptr, gather.col, gather.val, gather.rows, gather.cols)
    fast, general = compose(outer, gather), compose(outer, plain)
    for a, b in ((fast.ptr, general.ptr), (fast.col, general.col), (fast.val, general.val)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert_same(fast, old_compose(outer, gather))
    none = torch.zeros(0, dtype=torch.long)
    empty = compose(from_coo(none, none, None, 3, 20), gather)
    assert empty.nnz == 0 and empty.ptr.tolist() == [0, 0, 0, 0]


def test_from_groups_rejects_shapes_that_do_not_match():
    from hector.kernels.traversal.csr import from_groups
    with pytest.raises(ValueError, match="ptr must be"):
        from_groups(torch.zeros(3, dtype=torch.long), torch.arange(4), None, 3, 4)
