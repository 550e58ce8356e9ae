"""Reorder's typed-linear-into-relation rewrite (HGT's ``K_tau x`` folded into ``W_r``):
the pattern and its refusals, the graph property it needs, the weight ops it builds, and
the layers' outputs and gradients with and without it."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import ir as N
from hector.compiler import models
from hector.compiler.passes import reorder
from hector.compiler.passes.common import GraphStats
from hector.compiler.program import compile as hcompile
from hector.compiler.steps_torch import GraphIndex, eval_op

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, rel_err  # noqa: E402

# 100 nodes, 1000 edges, 300 unique (src, rel) rows; two node types, sources typed
TYPED = GraphStats(100, 1000, 300, 200, 4, 2, typed_sources=True)


def _typed_keys(heads=1, d=8, in_dim=8, bias=True):
    """``linear(src(reshape(x A_tau + b_tau)), B_r)``, as HGT writes its keys."""
    x = N.input_("x", in_dim)
    A = N.param("A", (in_dim, heads * d), per="node_type")
    b = N.param("b", (heads * d,), per="node_type")
    z = N.linear(x, A, 1)
    z = N.binary("add", z, b) if bias else z
    B = N.param("B", (heads, d, d), per="relation")
    return x, A, b, B, N.linear(N.gather(N.reshape(z, heads), N.EDGE, "src"), B)


@pytest.mark.parametrize("heads", [1, 2])
def test_rewrite_gives_one_product_of_the_source_rows(heads):
    x, A, b, B, before = _typed_keys(heads)
    (after,), dec = reorder.run((before,), TYPED)
    lin = N.linear(N.gather(x, N.EDGE, "src"), N.wmul(N.wsrc(A), B), 1)
    want = N.reshape(N.binary("add", lin, N.wmul(N.wsrc(b), B)), heads)
    assert after == want
    assert [d.applied for d in dec] == [True] and "cost" in dec[0].reason
    assert after.shape == before.shape and after.kind == before.kind


def test_rewrite_declines_without_typed_sources_or_statistics():
    *_, before = _typed_keys()
    mixed = GraphStats(100, 1000, 300, 200, 4, 2, typed_sources=False)
    (kept,), dec = reorder.run((before,), mixed)
    assert kept == before and not dec[0].applied and "several types" in dec[0].reason
    (kept,), dec = reorder.run((before,), None)
    assert kept == before and "no graph statistics" in dec[0].reason


def test_rewrite_applies_to_a_shared_weight_without_typed_sources():
    x = N.input_("x", 8)
    A, B = N.param("A", (8, 8)), N.param("B", (1, 8, 8), per="relation")
    before = N.linear(N.gather(N.reshape(N.linear(x, A, 1), 1), N.EDGE, "src"), B)
    (after,), dec = reorder.run((before,), GraphStats(100, 1000, 300, 200, 4, 2))
    assert dec[0].applied
    assert after == N.reshape(N.linear(N.gather(x, N.EDGE, "src"), N.wmul(A, B), 1), 1)


def test_rewrite_declines_when_the_node_linear_is_read_elsewhere_and_costs_more():
    """Kept node linear: only the second product is saved, and a wide input makes the
    folded product dearer (K = 256 against d = 8)."""
    x, A, b, B, before = _typed_keys(in_dim=256)
    other = N.unary("exp", N.binary("add", N.linear(x, A, 1), b))
    (kept, _), dec = reorder.run((before, other), TYPED)
    assert kept == before
    d = [d for d in dec if "wsrc" in d.what or "@" in d.what][0]
    assert not d.applied and "still read elsewhere" in d.reason
    q = d.question
    assert q.cost(q.new, TYPED) >= q.cost(q.old, TYPED)


def test_wmul_with_a_per_head_right_operand_is_the_block_diagonal_product():
    torch.manual_seed(0)
    R, T, H, d = 3, 2, 2, 4
    A = torch.randn(T, 5, H * d)
    bias = torch.randn(T, H * d)
    B = torch.randn(R, H, d, d)
    src_type = torch.tensor([1, 0, 1])
    ei = torch.tensor([[0, 1, 0], [1, 0, 1]])
    g = hector.Graph(ei, edge_type=torch.tensor([0, 1, 2]), num_nodes=2, num_relations=3,
                     node_type=torch.tensor([1, 0]))
    assert g.relation_source_types() == (1, 0, 1)
    ix = GraphIndex.of(g)
    pA, pb = (N.param(n, s, per="node_type") for n, s in (("A", (5, H * d)), ("b", (H * d,))))
    pB = N.param("B", (H, d, d), per="relation")
    blocks = torch.stack([torch.block_diag(*B[r]) for r in range(R)])
    wA, wb = eval_op(N.wsrc(pA), [A], ix), eval_op(N.wsrc(pb), [bias], ix)
    assert torch.equal(wA, A[src_type]) and torch.equal(wb, bias[src_type])
    got = eval_op(N.wmul(N.wsrc(pA), pB), [wA, B], ix)
    assert torch.allclose(got, wA @ blocks, atol=1e-6)
    row = eval_op(N.wmul(N.wsrc(pb), pB), [wb, B], ix)
    assert torch.allclose(row, (wb[:, None] @ blocks)[:, 0], atol=1e-6)
    with pytest.raises(ValueError, match="wsrc"):
        N.wsrc(pB)
    with pytest.raises(ValueError, match="wmul"):
        N.wmul(N.param("C", (5, 7)), pB)


def test_relation_source_types_from_names_edges_or_none():
    g = hector.Graph.from_hetero(
        {("a", "r", "b"): torch.tensor([[0], [1]]), ("b", "s", "a"): torch.tensor([[0], [0]]),
         ("b", "t", "b"): torch.zeros(2, 0, dtype=torch.long)}, {"a": 2, "b": 3})
    assert g.relation_source_types() == (0, 1, 1)
    # No names: from the edges, an empty relation any type (0); a mixed relation: None.
    ntype = torch.tensor([0, 0, 1, 1])
    ei = torch.tensor([[0, 2, 3, 1], [1, 0, 0, 2]])
    typed = hector.Graph(ei, edge_type=torch.tensor([0, 1, 1, 0]), num_nodes=4,
                         num_relations=3, node_type=ntype)
    assert typed.relation_source_types() == (0, 1, 0)
    mixed = hector.Graph(ei, edge_type=torch.tensor([0, 0, 1, 1]), num_nodes=4,
                         num_relations=2, node_type=ntype)
    assert mixed.relation_source_types() is None
    assert GraphStats.of(typed).typed_sources and not GraphStats.of(mixed).typed_sources
    one = hector.Graph(ei, edge_type=torch.tensor([0, 0, 1, 1]), num_nodes=4, num_relations=2)
    assert one.relation_source_types() == (0, 0)



def test_graphs_of_one_schema_share_their_relation_source_type_tensor():
    """Every mini-batch block of a schema asks for the same [R] table: it is made once per
    device (a host-to-device copy waits for the stream; ~5 aten ops a block before), and
    holds each relation's source type."""
    def block(seed):
        g = torch.Generator().manual_seed(seed)
        return hector.Graph.from_hetero(
            {("a", "r", "b"): torch.randint(0, 2, (2, 5), generator=g),
             ("b", "s", "a"): torch.randint(0, 2, (2, 4), generator=g)}, {"a": 2, "b": 2})
    first, second = (GraphIndex(block(s)).relation_source_type() for s in (0, 1))
    assert first is second and first.tolist() == [0, 1] and first.dtype == torch.int64

def _typed_graph(num_nodes=20, num_edges=80, num_relations=4, seed=0, mixed=False):
    """Node types 0 (ids < 12) and 1; relation r leaves nodes of type r % 2 (unless
    ``mixed``: then sources are any node)."""
    gen = torch.Generator().manual_seed(seed)
    et = torch.randint(0, num_relations - 1, (num_edges,), generator=gen)   # last one empty
    lo = torch.where(et % 2 == 0, 0, 12)
    hi = torch.where(et % 2 == 0, 12, num_nodes)
    src = lo + (torch.rand(num_edges, generator=gen) * (hi - lo)).long()
    if mixed:
        src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    ntype = (torch.arange(num_nodes) >= 12).long()
    return hector.Graph(torch.stack([src, dst]), edge_type=et, num_nodes=num_nodes,
                        num_relations=num_relations, node_type=ntype)


def _run(g, reorder_on, backend, heads, dtype=torch.float32):
    dev = device_for(backend)
    torch.manual_seed(1)
    m = hcompile(models.hgt, in_dim=8, out_dim=8, heads=heads, num_relations=g.num_relations,
                 num_node_types=2, reorder=reorder_on, backend=backend).to(dev)
    g = g.to(dev)
    torch.manual_seed(2)
    x = torch.randn(g.num_nodes, 8).to(dev).requires_grad_()
    out = m(g, x=x)
    (out * torch.linspace(-1, 1, out.numel(), device=dev).view_as(out)).sum().backward()
    grads = {n: p.grad for n, p in m.named_parameters()}
    grads["x"] = x.grad
    return m, out.detach(), grads


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_hgt_with_the_rewrite_equals_hgt_without(backend, heads):
    g = _typed_graph()
    m, out, grads = _run(g, True, backend, heads)
    _, ref, ref_grads = _run(g, False, "torch", heads)
    cp = m.program.compiled_for(g.to(out.device))
    assert len(_folded(cp)) == 2                      # K and V
    # no node-level GEMM for K or V: only Q's and the output's node linears remain
    assert len(_node_gemms(cp)) == 2
    assert rel_err(out.cpu(), ref) < 1e-5
    assert set(grads) == set(ref_grads)
    for name, gr in grads.items():
        assert gr is not None, name
        assert rel_err(gr.cpu(), ref_grads[name]) < 1e-4, name


def test_hgt_on_a_graph_with_mixed_source_types_declines_and_stays_correct():
    g = _typed_graph(mixed=True)
    assert g.relation_source_types() is None
    m, out, grads = _run(g, True, "torch", 2)
    _, ref, ref_grads = _run(g, False, "torch", 2)
    cp = m.program.compiled_for(g)
    assert any("several types" in d.reason for r in cp.log for d in r.decisions)
    assert rel_err(out, ref) < 1e-5
    for name, gr in grads.items():
        assert rel_err(gr, ref_grads[name]) < 1e-4, name


def test_typed_and_mixed_graphs_of_equal_row_counts_get_their_own_plans():
    """``typed_sources`` is not a row count: a stage compiled for a typed graph must not
    serve a mixed one whose counts answer every cost question alike."""
    typed, mixed = _typed_graph(), _typed_graph(mixed=True)
    torch.manual_seed(1)
    m = hcompile(models.hgt, in_dim=8, out_dim=8, heads=1, num_relations=4,
                 num_node_types=2, backend="torch")
    x = torch.randn(20, 8)
    m(typed, x=x)
    m(mixed, x=x)
    a, b = m.program.compiled_for(typed), m.program.compiled_for(mixed)
    assert a.forward is not b.forward
    # typed: Q's and the output's node GEMMs; mixed: K, Q and V kept on node rows too
    assert _node_gemms(a) == [8, 8] and _node_gemms(b) == [8, 8, 8, 8]


def _node_gemms(cp):
    """The output widths of the forward's GEMMs over node rows."""
    return [s.spec[0].N for s in cp.forward_plan.steps
            if s.template == "gemm" and s.output.kind == N.NODE]


def _folded(cp):
    return [d for r in cp.log for d in r.decisions if d.applied and "src(linear(x," in d.what]


def test_a_training_forward_evaluates_each_weight_root_once(monkeypatch):
    from hector.compiler import steps_torch
    g = _typed_graph()
    torch.manual_seed(1)
    m = hcompile(models.hgt, in_dim=8, out_dim=8, heads=2, num_relations=4,
                 num_node_types=2, backend="torch")
    x = torch.randn(20, 8, requires_grad=True)
    m(g, x=x).sum().backward()
    seen = []
    real = steps_torch._eval_elementwise_or_weight

    def spy(v, a, ix):
        if v.op in (N.Op.WSRC, N.Op.WMUL, N.Op.WSCALE):
            seen.append(v)
        return real(v, a, ix)
    monkeypatch.setattr(steps_torch, "_eval_elementwise_or_weight", spy)
    m(g, x=x).sum().backward()
    assert seen and len(seen) == len(set(seen))


def test_programs_without_node_type_weights_never_ask_for_source_types(monkeypatch):
    """Only a per-node-type weight can be re-sliced per relation: RGCN's program keeps
    ``typed_sources`` False without asking the graph (one host read of the edges per new
    graph without names, every mini-batch block); HGT's asks."""
    g = _typed_graph()
    asked = []
    real = hector.Graph.relation_source_types
    monkeypatch.setattr(hector.Graph, "relation_source_types",
                        lambda self: asked.append(1) or real(self))
    rgcn = hcompile(models.rgcn, in_dim=8, out_dim=8, num_relations=4, backend="torch")
    rgcn(g, x=torch.randn(20, 8))
    assert asked == [] and not rgcn.program.stats(g).typed_sources
    hgt = hcompile(models.hgt, in_dim=8, out_dim=8, heads=1, num_relations=4,
                   num_node_types=2, backend="torch")
    hgt(g, x=torch.randn(20, 8))
    assert asked and hgt.program.stats(g).typed_sources
