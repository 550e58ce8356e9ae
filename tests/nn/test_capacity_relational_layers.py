"""The compiled relational layers on relational capacity blocks (``hector.graph.capacity``):
two layers of RGCN or RGAT give the ordinary blocks' destination rows and every parameter
gradient, on both backends (Triton's interpreter on the CPU), for a full batch and the short
last one; on the Triton path nothing is read back to the host (segment GEMMs on device
bounds, traversal CSRs built without reads, one bin of whole rows)."""
import sys
from pathlib import Path

import pytest
import torch

from hector.loader import NeighborLoader
from hector.nn import RGATConv, RGCNConv

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "loader"))
from helpers import host_reads  # noqa: E402
from test_neighbor_loader import hetero_graph  # noqa: E402

F = 8
#: The GPU, else the CPU (Triton's interpreter there, set by conftest).
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _layers(kind, R, backend):
    if kind == "rgcn":
        return torch.nn.ModuleList([RGCNConv(F, F, R, backend=backend),
                                    RGCNConv(F, 4, R, num_bases=2, backend=backend)])
    return torch.nn.ModuleList([RGATConv(F, 4, R, heads=2, backend=backend),
                                RGATConv(8, 4, R, backend=backend)])


def _run(model, x, blocks):
    h = x
    for i, (conv, block) in enumerate(zip(model, blocks)):
        h = conv(h, block)
        h = torch.relu(h) if i == 0 else h
    return h


def _grads(model):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            for p in model.parameters()]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kind", ["rgcn", "rgat"])
def test_capacity_blocks_give_the_ordinary_blocks_results(kind, backend):
    torch.manual_seed(0)
    graph = hetero_graph().to(DEV)
    model = _layers(kind, graph.num_relations, backend).to(DEV)
    x = torch.randn(graph.num_nodes, F, device=DEV)
    loader = NeighborLoader(graph, [3, 2], batch_size=9, shuffle=True, seed=2, static=True)
    batches = list(loader.static_batches())
    assert len(batches) > 1
    for sb in (batches[0], batches[-1]):            # a full batch and the short last one
        batch = sb.to_batch(graph, loader.node_type_ptr, graph.node_type_names)
        model.zero_grad()
        ref = _run(model, x[batch.n_id], batch.blocks)
        ref.square().sum().backward()
        want = _grads(model)
        model.zero_grad()
        blocks = sb.capacity_blocks(graph)
        n = batch.batch_size
        with host_reads() as seen:
            out = _run(model, x[sb.n_id], blocks)
            mask = (torch.arange(out.shape[0], device=DEV) < n)[:, None]
            torch.where(mask, out, 0.0).square().sum().backward()
        assert out.shape[0] == loader.batch_size
        torch.testing.assert_close(out[:n], ref, atol=1e-5, rtol=1e-4)
        for got, w in zip(_grads(model), want):
            torch.testing.assert_close(got, w, atol=1e-5, rtol=1e-4)
        if backend == "triton":
            assert seen == [], [(name, where) for name, _, where in seen]
