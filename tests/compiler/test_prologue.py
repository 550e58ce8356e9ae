"""The GEMM prologue: an elementwise function of a dense typed linear's input rows (and of its
weight gradient's) applied by the segment GEMM as it loads each tile -- no step writes the
transformed rows; output and every gradient equal the torch backend's."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import ir as N
from hector.compiler import models
from hector.compiler.passes import fuse_group
from hector.compiler.program import compile as hcompile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, rel_err  # noqa: E402


def _graph(num_nodes=20, num_edges=80, relations=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
    et = torch.randint(0, relations, (num_edges,), generator=gen)
    return hector.Graph(ei, edge_type=et, num_nodes=num_nodes, num_relations=relations,
                        node_type=torch.arange(num_nodes) % 2)


def _typed_mlp(m, in_dim, out_dim, act="sigmoid"):
    """A per-node-type linear of act(x) and a per-relation one of act(gathered x) (the
    latter keeps its map: a gather would become a copy)."""
    x = m.node_input("x", in_dim)
    node = m.linear(getattr(m, act)(x), m.weight("a", (in_dim, out_dim), per="node_type"))
    rel = m.aggregate(m.linear(getattr(m, act)(m.src(x)),
                               m.weight("b", (in_dim, out_dim), per="relation")), "sum")
    return node + rel


def _run(fn, g, backend, **kw):
    dev = device_for(backend)
    torch.manual_seed(1)
    m = hcompile(fn, backend=backend, **kw)
    for p in m.parameters():        # (on the CPU: the same values on every device)
        torch.nn.init.normal_(p.data, std=0.3)
    m = m.to(dev)
    g = g.to(dev)
    torch.manual_seed(2)
    x = torch.randn(g.num_nodes, kw["in_dim"]).to(dev).requires_grad_()
    out = m(g, x=x)
    (out * torch.linspace(-1, 1, out.numel(), device=dev).view_as(out)).sum().backward()
    grads = {n: p.grad.cpu() for n, p in m.named_parameters()}
    grads["x"] = x.grad.cpu()
    return m.program.compiled_for(g), out.detach().cpu(), grads


def _same(got, want):
    (_, out, grads), (_, ref, ref_grads) = got, want
    assert rel_err(out, ref) < 1e-5
    assert set(grads) == set(ref_grads)
    for name, gr in grads.items():
        assert rel_err(gr, ref_grads[name]) < 1e-4, name


def _prologues(plan):
    return [s.spec[0].prologue for s in plan.steps
            if s.template == "gemm" and s.spec is not None and s.spec[0] is not None]


def _maps_of(plan, op):
    """Traversal steps computing nothing but ``op`` (and views)."""
    return [s for s in plan.steps if s.template == "traversal" and
            {b.op for b in N.toposort([s.body]) if b.op != N.Op.ARG} <= {op, N.Op.RESHAPE}
            and op in {b.op for b in N.toposort([s.body])}]


@pytest.mark.parametrize("act", ["sigmoid", "gelu"])
def test_an_input_function_is_the_gemms_prologue(act):
    g = _graph()
    kw = dict(in_dim=8, out_dim=16, num_relations=3, num_node_types=2)
    got = _run(lambda m, in_dim, out_dim: _typed_mlp(m, in_dim, out_dim, act), g, "triton", **kw)
    _same(got, _run(lambda m, in_dim, out_dim: _typed_mlp(m, in_dim, out_dim, act), g, "torch",
                    **kw))
    cp = got[0]
    assert _prologues(cp.forward_plan).count(act) == 1        # the node-type linear's
    # the relation linear reads gathered rows: act(x) gathered stays a traversal
    assert [s.name for s in cp.forward_plan.steps if s.template == "traversal"
            and act in s.name] == [f"traversal_compact_src_gather_{act}"]
    notes = [s.note for s in cp.backward_plan.steps if s.body.op == N.Op.WGRAD]
    assert sum(f"{act}(x) applied to each loaded tile" in n for n in notes) >= 1


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_hgt_reads_gelu_of_the_aggregate_in_its_gemms(backend, monkeypatch):
    g = _graph()
    kw = dict(in_dim=8, out_dim=8, heads=2, num_relations=3, num_node_types=2)
    got = _run(models.hgt, g, backend, **kw)
    with monkeypatch.context() as mp:     # the reference: the gelu as its own step
        mp.setattr(fuse_group, "_prologue", lambda a, gemm: False)
        want = _run(models.hgt, g, "torch", **kw)
    assert "gelu" not in _prologues(want[0].forward_plan)
    _same(got, want)
    cp = got[0]
    assert "gelu" in _prologues(cp.forward_plan)
    assert not _maps_of(cp.forward_plan, N.Op.GELU)              # gelu(agg) never written
    assert not _maps_of(cp.backward_plan, N.Op.GELU)
