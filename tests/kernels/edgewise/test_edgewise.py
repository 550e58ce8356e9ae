"""``hector.kernels.edgewise``: every form (map, node-parallel reduce, softmax), access scheme
(own row, index arrays, an index of an index, per-slice and unsliced weights) and statement
of the generated kernel against the same math written directly in torch (float64), fp32 and
bf16 storage; the family's torch reference against the same; input validation."""
import os

import pytest
import torch
import torch.nn.functional as F

from hector.kernels.edgewise.op import edgewise
from hector.kernels.edgewise.spec import EdgewiseSpec, node

TRITON_OK = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="no CUDA and TRITON_INTERPRET unset")
DEV = "cuda" if torch.cuda.is_available() else "cpu"

# 9 nodes (two without incoming edges), 70 edges (rows longer than BLOCK_E=16), 3
# relations, 2 heads of 3 features: H and D are not powers of two, so padding lanes exist.
N, E, R, H, D = 9, 70, 3, 2, 3
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def _graph():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, N, (E,), generator=g)
    dst = torch.randint(0, N - 2, (E,), generator=g)
    dst[:30] = 3                      # one long row
    et = torch.randint(0, R, (E,), generator=g)
    return src, dst, et


def _csr(rows_of, n):
    ptr = torch.zeros(n + 1, dtype=torch.long)
    ptr[1:] = torch.bincount(rows_of, minlength=n).cumsum(0)
    return ptr, torch.argsort(rows_of, stable=True)


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _check(spec, inputs, arrays, rows, want, dtype):
    ins = [t.to(DEV, dtype) for t in inputs]
    arrs = [a.to(DEV) for a in arrays]
    # The expected values are computed from the inputs as stored (bf16 rounding included).
    for backend in ("triton", "torch"):
        got = edgewise(spec, ins, arrs, rows, dtype, backend=backend).double().cpu()
        assert got.shape == want.shape, backend
        err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))
        assert err < TOL[dtype], (backend, err)


def _stored(t, dtype):
    return t.to(dtype).double()


OWN, ENTRY = node("own"), node("entry")


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_map_dot_of_gathered_rows_times_per_relation_vector(dtype):
    """HGT's score: <q[dst], k[src]> * p[relation] / sqrt(d), per edge."""
    src, dst, et = _graph()
    q, k, p = _rand(N, H, D, seed=1), _rand(N, H, D, seed=2), _rand(R, H, 1, seed=3)
    Q = node("load", node("index", OWN, array=0), shape=(H, D), input=0)
    K = node("load", node("index", OWN, array=1), shape=(H, D), input=1)
    P = node("weight", node("index", OWN, array=2), shape=(H, 1), input=2)
    root = node("scale", node("mul", node("dot", Q, K, shape=(H, 1)), P, shape=(H, 1)),
                shape=(H, 1), factor=0.5)
    qs, ks, ps = (_stored(t, dtype) for t in (q, k, p))
    want = (qs[dst] * ks[src]).sum(-1, keepdim=True) * ps[et] * 0.5
    _check(EdgewiseSpec("map", root, 3, 3), [q, k, p], [dst, src, et], E, want, dtype)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_map_elementwise_chain_through_an_index_of_an_index(dtype):
    """RGAT's backward statement: (g - y[dst]) * a * leaky_relu_grad(s), plus a compact row
    read through the compact map and then its node (an index of an index), gelu, sigmoid,
    exp, a subtraction and an unsliced weight vector."""
    src, dst, et = _graph()
    C = 12
    cmap = torch.randint(0, C, (E,), generator=torch.Generator().manual_seed(4))
    cnode = torch.randint(0, N, (C,), generator=torch.Generator().manual_seed(5))
    a, gr, s = _rand(E, H, 1, seed=6), _rand(E, H, 1, seed=7), _rand(E, H, 1, seed=8)
    y, x, w = _rand(N, H, 1, seed=9), _rand(N, H, D, seed=10), _rand(H, D, seed=11)
    load = lambda i, rows, shape: node("load", rows, shape=shape, input=i)   # noqa: E731
    t = node("mul", node("mul", load(0, OWN, (H, 1)), node(
        "sub", load(1, OWN, (H, 1)), load(3, node("index", OWN, array=0), (H, 1)),
        shape=(H, 1)), shape=(H, 1)),
        node("leaky_relu_grad", load(2, OWN, (H, 1)), shape=(H, 1), slope=0.2), shape=(H, 1))
    far = load(4, node("index", node("index", OWN, array=1), array=2), (H, D))
    u = node("add", node("gelu", far, shape=(H, D)),
             node("sigmoid", node("exp", node("weight", node("zero"), shape=(H, D), input=5),
                                  shape=(H, D)), shape=(H, D)), shape=(H, D))
    root = node("mul", t, u, shape=(H, D))
    a_, g_, s_, y_, x_, w_ = (_stored(v, dtype) for v in (a, gr, s, y, x, w))
    lrg = torch.where(s_ > 0, 1.0, 0.2).double()
    want = (a_ * (g_ - y_[dst]) * lrg) * (F.gelu(x_[cnode[cmap]]) + torch.sigmoid(
        torch.exp(w_)))
    _check(EdgewiseSpec("map", root, 6, 3), [a, gr, s, y, x, w], [dst, cmap, cnode], E,
           want, dtype)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mean", [False, True])
def test_reduce_into_destination_rows_over_the_csr(dtype, mean):
    """sum (mean) over each node's incoming edges of gelu_grad(x_e) * k[src]; a reduce_to
    over heads and features afterwards, and the own row's term added once."""
    src, dst, et = _graph()
    ptr, perm = _csr(dst, N)
    x, k, b = _rand(E, H, 1, seed=12), _rand(N, H, D, seed=13), _rand(N, 1, 1, seed=14)
    X = node("load", ENTRY, shape=(H, 1), input=0)
    K = node("load", node("index", ENTRY, array=2), shape=(H, D), input=1)
    msg = node("mul", node("gelu_grad", X, shape=(H, 1)), K, shape=(H, D))
    agg = node("scatter", msg, shape=(H, D), ptr=0, perm=1, mean=mean)
    root = node("add", node("reduce_to", agg, shape=(1, 1)),
                node("load", OWN, shape=(1, 1), input=2), shape=(1, 1))
    x_, k_, b_ = (_stored(v, dtype) for v in (x, k, b))
    cdf = 0.5 * (1 + torch.erf(x_ / 2 ** 0.5))
    m = (cdf + x_ * torch.exp(-0.5 * x_ * x_) / (2 * torch.pi) ** 0.5) * k_[src]
    agg_w = torch.zeros(N, H, D, dtype=torch.float64).index_add(0, dst, m)
    if mean:
        agg_w = agg_w / torch.bincount(dst, minlength=N).clamp(min=1).view(-1, 1, 1)
    want = agg_w.sum((1, 2), keepdim=True) + b_
    _check(EdgewiseSpec("reduce", root, 3, 3), [x, k, b], [ptr, perm, src], N, want, dtype)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_of_a_gathered_score_over_each_destination(dtype):
    """RGAT's group weights' softmax: leaky_relu(a_dst[dst] + a_src[src]) over N(v), written
    per edge; nodes without incoming edges are skipped, every edge written."""
    src, dst, et = _graph()
    ptr, perm = _csr(dst, N)
    ad, as_ = _rand(N, H, 1, seed=15), _rand(N, H, 1, seed=16)
    score = node("add", node("load", node("index", ENTRY, array=2), shape=(H, 1), input=0),
                 node("load", node("index", ENTRY, array=3), shape=(H, 1), input=1),
                 shape=(H, 1))
    root = node("softmax", node("leaky_relu", score, shape=(H, 1), slope=0.2), shape=(H, 1),
                ptr=0, perm=1)
    s = F.leaky_relu(_stored(ad, dtype)[dst] + _stored(as_, dtype)[src], 0.2)
    mx = torch.full((N, H, 1), -1e9, dtype=torch.float64).scatter_reduce(
        0, dst.view(-1, 1, 1).expand_as(s), s, "amax")
    ex = torch.exp(s - mx[dst])
    want = ex / torch.zeros(N, H, 1, dtype=torch.float64).index_add(0, dst, ex)[dst]
    _check(EdgewiseSpec("softmax", root, 2, 4), [ad, as_], [ptr, perm, dst, src], E, want,
           dtype)


@needs_triton
def test_expand_and_broadcast_of_a_single_head_value():
    """expand (H, 1) -> (H, D) and a (1, D) row times an (H, 1) row: replicated lanes."""
    a, b = _rand(E, H, 1, seed=17), _rand(E, 1, D, seed=18)
    root = node("mul", node("expand", node("load", OWN, shape=(H, 1), input=0), shape=(H, D)),
                node("load", OWN, shape=(1, D), input=1), shape=(H, D))
    want = (a.double() * b.double()).expand(E, H, D)
    _check(EdgewiseSpec("map", root, 2, 0), [a, b], [], E, want, torch.float32)


def test_bad_input_is_named():
    root = node("load", OWN, shape=(H, 1), input=0)
    spec = EdgewiseSpec("map", root, 1, 0)
    x = torch.randn(E, H, 1)
    with pytest.raises(TypeError, match="spec"):
        edgewise("map", [x], [], E, torch.float32)
    with pytest.raises(ValueError, match="1 inputs and 0 arrays"):
        edgewise(spec, [x, x], [], E, torch.float32)
    with pytest.raises(TypeError, match=r"inputs\[0\]"):
        edgewise(spec, [x.long()], [], E, torch.float32)
    with pytest.raises(ValueError, match="out_rows"):
        edgewise(spec, [x], [], -1, torch.float32)
    spec2 = EdgewiseSpec("map", node("load", node("index", OWN, array=0), shape=(H, 1),
                                     input=0), 1, 1)
    with pytest.raises(TypeError, match=r"arrays\[0\]"):
        edgewise(spec2, [x], [torch.zeros(E)], E, torch.float32)
    with pytest.raises(ValueError, match="form"):
        EdgewiseSpec("scan", root, 1, 0)
    with pytest.raises(ValueError, match="shapes"):
        EdgewiseSpec("map", node("add", root, node("load", OWN, shape=(3, 1), input=1),
                                 shape=(3, 1)), 2, 0)


@needs_triton
# (the interpreter warns about 0/0 in masked padding lanes; they are never stored)
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_remaining_unary_ops_and_division(dtype):
    """neg, tanh, relu and div (a mean's divisor read per row) on node rows."""
    x, c = _rand(N, H, D, seed=19), _rand(N, 1, 1, seed=20).abs() + 0.5
    X = node("load", OWN, shape=(H, D), input=0)
    root = node("div", node("add", node("neg", node("tanh", X, shape=(H, D)), shape=(H, D)),
                            node("relu", X, shape=(H, D)), shape=(H, D)),
                node("load", OWN, shape=(1, 1), input=1), shape=(H, D))
    x_, c_ = _stored(x, dtype), _stored(c, dtype)
    want = (-torch.tanh(x_) + torch.relu(x_)) / c_
    _check(EdgewiseSpec("map", root, 2, 0), [x, c], [], N, want, dtype)
