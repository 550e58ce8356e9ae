"""The GEMM's CSR prologue: a sum over a CSR of one input's rows read by a typed linear alone
(RGCN's per-(destination, relation) mean after reordering) is summed by the segment GEMM as it
loads each row -- no step writes the summed rows; output and every gradient equal the torch
backend's; a CSR with hub rows runs the traversal kernel first instead.  Opt-in
(``HECTOR_CSR_PROLOGUE=1``, set here by a fixture); off, the plan is the usual one."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import ir as N
from hector.compiler import models
from hector.compiler.passes import fuse_gemm
from hector.compiler.program import compile as hcompile
from hector.kernels.traversal import schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, rel_err, weighted_grads  # noqa: E402


def _graph(num_nodes=24, num_edges=90, relations=3, seed=0, hub=0):
    """Edges into a third of the nodes: fewer (destination, relation) rows than (source,
    relation) rows, so ``reorder`` moves the linear after the mean (what the prologue takes)."""
    gen = torch.Generator().manual_seed(seed)
    ei = torch.stack([torch.randint(0, num_nodes, (num_edges,), generator=gen),
                      torch.randint(0, num_nodes // 3, (num_edges,), generator=gen)])
    et = torch.randint(0, relations, (num_edges,), generator=gen)
    if hub:        # one (destination, relation) row with ``hub`` entries
        ei = torch.cat([ei, torch.stack([torch.randint(0, num_nodes, (hub,), generator=gen),
                                         torch.zeros(hub, dtype=torch.long)])], 1)
        et = torch.cat([et, torch.zeros(hub, dtype=torch.long)])
    return hector.Graph(ei, edge_type=et, num_nodes=num_nodes, num_relations=relations)


@pytest.fixture(autouse=True)
def _opt_in(monkeypatch):
    monkeypatch.setenv(fuse_gemm.CSR_PROLOGUE_ENV, "1")


def _run(g, backend, dtype=torch.float32, **opts):
    dev = device_for(backend)
    torch.manual_seed(1)
    m = hcompile(models.rgcn, backend=backend, in_dim=8, out_dim=12,
                 num_relations=g.num_relations, **opts)
    for p in m.parameters():
        torch.nn.init.normal_(p.data, std=0.3)
    m = m.to(dev, dtype)
    g = g.to(dev)
    out, grads = weighted_grads(m, g, 8, dev)
    return m.program.compiled_for(g), out, grads


def _csr_steps(plan):
    return [s for s in plan.steps if s.template == "gemm" and s.spec is not None
            and s.spec[1] is not None and s.spec[1].csr is not None]


def _mean_traversals(plan):
    """Traversal steps writing compact (destination, relation) rows."""
    return [s for s in plan.steps if s.template == "traversal" and s.output.kind == N.CDST]


def _same(got, want, out_tol, grad_tol):
    (_, out, grads), (_, ref, ref_grads) = got, want
    assert rel_err(out, ref) < out_tol
    assert set(grads) == set(ref_grads)
    for name, gr in grads.items():
        assert rel_err(gr, ref_grads[name]) < grad_tol, name


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_rgcn_mean_is_the_gemms_csr_prologue(dtype, tol):
    g = _graph()
    got = _run(g, "triton", dtype)
    _same(got, _run(g, "torch", dtype), tol, 10 * tol)
    plan = got[0].forward_plan
    (step,) = _csr_steps(plan)
    assert step.spec[0].has_csr and "CSR prologue" in step.note
    assert not _mean_traversals(plan), "the mean rows were written by a traversal step"
    log = [str(d) for r in got[0].log if r.name == "fuse" for d in r.decisions]
    assert any("applied: scatter into linear -- CSR prologue" in d for d in log), log


def test_backward_rebuilds_the_mean_instead_of_keeping_it():
    """The forward no longer holds the mean rows, so none is saved for the backward (its
    weight gradient rebuilds them): the plan keeps less between forward and backward."""
    got = _run(_graph(), "triton")
    entry = got[0]
    assert not any(v.kind == N.CDST for v in entry.saved_values), entry.saved_values


def test_hub_rows_fall_back_to_the_traversal_kernel(monkeypatch):
    """A CSR with a row longer than the traversal's chunk: the step sums through the
    traversal kernel and runs the plain GEMM (the same math; checked against torch)."""
    # (hub rows: longer than the chunk ``row_bins`` cuts at, 1024 by default)
    monkeypatch.setattr(schedule.row_bins, "__defaults__", (schedule.SHORT_MAX, 8))
    g = _graph(hub=20)
    import hector.kernels.segment_mm.launch as launch
    calls = []
    real = launch.launch_gemm

    def spy(spec, *a, **k):
        calls.append(spec.has_csr)
        return real(spec, *a, **k)
    monkeypatch.setattr(launch, "launch_gemm", spy)
    got = _run(g, "triton")
    _same(got, _run(g, "torch"), 1e-5, 1e-4)
    assert _csr_steps(got[0].forward_plan) and calls and not any(calls)
    # rows stored once cannot be cut into pieces: the hub stays whole (hence the fallback)
    assert not any(s.spec[1].pieces for s in _csr_steps(got[0].forward_plan))


def test_off_by_default(monkeypatch):
    monkeypatch.delenv(fuse_gemm.CSR_PROLOGUE_ENV)
    got = _run(_graph(), "triton")
    assert not _csr_steps(got[0].forward_plan) and _mean_traversals(got[0].forward_plan)


def test_without_fusion_the_mean_is_a_traversal_step():
    got = _run(_graph(), "triton", fuse=False)
    assert not _csr_steps(got[0].forward_plan)
    _same(got, _run(_graph(), "torch", fuse=False), 1e-5, 1e-4)
