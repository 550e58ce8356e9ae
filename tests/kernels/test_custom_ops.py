"""The Triton paths' custom operators (``hector::segment_mm``, ``hector::edge_attention`` and
their backward ops) pass ``torch.library.opcheck``: schema, fake (meta) implementation,
registered autograd and dispatcher consistency.  Tiny inputs: the kernels run under Triton's
interpreter on the CPU."""
import pytest
import torch

from hector.graph import Graph
from hector.kernels.attention import custom_ops as attention_ops
from hector.kernels.segment_mm import custom_ops as gemm_ops

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")    # interpreter chatter


def _device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("gather,scatter", [(False, False), (True, True)])
def test_segment_mm_ops_pass_opcheck(gather, scatter):
    dev = _device()
    g = torch.Generator().manual_seed(0)
    bounds = [0, 3, 3, 7]                    # an empty middle segment
    x = torch.randn(5 if gather else 7, 4, generator=g).to(dev).requires_grad_()
    w = torch.randn(3, 4, 6, generator=g).to(dev).requires_grad_()
    gi = torch.randint(0, 5, (7,), generator=g).to(dev) if gather else None
    si = torch.randint(0, 4, (7,), generator=g).to(dev) if scatter else None
    rows = 4 if scatter else 7
    torch.library.opcheck(gemm_ops.segment_mm_op, (x, w, gi, si, bounds, rows, False))
    dout = torch.randn(rows, 6, generator=g).to(dev)
    torch.library.opcheck(gemm_ops.segment_mm_backward_op,
                          (dout, x.detach(), w.detach(), gi, si, bounds, False, True, True),
                          test_utils=("test_schema", "test_faketensor"))


def test_edge_attention_ops_pass_opcheck():
    dev = _device()
    g = torch.Generator().manual_seed(0)
    ei = torch.tensor([[0, 1, 2, 3, 1, 4], [1, 2, 0, 1, 1, 2]])
    graph = Graph(ei, num_nodes=6).to(dev)  # node 5: no edge at all
    handle = attention_ops.graph_handle(graph)
    n, heads = 6, 2
    v = torch.randn(n, heads, 3, generator=g).to(dev).requires_grad_()
    a_src = torch.randn(n, heads, generator=g).to(dev).requires_grad_()
    a_dst = torch.randn(n, heads, generator=g).to(dev).requires_grad_()
    args = (handle, v, None, None, a_src, a_dst, 1.0, 0.2, 0.0, 0, "auto", 0)
    torch.library.opcheck(attention_ops.edge_attention_op, args)
    out, lse = attention_ops.edge_attention_op(*args)
    dout = torch.randn_like(out)
    bwd = (handle, dout, v.detach(), None, None, a_src.detach(), a_dst.detach(), out.detach(),
           lse, 1.0, 0.2, 0.0, 0, "auto", 0, [True, False, False, True, False])
    torch.library.opcheck(attention_ops.edge_attention_backward_op, bwd,
                          test_utils=("test_schema", "test_faketensor"))


def test_edge_attention_op_with_a_bias_epilogue_passes_opcheck():
    dev = _device()
    g = torch.Generator().manual_seed(3)
    ei = torch.tensor([[0, 1, 2, 3, 1, 4], [1, 2, 0, 1, 1, 2]])
    graph = Graph(ei, num_nodes=6).to(dev)
    handle = attention_ops.graph_handle(graph)
    v = torch.randn(6, 2, 3, generator=g).to(dev).requires_grad_()
    a_src = torch.randn(6, 2, generator=g).to(dev).requires_grad_()
    a_dst = torch.randn(6, 2, generator=g).to(dev).requires_grad_()
    bias = torch.randn(2, 3, generator=g).to(dev).requires_grad_()
    args = (handle, v, None, None, a_src, a_dst, 1.0, 0.2, 0.0, 0, "auto", 0, None, bias)
    torch.library.opcheck(attention_ops.edge_attention_op, args)
    out, _ = attention_ops.edge_attention_op(*args)
    # node 5 has no incoming edge: its row is the bias alone
    torch.testing.assert_close(out[5], bias.detach())


def test_edge_attention_op_rejects_a_freed_graph_handle():
    v = torch.randn(3, 1, 2)
    with pytest.raises(RuntimeError, match="graph handle"):
        attention_ops.edge_attention_op(10 ** 9, v, None, None, None, None, 1.0, None, 0.0,
                                        0, "auto", 0)


def test_segment_mm_wgrad_op_passes_opcheck():
    g = torch.Generator().manual_seed(1)
    dev = _device()
    x = torch.randn(7, 4, generator=g).to(dev)
    dy = torch.randn(7, 5, generator=g).to(dev)
    torch.library.opcheck(gemm_ops.segment_mm_wgrad_op, (x, dy, None, None, [0, 2, 2, 7]),
                          test_utils=("test_schema", "test_faketensor"))
    dw = gemm_ops.segment_mm_wgrad_op(x, dy, None, None, [0, 2, 2, 7])
    want = torch.stack([x[:2].T @ dy[:2], torch.zeros(4, 5, device=dev), x[2:].T @ dy[2:]])
    torch.testing.assert_close(dw, want, rtol=1e-4, atol=1e-5)


def test_segment_mm_takes_seg_ptr_as_python_ints():
    from hector.kernels.segment_mm.op import segment_mm
    x, w = torch.randn(5, 3), torch.randn(2, 3, 4)
    want = segment_mm(x, w, torch.tensor([0, 2, 5]), backend="torch")
    torch.testing.assert_close(segment_mm(x, w, (0, 2, 5), backend="torch"), want)
    with pytest.raises(TypeError, match="seg_ptr"):
        segment_mm(x, w, [0, 2.0, 5], backend="torch")
    with pytest.raises(ValueError, match="seg_ptr"):
        segment_mm(x, w, [0, 5], backend="torch")


def test_a_deep_copied_graph_gets_its_own_handle():
    import copy
    graph = Graph(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3)
    h = attention_ops.graph_handle(graph)
    twin = copy.deepcopy(graph)                                 # carries a copy of the mark
    assert attention_ops.graph_handle(graph) == h               # memoised
    assert attention_ops.graph_handle(twin) != h
    assert attention_ops._graph(attention_ops.graph_handle(twin)) is twin


def test_a_callers_spec_without_plan_gets_one_launch_handle():
    """Repeated calls with ``spec=`` and no ``plan=`` reuse one memoised plan and handle
    (a new plan and handle per call would grow the launch table without bound)."""
    from hector.kernels.attention.op import edge_attention
    from hector.kernels.attention.spec import AttentionSpec
    dev = _device()
    g = Graph(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3).to(dev)
    v, a = torch.randn(3, 2, 4, device=dev), torch.randn(3, 2, device=dev)
    spec = AttentionSpec.of(v, a_src=a)
    first = edge_attention(g, v, a_src=a, spec=spec, backend="triton")
    # (the table is weak: earlier tests' entries may go at any collection, so the check is
    # that no entry is added, not that the count stays)
    before = set(attention_ops._LAUNCHES._objects.keys())
    for _ in range(3):
        again = edge_attention(g, v, a_src=a, spec=spec, backend="triton")
    assert set(attention_ops._LAUNCHES._objects.keys()) <= before
    torch.testing.assert_close(again, first)
