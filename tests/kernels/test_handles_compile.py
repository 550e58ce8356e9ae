"""The handles that name graphs, launch plans and CSRs for hector's custom ops under
``torch.compile`` (:mod:`hector.kernels.handles`): always constants in the traced graph, never
symbolic ints, whose fake implementations could not look the object up.  Dynamo makes an int
symbolic once it has seen two values of it at one place (automatic dynamic shapes, or
``dynamic=True``): here one compiled function called on three graphs, each new to it, and so
named for the first time inside the traced region."""
import pytest
import torch

from hector.graph import Graph
from hector.kernels.attention.op import edge_attention
from hector.kernels.attention.spec import AttentionSpec
from hector.kernels.traversal.csr import from_coo
from hector.kernels.traversal.launch import transposed
from hector.kernels.traversal.op import edge_softmax, traverse

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")    # interpreter chatter
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _graphs(count=3, n=6, e=14):
    """Graphs of one shape and different edges, and a WeightedCSR of each (with its
    transpose, which the traversal's backward reads, built eagerly: that lazy memo is not
    what is tested, and built inside the traced backward it would read real tensors)."""
    out = []
    for seed in range(count):
        gen = torch.Generator().manual_seed(seed)
        ei = torch.randint(0, n, (2, e), generator=gen).to(DEV)
        val = torch.rand(e, generator=gen).to(DEV)
        m = from_coo(ei[1], ei[0], val, n, n)
        transposed(m)
        out.append((Graph(ei, num_nodes=n), m))
    return out


def _step(graph, csr, v, a, s, launch=True):
    """One attention (``launch``: with a caller's spec, named to the op by a launch handle),
    one edge softmax and one CSR traversal, differentiated."""
    spec = AttentionSpec.of(v, a_src=a) if launch else None
    out = edge_attention(graph, v, a_src=a, spec=spec, backend="triton")
    alpha = edge_softmax(graph, s, backend="triton")
    y = traverse(csr, v.flatten(1), backend="triton")
    loss = out.square().sum() + alpha.square().sum() + y.square().sum()
    return (out, alpha, y) + torch.autograd.grad(loss, (v, a, s))


# (dynamic=True without a caller's spec: one built in traced code from symbolic sizes fails
# its own checks, whatever the handles)
@pytest.mark.parametrize("dynamic, launch", [(None, True), (True, False)])
def test_handles_stay_constants_across_graphs_under_compile(dynamic, launch):
    compiled = torch.compile(_step, backend="aot_eager", dynamic=dynamic)
    gen = torch.Generator().manual_seed(7)
    for graph, csr in _graphs():
        v = torch.randn(6, 2, 4, generator=gen).to(DEV).requires_grad_()
        a = torch.randn(6, 2, generator=gen).to(DEV).requires_grad_()
        s = torch.randn(graph.num_edges, 2, 1, generator=gen).to(DEV).requires_grad_()
        got = compiled(graph, csr, v, a, s, launch)    # first: a new graph, named in the trace
        want = _step(graph, csr, v, a, s, launch)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
