"""Attention dropout with its seed on the device: the default seed is drawn by
torch's generator for the features' device (no host read, so a captured CUDA graph redraws it
on every replay), the kernels read it from memory, and the mask it gives is the torch
reference's.  Tiny graphs: the Triton kernels run under the interpreter on the CPU."""
import pytest
import torch

from hector.graph import Graph
from hector.kernels.attention.op import draw_seed, edge_attention
from hector.kernels.attention.reference import dropout_keep
from hector.kernels.attention.spec import Schedule

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")    # interpreter chatter
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ROWS, DEGREE, HEADS = 12, 20, 2


def dense_graph():
    """Every destination 0..ROWS-1 has DEGREE incoming edges (240 edges)."""
    g = torch.Generator().manual_seed(0)
    dst = torch.arange(ROWS).repeat_interleave(DEGREE)
    src = torch.randint(0, ROWS, (ROWS * DEGREE,), generator=g)
    return Graph(torch.stack([src, dst]), num_nodes=ROWS).to(DEVICE)


def kept_fraction_per_row(graph, p, backend, seed=None):
    """With no score terms alpha is uniform, and with v = 1 each output is (kept edges of the
    row) / ((1 - p) * degree): the kernel's own mask, read back through its result."""
    v = torch.ones(ROWS, HEADS, 1, device=DEVICE)
    out = edge_attention(graph, v, dropout=p, training=True, seed=seed, backend=backend)
    return out[:, :, 0] * (1 - p)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_masked_fraction_matches_p_and_counts_whole_edges(backend):
    graph = dense_graph()
    p = 0.3
    torch.manual_seed(0)
    kept = kept_fraction_per_row(graph, p, backend)
    counts = kept * DEGREE
    # the mask drops whole edges: every row keeps an integer number of them
    torch.testing.assert_close(counts, counts.round(), atol=1e-4, rtol=0)
    # 480 (edge, head) draws: the kept fraction is 0.7 within 4 standard deviations (0.084)
    assert abs(kept.mean().item() - (1 - p)) < 0.084


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_default_seed_is_fresh_per_call_and_reproducible_under_manual_seed(backend):
    graph = dense_graph()
    torch.manual_seed(5)
    a = kept_fraction_per_row(graph, 0.5, backend)
    b = kept_fraction_per_row(graph, 0.5, backend)
    torch.manual_seed(5)
    again = kept_fraction_per_row(graph, 0.5, backend)
    assert not torch.equal(a, b)             # a fresh mask per call
    torch.testing.assert_close(again, a)     # the same stream after the same manual_seed


def test_draw_seed_is_a_device_tensor_from_the_device_generator():
    torch.manual_seed(3)
    s = draw_seed(DEVICE)
    assert s.device.type == DEVICE.type and s.dtype == torch.int64 and s.shape == (1,)
    assert 0 <= int(s) < 2 ** 31 - 1
    torch.manual_seed(3)
    assert torch.equal(draw_seed(DEVICE), s)


@pytest.mark.parametrize("strategy", ["node", "edge"])
def test_triton_with_a_seed_tensor_equals_the_reference_with_the_same_mask(strategy):
    """Forward and every gradient of the Triton kernels given a seed tensor equal the torch
    reference given the same seed as an int (so the same mask)."""
    graph = dense_graph()
    g = torch.Generator().manual_seed(1)
    make = lambda *shape: torch.randn(*shape, generator=g).to(DEVICE).requires_grad_()  # noqa: E731
    v, q, k = make(ROWS, HEADS, 3), make(ROWS, HEADS, 4), make(ROWS, HEADS, 4)
    a_src, a_dst = make(ROWS, HEADS), make(ROWS, HEADS)
    seed = torch.tensor([987654321], device=DEVICE)
    sched = Schedule(strategy, block_e=8, block_h=2, block_dk=4, block_dv=4, chunk=13)
    kw = dict(q=q, k=k, a_src=a_src, a_dst=a_dst, scale=0.5, negative_slope=0.2, dropout=0.4,
              training=True)
    got = edge_attention(graph, v, **kw, seed=seed, backend="triton", schedule=sched)
    want = edge_attention(graph, v, **kw, seed=987654321, backend="torch")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    gout = torch.randn(got.shape, generator=g).to(DEVICE)
    inputs = (v, q, k, a_src, a_dst)
    for name, a, b in zip(("v", "q", "k", "a_src", "a_dst"),
                          torch.autograd.grad(got, inputs, gout),
                          torch.autograd.grad(want, inputs, gout)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    # and the mask really is the seed's: another seed gives another output
    other = edge_attention(graph, v, **kw, seed=seed + 1, backend="triton", schedule=sched)
    assert not torch.allclose(other, got)


def test_custom_op_path_reads_the_seed_tensor():
    """The hector::edge_attention custom op (no pinned schedule) with a seed tensor equals
    the reference with that seed; its hash mask is the reference's dropout_keep."""
    graph = dense_graph()
    v = torch.randn(ROWS, HEADS, 2, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    seed = torch.tensor([1234], device=DEVICE)
    got = edge_attention(graph, v, dropout=0.25, training=True, seed=seed, backend="triton")
    want = edge_attention(graph, v, dropout=0.25, training=True, seed=1234, backend="torch")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    keep = dropout_keep(seed, torch.arange(graph.num_edges, device=DEVICE), HEADS, 0.25)
    assert torch.equal(keep, dropout_keep(1234, torch.arange(graph.num_edges, device=DEVICE),
                                          HEADS, 0.25))


@pytest.mark.parametrize("seed, exc, match", [
    (torch.tensor([1.5]), TypeError, "seed"),
    (torch.tensor([1, 2]), TypeError, "seed"),
    (-3, ValueError, "seed"),
])
def test_bad_seeds_name_the_argument(seed, exc, match):
    graph = dense_graph()
    v = torch.randn(ROWS, HEADS, 2).to(DEVICE)
    if isinstance(seed, torch.Tensor):
        seed = seed.to(DEVICE)
    with pytest.raises(exc, match=match):
        edge_attention(graph, v, dropout=0.25, training=True, seed=seed, backend="torch")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_attention_dropout_draws_a_new_mask_on_every_replay():
    from hector.train.capture import capture_graph
    graph = dense_graph()
    v = torch.ones(ROWS, HEADS, 1, device=DEVICE)

    def call():
        seed = draw_seed(DEVICE)
        out = edge_attention(graph, v, dropout=0.3, training=True, seed=seed, backend="triton")
        return out, seed
    cuda_graph, (out, seed) = capture_graph(call)
    seen = []
    for _ in range(3):
        cuda_graph.replay()
        want = edge_attention(graph, v, dropout=0.3, training=True, seed=int(seed),
                              backend="torch")
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
        seen.append(out.clone())
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    # the default (seed=None) path draws inside the captured graph too
    cuda_graph, out = capture_graph(lambda: edge_attention(
        graph, v, dropout=0.3, training=True, backend="triton"))
    cuda_graph.replay()
    first = out.clone()
    cuda_graph.replay()
    assert not torch.equal(first, out)
