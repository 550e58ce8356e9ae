"""``scatter_sum(add(linear_1, linear_2))`` of compact rows into their nodes becomes two
scatter-epilogue GEMMs (``fuse_gemm._split_scatter_sums``): RGAT's backward sums ``dv W_r^T`` and
``d a_src W_att_r^T`` over its compact (src, relation) rows into the sources, and neither
compact product is written where those rows are at least twice the nodes.  Output and every
gradient equal the torch backend's; declined, with its cost question, on a graph with fewer
rows."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import ir as N
from hector.compiler import models
from hector.compiler.program import compile as hcompile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, rel_err, weighted_grads  # noqa: E402

WHAT = "scatter of a sum of two linears into two scatter epilogues"


def _graph(num_nodes, num_edges, relations=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
    et = torch.randint(0, relations, (num_edges,), generator=gen)
    return hector.Graph(ei, edge_type=et, num_nodes=num_nodes, num_relations=relations)


def _run(g, backend, dtype=torch.float32):
    dev = device_for(backend)
    torch.manual_seed(1)
    m = hcompile(models.rgat, backend=backend, in_dim=8, out_dim=4, heads=2,
                 num_relations=g.num_relations)
    for p in m.parameters():
        torch.nn.init.normal_(p.data, std=0.3)
    m, g = m.to(dev, dtype), g.to(dev)
    out, grads = weighted_grads(m, g, 8, dev)
    return m.program.compiled_for(g), out, grads


def _decision(cp):
    (d,) = [d for r in cp.log if r.name == "backward/fuse" for d in r.decisions
            if d.what == WHAT]
    return d


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_rgat_backward_scatters_both_products_into_the_sources(dtype, tol):
    g = _graph(num_nodes=12, num_edges=200)        # ~80 (src, relation) rows on 12 nodes
    assert g.compact_src.num_rows >= 2 * g.num_nodes
    cp, out, grads = _run(g, "triton", dtype)
    _, ref, ref_grads = _run(g, "torch", dtype)
    assert rel_err(out, ref) < tol
    for name in ref_grads:
        assert rel_err(grads[name], ref_grads[name]) < 10 * tol, name
    d = _decision(cp)
    assert d.applied and d.question is not None
    bwd = cp.backward_plan
    # no step writes (src, relation) rows of a product with the transposed weights
    assert not [s for s in bwd.steps if s.template == "gemm" and s.output.kind == N.CSRC]
    scattered = [s for s in bwd.steps if s.template == "gemm" and s.body.op == N.Op.SCATTER
                 and s.spec[1].scatter == (N.NODE, "src")]
    assert len(scattered) == 2


def test_declined_with_fewer_than_two_rows_per_node():
    g = _graph(num_nodes=40, num_edges=50, relations=2)
    assert g.compact_src.num_rows < 2 * g.num_nodes
    cp, out, grads = _run(g, "triton")
    d = _decision(cp)
    assert not d.applied and "fewer than two rows" in d.reason
    assert [s for s in cp.backward_plan.steps if s.template == "gemm"
            and s.output.kind == N.CSRC]
    _, ref, ref_grads = _run(g, "torch")
    assert rel_err(out, ref) < 1e-5
    for name in ref_grads:
        assert rel_err(grads[name], ref_grads[name]) < 1e-4, name
