"""``hector.kernels.traversal``: weighted CSRs (construction, composition) against dense
matrices, the Triton traversal kernel (forward and every gradient) against a dense float64
reference, bf16 storage with fp32 accumulation, and input validation."""
import os

import pytest
import torch

from hector.kernels.traversal.csr import compose, from_coo, scaled
from hector.kernels.traversal.op import traverse

TRITON_OK = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="no CUDA and TRITON_INTERPRET unset")


def dense(m):
    d = torch.zeros(m.rows, m.cols, dtype=torch.float64)
    for r in range(m.rows):
        for j in range(int(m.ptr[r]), int(m.ptr[r + 1])):
            d[r, int(m.col[j])] += float(m.val[j])
    return d


def random_map(rows, cols, nnz, seed):
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, rows, (nnz,), generator=g)
    c = torch.randint(0, cols, (nnz,), generator=g)
    v = torch.rand(nnz, generator=g) + 0.5
    want = torch.zeros(rows, cols, dtype=torch.float64)
    want.index_put_((r, c), v.double(), accumulate=True)
    return from_coo(r, c, v, rows, cols), want


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


@needs_triton
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_traverse_triton_forward_and_gradients(dtype, tol):
    # 13 output rows (some empty), 37 input rows, 120 entries: rows longer than BLOCK_E=16.
    m, dm = random_map(13, 37, 120, 3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(37, 2, 3, generator=g).to(dtype).requires_grad_()
    a = torch.randn(13, 2, 3, generator=g).to(dtype).requires_grad_()
    b = torch.randn(6, generator=g).to(dtype).requires_grad_()
    out = traverse(m, x, [a], [-1.0], b, backend="triton")
    assert out.dtype == dtype
    want = (dm @ x.double().reshape(37, 6) - a.double().reshape(13, 6) + b.double()).reshape(13, 2, 3)
    scale = want.abs().max()
    assert (out.double() - want).abs().max() / scale < tol
    dy = torch.randn(13, 2, 3, generator=g).to(dtype)
    gx, ga, gb = torch.autograd.grad(out, (x, a, b), dy)
    dyd = dy.double().reshape(13, 6)
    assert (gx.double().reshape(37, 6) - dm.t() @ dyd).abs().max() / (dm.t() @ dyd).abs().max() < tol
    assert torch.equal(ga.double(), -dy.double())
    assert (gb.double() - dyd.sum(0)).abs().max() / dyd.sum(0).abs().max() < tol


@needs_triton
def test_triton_matches_torch_backend():
    m, _ = random_map(8, 20, 50, 5)
    x = torch.randn(20, 1, 5)
    got = traverse(m, x, backend="triton")
    want = traverse(m, x, backend="torch")
    assert torch.allclose(got, want, atol=1e-5)


def test_bad_inputs_are_named():
    m, _ = random_map(4, 6, 10, 6)
    x = torch.randn(6, 1, 3)
    with pytest.raises(TypeError, match="m must be a WeightedCSR"):
        traverse(None, x)
    with pytest.raises(ValueError, match="x must be"):
        traverse(m, torch.randn(5, 1, 3))
    with pytest.raises(ValueError, match=r"addends\[0\]"):
        traverse(m, x, [torch.randn(3, 1, 3)])
    with pytest.raises(ValueError, match="coefs"):
        traverse(m, x, [torch.randn(4, 1, 3)], [1.0, 2.0])
    with pytest.raises(ValueError, match="bias"):
        traverse(m, x, bias=torch.randn(4))
    with pytest.raises(TypeError, match="x must be a floating"):
        traverse(m, torch.ones(6, 1, 3, dtype=torch.int64))


@needs_triton
@pytest.mark.parametrize("slope", [None, 0.2])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_edge_softmax_kernel_matches_a_per_node_loop(slope, dtype, tol):
    import hector
    from hector.kernels.traversal.op import edge_softmax
    g = torch.Generator().manual_seed(7)
    # 9 nodes, 70 edges: node 0 a hub (more than BLOCK_E=16 in-edges), node 8 none.
    dst = torch.cat([torch.zeros(30, dtype=torch.long), torch.randint(1, 8, (40,), generator=g)])
    src = torch.randint(0, 9, (70,), generator=g)
    graph = hector.Graph(torch.stack([src, dst]), num_nodes=9)
    s = (torch.randn(graph.num_edges, 3, 1, generator=g) * 3).to(dtype)
    got = edge_softmax(graph, s, slope, backend="triton")
    x = s.double()
    if slope is not None:
        x = torch.where(x > 0, x, x * slope)
    want = torch.empty_like(x)
    gdst = graph.dst.long()
    for v in range(9):
        sel = gdst == v
        if sel.any():
            want[sel] = torch.softmax(x[sel], dim=0)
    assert got.dtype == dtype
    assert (got.double() - want).abs().max() < tol
    ref = edge_softmax(graph, s, slope, backend="torch")
    assert (got.double() - ref.double()).abs().max() < tol
    with pytest.raises(ValueError, match="s must be"):
        edge_softmax(graph, s[:5], slope)
