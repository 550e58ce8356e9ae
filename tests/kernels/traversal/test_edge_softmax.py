"""The edge-softmax kernels (multi-row and row-per-program variants, forward and backward)
against a per-node float64 loop, and the traversal custom ops under ``torch.library.opcheck``.
CUDA tensors where there is a GPU, the interpreter on the CPU otherwise (conftest.py)."""
import os

import pytest
import torch

import hector
from hector.kernels.attention.custom_ops import graph_handle
from hector.kernels.traversal import launch as L
from hector.kernels.traversal.op import edge_softmax
from hector.kernels.traversal.schedule import row_bins

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TRITON_OK = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
pytestmark = [pytest.mark.skipif(not TRITON_OK, reason="no CUDA and TRITON_INTERPRET unset"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]    # interpreter chatter


def hub_graph(seed=7):
    """9 nodes, 70 edges: node 0 a hub (30 in-edges), node 8 none, the rest 1 to ~12."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.cat([torch.zeros(30, dtype=torch.long), torch.randint(1, 8, (40,), generator=g)])
    src = torch.randint(0, 9, (70,), generator=g)
    return hector.Graph(torch.stack([src, dst]), num_nodes=9).to(DEV)


def force_bins(graph, short_max):
    """Pin the softmax row bins of ``graph`` (the kernels read them from the graph's memo)."""
    graph.derived(("edge_softmax_bins",), lambda: None)
    graph._derived[("edge_softmax_bins",)] = row_bins(graph.csr_in.ptr, short_max, chunk=None)


def per_node_softmax(graph, s, slope):
    x = s.double().cpu()
    if slope is not None:
        x = torch.where(x > 0, x, x * slope)
    want = torch.empty_like(x)
    dst = graph.dst.long().cpu()
    for v in range(graph.num_nodes):
        sel = dst == v
        if sel.any():
            want[sel] = torch.softmax(x[sel], dim=0)
    return want


#: short_max forcing: every row on the multi-row kernel, every row on the row kernel, both.
VARIANTS = {"multi-row": 1000, "row": -1, "mixed": 12}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("slope", [None, 0.2])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_edge_softmax_forward_and_gradient_match_a_per_node_loop(variant, slope, dtype, tol):
    graph = hub_graph()
    force_bins(graph, VARIANTS[variant])
    g = torch.Generator().manual_seed(8)
    s = (torch.randn(graph.num_edges, 3, 1, generator=g) * 3).to(DEV, dtype).requires_grad_()
    got = edge_softmax(graph, s, slope, backend="triton")
    assert got.dtype == dtype
    want = per_node_softmax(graph, s.detach(), slope)
    assert (got.double().cpu() - want).abs().max() < tol
    dy = torch.randn(graph.num_edges, 3, 1, generator=g).to(DEV, dtype)
    gs, = torch.autograd.grad(got, s, dy)
    ref = s.detach().double().cpu().requires_grad_()
    want_gs, = torch.autograd.grad(per_node_softmax_autograd(graph, ref, slope), ref,
                                   dy.double().cpu())
    assert (gs.double().cpu() - want_gs).abs().max() / want_gs.abs().max() < tol * 4


def per_node_softmax_autograd(graph, x, slope):
    if slope is not None:
        x = torch.nn.functional.leaky_relu(x, slope)
    dst = graph.dst.long().cpu()
    parts = torch.zeros_like(x)
    for v in range(graph.num_nodes):
        sel = (dst == v).nonzero().flatten()
        if sel.numel():
            parts = parts.index_put((sel,), torch.softmax(x[sel], dim=0))
    return parts


def test_edge_softmax_bad_inputs_are_named():
    graph = hub_graph()
    s = torch.randn(graph.num_edges, 2, 1, device=DEV)
    with pytest.raises(ValueError, match="s must be"):
        edge_softmax(graph, s[:5])
    with pytest.raises(TypeError, match="graph must be a hector.Graph"):
        edge_softmax(None, s)
    with pytest.raises(TypeError, match="negative_slope"):
        edge_softmax(graph, s, "0.2")


def test_traverse_op_passes_opcheck():
    from hector.kernels.traversal.csr import from_coo
    g = torch.Generator().manual_seed(0)
    r = torch.cat([torch.arange(6), torch.full((20,), 2)]).to(DEV)   # row 2 long, 6-7 empty
    c = torch.randint(0, 9, (26,), generator=g).to(DEV)
    m = from_coo(r, c, None, 8, 9)
    x = torch.randn(9, 2, 3, generator=g).to(DEV).requires_grad_()
    a = torch.randn(8, 2, 3, generator=g).to(DEV).requires_grad_()
    b = torch.randn(6, generator=g).to(DEV).requires_grad_()
    torch.library.opcheck(L.traverse_op, (L.csr_handle(m), x, [a], [-0.5], b))
    torch.library.opcheck(L.traverse_op, (L.csr_handle(m), x, [], [], None))


def test_edge_softmax_ops_pass_opcheck():
    graph = hub_graph()
    g = torch.Generator().manual_seed(1)
    s = torch.randn(graph.num_edges, 2, 1, generator=g).to(DEV).requires_grad_()
    args = (graph_handle(graph), s, 0.2)
    torch.library.opcheck(L.edge_softmax_op, args)
    alpha = L.edge_softmax_op(*args).detach()
    bwd = (graph_handle(graph), s.detach(), alpha, torch.randn_like(alpha), 0.2)
    torch.library.opcheck(L.edge_softmax_backward_op, bwd,
                          test_utils=("test_schema", "test_faketensor"))


def test_traverse_op_rejects_a_freed_handle():
    with pytest.raises(RuntimeError, match="CSR handle"):
        L.traverse_op(10 ** 9, torch.randn(3, 2, device=DEV), [], [], None)
