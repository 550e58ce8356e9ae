"""Graph sizes: an impossible build is refused up front with a clear error,
and ids past the int32 range switch the whole graph to int64 indices."""
import time

import pytest
import torch

import hector.nn
from hector import Graph
from hector.graph import build


def test_huge_num_nodes_refused_before_allocating(monkeypatch):
    monkeypatch.delenv(build.ENV_MAX_BUILD_BYTES, raising=False)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"num_nodes=2,147,483,658, 2 edges needs about .* GiB"):
        # On a machine with less than ~100 GiB free (before the fix: a 17 GB allocation).
        monkeypatch.setattr(build, "available_bytes", lambda device: 64 << 30)
        Graph(torch.tensor([[0, 1], [1, 2]]), num_nodes=2 ** 31 + 10)
    assert time.perf_counter() - start < 1.0


def test_build_cap_from_environment(monkeypatch):
    ei = torch.tensor([[0, 1], [1, 2]])
    monkeypatch.setenv(build.ENV_MAX_BUILD_BYTES, "1000")
    with pytest.raises(ValueError, match=r"more than \$HECTOR_MAX_GRAPH_BYTES=1000"):
        Graph(ei, num_nodes=1000)
    assert Graph(ei, num_nodes=3).num_nodes == 3        # 3 nodes fit in 1000 bytes
    monkeypatch.setenv(build.ENV_MAX_BUILD_BYTES, "much")
    with pytest.raises(ValueError, match=r"HECTOR_MAX_GRAPH_BYTES must be an integer"):
        Graph(ei, num_nodes=3)


def test_only_builds_past_the_small_size_read_the_free_memory(monkeypatch):
    """A mini-batch block's build reads no free-memory figure (/proc/meminfo, the driver);
    a build planning more than ``SMALL_BUILD_BYTES`` still does, and is refused past it."""
    monkeypatch.delenv(build.ENV_MAX_BUILD_BYTES, raising=False)
    reads = []
    monkeypatch.setattr(build, "available_bytes", lambda device: reads.append(device) or 1 << 40)
    ei = torch.tensor([[0, 1], [1, 2]])
    Graph(ei, num_nodes=1000)
    assert reads == []
    big = build.SMALL_BUILD_BYTES // 40 + 1          # nodes: > 40 planned bytes each
    assert build.build_nbytes(big, 2, 1) > build.SMALL_BUILD_BYTES
    Graph(ei, num_nodes=big)
    assert reads == [torch.device("cpu")]
    monkeypatch.setattr(build, "available_bytes", lambda device: build.SMALL_BUILD_BYTES)
    with pytest.raises(ValueError, match="more than the cpu memory available now"):
        Graph(ei, num_nodes=big)


def test_estimate_is_not_above_a_measured_build():
    """The estimate must never refuse a build that fits: compare with what a build keeps."""
    g = Graph(torch.randint(0, 50, (2, 400), generator=torch.Generator().manual_seed(0)),
              num_nodes=5000)
    assert build.build_nbytes(5000, 400, 1) >= g.nbytes()


def test_int64_indices_past_int32_range(monkeypatch):
    """Ids that do not fit int32 make every index array int64 (the limit is lowered so the
    test stays tiny); layer results equal those of the int32 graph."""
    torch.manual_seed(0)
    ei = torch.randint(0, 30, (2, 120), generator=torch.Generator().manual_seed(1))
    et = torch.randint(0, 3, (120,), generator=torch.Generator().manual_seed(2))
    x = torch.randn(30, 8)
    small = Graph(ei, edge_type=et, num_nodes=30)
    plain_small = Graph(ei, num_nodes=30)
    monkeypatch.setattr(build, "INT32_LIMIT", 25)
    wide = Graph(ei, edge_type=et, num_nodes=30)
    assert small.index_dtype == torch.int32 and wide.index_dtype == torch.int64
    for name in ("src", "dst", "edge_perm", "rel_ptr"):
        assert getattr(wide, name).dtype == torch.int64, name
    assert wide.csr_in.col.dtype == torch.int64 and wide.compact_src.node.dtype == torch.int64
    layer = hector.nn.RGCNConv(8, 4, 3, backend="torch")
    torch.testing.assert_close(layer(x, wide), layer(x, small), rtol=1e-6, atol=1e-6)
    gat = hector.nn.GATConv(8, 4, heads=2, backend="torch")
    plain_wide = Graph(ei, num_nodes=30)
    assert plain_small.index_dtype == torch.int32 and plain_wide.index_dtype == torch.int64
    torch.testing.assert_close(gat(x, plain_wide), gat(x, plain_small), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_ids_beyond_int32_on_a_large_gpu():
    """The real thing where memory allows: a graph with 2^31 + 10 nodes and ids past 2^31
    builds with int64 indices and keeps every edge (needs ~110 GiB free on one GPU, e.g. an
    H200; skipped elsewhere)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    n = 2 ** 31 + 10
    free = torch.cuda.mem_get_info()[0]
    if free < build.build_nbytes(n, 3, 1) * 1.2:
        pytest.skip(f"needs ~{build.build_nbytes(n, 3, 1) * 1.2 / 2**30:.0f} GiB free on the "
                    f"GPU, {free / 2**30:.0f} GiB are")
    ei = torch.tensor([[0, n - 1, 2 ** 31 + 1], [n - 1, 2 ** 31 + 1, 0]], device="cuda")
    g = Graph(ei, num_nodes=n)
    assert g.index_dtype == torch.int64 and g.src.dtype == torch.int64
    assert torch.equal(g.input_edge_index(), ei)
    assert g.in_degree.max == 1 and int(g.csr_in.ptr[-1]) == 3
    assert int(g.csr_in.ptr[n] - g.csr_in.ptr[n - 1]) == 1    # node 2^31 + 9 has its edge


def test_pointers_by_binary_search_equal_the_counted_ones(monkeypatch):
    """The path for more than 2^31 segments (binary search in chunks) gives the same pointers
    as bincount + cumsum, on a graph small enough to run anywhere."""
    ei = torch.randint(0, 50, (2, 400), generator=torch.Generator().manual_seed(0))
    counted = Graph(ei, num_nodes=57)
    monkeypatch.setattr(build, "SEARCH_SEGMENTS", 10)
    monkeypatch.setattr(build, "SEARCH_CHUNK", 7)
    searched = Graph(ei, num_nodes=57)
    for a, b in ((counted.csr_in.ptr, searched.csr_in.ptr), (counted.csr_out.ptr, searched.csr_out.ptr)):
        assert torch.equal(a, b)
    assert counted.in_degree == searched.in_degree
