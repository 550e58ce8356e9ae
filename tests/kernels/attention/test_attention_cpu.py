"""The CPU path of the torch attention backend (sparse CSR products, hand-written backward)
in the cases its layout makes awkward: canonical edge order differing from the CSR order
(several relations), gradients asked for only some inputs, tiny multigraphs, no edges, low
precision; and against the edge-wise formulation the backend keeps for other devices."""
import math
import subprocess
import sys

import pytest
import torch

from hector import Graph
from hector.kernels.attention import reference as torch_attention
from hector.kernels.attention.op import edge_attention
from test_edge_attention import TERMS, assert_close, make_inputs, naive, outputs_and_grads

CPU = torch.device("cpu")


def relational_graph(num_nodes=30, num_edges=200, relations=3, seed=5):
    """Edges of several relations: the canonical order sorts by relation first, so CSR
    position and canonical edge id differ (dropout hashes the canonical id)."""
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, num_nodes - 2, (2, num_edges), generator=gen)
    et = torch.randint(0, relations, (num_edges,), generator=gen)
    return Graph(ei, edge_type=et, num_nodes=num_nodes, num_relations=relations)


def inputs_on_cpu(graph, heads, terms, dtype=torch.float64, seed=1):
    # make_inputs puts tensors on the test-wide device; this file is about the CPU path
    return {k: t.detach().cpu().requires_grad_() for k, t in
            make_inputs(graph, heads, terms, dtype=dtype, seed=seed).items()}


@pytest.mark.parametrize("heads", [1, 3])
def test_several_relations_with_dropout(heads):
    g = relational_graph()
    assert not torch.equal(g.csr_in.eid.long(), torch.arange(g.num_edges))   # the awkward case
    x = inputs_on_cpu(g, heads, "all")
    kw = dict(TERMS["all"][1], dropout=0.3, seed=9)
    ref = outputs_and_grads(lambda **t: naive(g, **t, **kw), x)
    got = outputs_and_grads(lambda **t: edge_attention(g, **t, **kw, training=True,
                                                       backend="torch"), x)
    for name, a, b in zip(("out",) + tuple(x), got, ref):
        assert_close(a, b, 1e-10, name)


@pytest.mark.parametrize("terms", ["gat", "transformer", "all", "none"])
def test_matches_the_edgewise_formulation(terms):
    """Two independent implementations (sparse products vs gathers and scatters with torch's
    autograd) on a graph large enough for many rows of every degree."""
    gen = torch.Generator().manual_seed(3)
    n = 300
    ei = torch.cat([torch.randint(0, n, (2, 3000), generator=gen),
                    torch.stack([torch.randint(0, n, (400,), generator=gen),
                                 torch.full((400,), 7)])], 1)      # one row of degree > 400
    g = Graph(ei, num_nodes=n + 5)                                 # five rows without edges
    heads = 4
    x = inputs_on_cpu(g, heads, terms, dtype=torch.float32)
    kw = dict(TERMS[terms][1])
    scale, slope = kw.get("scale", 1.0), kw.get("negative_slope")

    def edgewise(**t):
        return torch_attention._edge_attention_gather(
            g, t["v"], t.get("q"), t.get("k"), t.get("a_src"), t.get("a_dst"), scale, slope,
            0.3, 4, torch.float32)

    ref = outputs_and_grads(edgewise, x)
    got = outputs_and_grads(lambda **t: edge_attention(g, **t, **kw, dropout=0.3, seed=4,
                                                       training=True, backend="torch"), x)
    for name, a, b in zip(("out",) + tuple(x), got, ref):
        assert_close(a, b, 1e-5, name)


@pytest.mark.parametrize("wanted", ["v", "q", "k", "a_src", "a_dst"])
def test_gradient_of_one_input(wanted):
    """The backward skips the gradients nobody asked for; the one asked for is still right."""
    g = relational_graph(relations=1)
    x = {k: t.detach().requires_grad_(k == wanted)
         for k, t in inputs_on_cpu(g, 2, "all").items()}
    kw = TERMS["all"][1]
    gout = torch.randn(g.num_nodes, 2, 6, dtype=torch.float64)
    want, = torch.autograd.grad(naive(g, **x, **kw), x[wanted], gout)
    got, = torch.autograd.grad(edge_attention(g, **x, **kw, backend="torch"), x[wanted], gout)
    assert_close(got, want, 1e-10, wanted)


@pytest.mark.parametrize("num_nodes,edges", [(1, [[0, 0, 0], [0, 0, 0]]),
                                             (2, [[0, 1, 1, 0, 1], [0, 0, 0, 1, 1]])])
def test_tiny_multigraphs(num_nodes, edges):
    """More entries than the dense [N*H, N*H] matrix has cells (torch's sampled_addmm refuses
    those): the q.k scores and their gradients take the gather fallback."""
    g = Graph(torch.tensor(edges), num_nodes=num_nodes)
    x = inputs_on_cpu(g, 1, "transformer")
    kw = TERMS["transformer"][1]
    ref = outputs_and_grads(lambda **t: naive(g, **t, **kw), x)
    got = outputs_and_grads(lambda **t: edge_attention(g, **t, **kw, backend="torch"), x)
    for name, a, b in zip(("out",) + tuple(x), got, ref):
        assert_close(a, b, 1e-10, name)


def test_graph_without_edges():
    g = Graph(torch.zeros(2, 0, dtype=torch.long), num_nodes=4)
    x = inputs_on_cpu(g, 2, "all")
    out, *grads = outputs_and_grads(lambda **t: edge_attention(
        g, **t, **TERMS["all"][1], backend="torch"), x)
    assert out.shape == (4, 2, 6) and not out.any()
    assert not any(gr.any() for gr in grads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype):
    """Computed in float32, returned (and differentiated) in the inputs' dtype."""
    g = relational_graph(relations=1)
    x = inputs_on_cpu(g, 2, "transformer", dtype=dtype)
    kw = TERMS["transformer"][1]
    got = outputs_and_grads(lambda **t: edge_attention(g, **t, **kw, backend="torch"), x)
    x64 = {k: t.detach().double().requires_grad_() for k, t in x.items()}
    ref = outputs_and_grads(lambda **t: naive(g, **t, **kw), x64)
    for name, a, b in zip(("out",) + tuple(x), got, ref):
        assert a.dtype == dtype, name
        assert_close(a, b, 2e-2, name)


def test_no_warning_reaches_the_user():
    """torch calls sparse CSR "beta" in a UserWarning: the backend keeps it to itself."""
    code = ("import torch, hector; from hector.kernels.attention.op import edge_attention; "
            "g = hector.Graph(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3); "
            "v = torch.randn(3, 2, 4, requires_grad=True); "
            "edge_attention(g, v, v, v, backend='torch').sum().backward()")
    run = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


def test_scale_reaches_the_scores():
    """A wrong or dropped scale would still give a valid softmax; check one row by hand."""
    g = Graph(torch.tensor([[1, 2], [0, 0]]), num_nodes=3)
    q = torch.tensor([[[1.0]], [[0.0]], [[0.0]]])
    k = torch.tensor([[[0.0]], [[2.0]], [[-1.0]]])
    v = torch.tensor([[[0.0]], [[1.0]], [[0.0]]])
    out = edge_attention(g, v, q=q, k=k, scale=0.5, backend="torch")
    # scores 0.5 * 1 * 2 = 1 and 0.5 * 1 * -1 = -0.5; node 0 gets softmax weight of edge 1->0
    assert math.isclose(out[0, 0, 0].item(), 1 / (1 + math.exp(-1.5)), rel_tol=1e-6)
