"""Regression tests of a differential audit of the Triton backend against the torch backend
on unusual but valid inputs: each layer built with one backend, its state_dict copied into the
other, outputs and the gradients of the features and of every parameter compared (fp32,
relative error < 1e-4).  Only the inputs that failed are here (the probes that found nothing
are not repeated); graphs are tiny, the Triton backend runs under the interpreter on CPUs."""
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, rel_err  # noqa: E402

from hector import Graph                                        # noqa: E402
from hector.loader import NeighborLoader                        # noqa: E402
from hector.nn import AGNNConv, GATConv, TransformerConv        # noqa: E402

TRITON_OK = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
pytestmark = [
    pytest.mark.skipif(not TRITON_OK, reason="no CUDA and TRITON_INTERPRET is not set "
                                             "(tests/conftest.py sets it unless "
                                             "TRITON_INTERPRET=0 was given)"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),       # interpreter chatter
]
TOL = 1e-4


def _pair(make):
    """The same layer on the torch and the Triton backend, random non-trivial parameters."""
    torch.manual_seed(0)
    ref = make("torch")
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.5)
    ours = make("triton").to(device_for("triton"))
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _grads(m, xs, call):
    """(output, gradients of ``xs`` and of every parameter) of ``sum(call(m, xs) * w)``."""
    dev = next(m.parameters()).device
    xs = [x.to(dev).requires_grad_() for x in xs]
    out = call(m, xs)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(dev)
    params = [p for p in m.parameters()]
    gs = torch.autograd.grad((out * w).sum(), xs + params)
    return out.detach().cpu(), [g.cpu() for g in gs]


def _compare(ref, ours, xs, call):
    out_ref, g_ref = _grads(ref, [x.clone() for x in xs], call)
    out, g = _grads(ours, [x.clone() for x in xs], call)
    assert out.shape == out_ref.shape and torch.isfinite(out).all()
    assert rel_err(out, out_ref) < TOL
    # (a key bias shifts every score of a row alike: its exact gradient is 0, rounding noise
    # is measured against a hundredth of the largest gradient)
    floor = 1e-2 * max([float(b.abs().max()) for b in g_ref if b.numel()] + [1e-10])
    for a, b in zip(g, g_ref):
        assert a.shape == b.shape
        if b.numel():
            assert float((a - b).abs().max()) / max(float(b.abs().max()), floor) < TOL


ATTENTION = {
    "gat": lambda backend: GATConv(5, 3, heads=3, backend=backend),
    "agnn": lambda backend: AGNNConv(backend=backend),
    "transformer": lambda backend: TransformerConv(5, 3, heads=3, concat=False, backend=backend),
}


@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_attention_layers_on_blocks_of_a_relational_graph(kind):
    """GAT, AGNN and Transformer read no relations, but a block sampled from a graph with
    several relations keeps its edge types: called as ``((x_src, x_dst), block)`` with a
    separate ``x_dst`` (the union graph), the union graph was built with those edge types and
    ``num_relations=1`` and raised "edge_type contains id 2, out of range" on both backends
    (``nn._common.as_one_graph``)."""
    ei = torch.tensor([[0, 1, 2, 4, 5, 5, 6, 7, 8, 3, 2, 9],
                       [1, 2, 3, 3, 3, 9, 9, 0, 9, 8, 8, 4]])
    et = torch.tensor([0, 2, 1, 2, 0, 1, 2, 2, 0, 1, 2, 0])
    graph = Graph(ei, edge_type=et, num_nodes=10, num_relations=3)
    block = next(iter(NeighborLoader(graph, [2], input_nodes=torch.tensor([3, 9, 8]),
                                     batch_size=3, seed=0))).blocks[0]
    assert int(block.input_edge_type().max()) > 0
    n_dst = block.num_dst_nodes
    x = torch.randn(block.num_nodes, 5, generator=torch.Generator().manual_seed(2))

    def call(m, xs):
        (x,) = xs
        return m((x, x[:n_dst].clone()), block.to(x.device))

    ref, ours = _pair(ATTENTION[kind])
    _compare(ref, ours, [x], call)
    # the same math as the block's one-x form
    want = ref(x, block)
    assert rel_err(call(ref, [x]).detach(), want.detach()) < TOL


@pytest.mark.parametrize("heads", [1, 3])
def test_gat_on_a_graph_without_nodes(heads):
    """A graph of 0 nodes: the torch backend returns an empty output and zero gradients; the
    Triton backend's backward of the bias that the attention kernels add (heads
    concatenated) raised a RuntimeError."""
    ref, ours = _pair(lambda backend: GATConv(5, 3, heads=heads, backend=backend))
    ei = torch.zeros(2, 0, dtype=torch.long)
    _compare(ref, ours, [torch.randn(0, 5)],
             lambda m, xs: m(xs[0], ei.to(xs[0].device)))
