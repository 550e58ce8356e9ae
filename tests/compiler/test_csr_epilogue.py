"""RGCN's training step with no compact rows in memory: where its (destination, relation)
rows number at least twice the nodes (the scatter epilogue's question), the forward's mean is
the relation GEMM's CSR prologue (rows cut into short pieces), the backward's weight
gradient rebuilds the mean the same way as it loads its tiles, and the backward's
``dy[dst] W_r^T`` is added into the sources by the GEMM's CSR scatter epilogue.  No step of
either plan writes compact rows, nothing compact is saved, the plan's memory replay peaks
lower, and output and every gradient equal the torch backend's (fp32, bf16, a hub row cut
into pieces).  ``HECTOR_CSR_PROLOGUE=0`` turns all three off."""
import pytest
import torch

from hector.compiler import ir as N
from hector.compiler import models
from hector.compiler.explain import explain
from hector.compiler.program import compile as hcompile
from hector.compiler.lower_gemm import CSR_PIECE
from hector.compiler.memory import simulate
from hector.compiler.passes import fuse_gemm
from hector.loader import NeighborLoader
from hector.nn import RGCNConv

from test_csr_prologue import _graph, _run, _same
from helpers import device_for, rel_err  # noqa: E402  (tests/ is on the path from here on)


def _dense_graph(hub=0):
    """12 nodes, 4 of them destinations, 8 relations: ~32 (dst, relation) rows, more than
    twice the nodes, and the mean before the linear (``reorder``)."""
    return _graph(num_nodes=12, num_edges=200, relations=8, hub=hub)


def _compact_writers(plan):
    return [s.name for s in plan.steps if s.output.kind in (N.CDST, N.CSRC)]


def _csr_out_steps(plan):
    return [s for s in plan.steps if s.template == "gemm" and s.spec is not None
            and s.spec[1] is not None and s.spec[1].csr_out is not None]


def _csr_wgrads(plan):
    return [s for s in plan.steps if s.template == "gemm" and s.body.op == N.Op.WGRAD
            and s.body.args[0].op == N.Op.SCATTER]


@pytest.fixture(autouse=True)
def _auto(monkeypatch):
    monkeypatch.delenv(fuse_gemm.CSR_PROLOGUE_ENV, raising=False)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_no_compact_rows_in_forward_or_backward(dtype, tol):
    g = _dense_graph()
    got = _run(g, "triton", dtype)
    _same(got, _run(g, "torch", dtype), tol, 10 * tol)
    entry = got[0]
    assert not _compact_writers(entry.forward_plan), entry.forward_plan
    assert not _compact_writers(entry.backward_plan), [s.name for s in
                                                        entry.backward_plan.steps]
    assert not [v for v in entry.saved_values if v.kind in (N.CDST, N.CSRC)]
    (epi,) = _csr_out_steps(entry.backward_plan)
    gs, rs = epi.spec
    assert gs.has_csr_out and gs.accumulate and rs.rows == N.CDST and rs.gather == (N.NODE,
                                                                                   "dst")
    assert rs.pieces        # rows cut into pieces, as the forward's CSR prologue's
    (fwd,) = [s for s in entry.forward_plan.steps if s.spec[1].csr is not None]
    assert fwd.spec[1].pieces and fwd.spec[1].scatter is not None
    assert "CSR scatter epilogue" in epi.note and epi.output.kind == N.NODE
    (wgrad,) = _csr_wgrads(entry.backward_plan)
    assert "CSR prologue" in wgrad.note
    # the root GEMM adds the epilogue's node rows (no node-row pass after it)
    (root,) = [s for s in entry.backward_plan.steps
               if s.template == "gemm" and s.spec is not None and s.spec[0].has_addend]
    assert epi.output in root.inputs
    log = [str(d) for r in entry.log for d in r.decisions]
    assert any("applied: gather + scatter into linear (CSR scatter epilogue)" in d
               for d in log), log


def test_hub_row_is_cut_into_pieces():
    """A (destination, relation) row of several pieces' entries: the forward GEMM, the weight
    gradient and the epilogue walk it piece by piece, and every result stays exact."""
    g = _dense_graph(hub=3 * CSR_PIECE + 5)
    got = _run(g, "triton")
    _same(got, _run(g, "torch"), 1e-5, 1e-4)
    assert _csr_out_steps(got[0].backward_plan) and _csr_wgrads(got[0].backward_plan)


def test_replay_peak_falls():
    """The plan replay (what ``explain`` prints): without the compact rows the step's peak
    is lower than with the three rules off."""
    g = _dense_graph()
    peaks = {}
    for mode in ("0", "auto"):
        with pytest.MonkeyPatch.context() as mp:
            if mode == "0":
                mp.setenv(fuse_gemm.CSR_PROLOGUE_ENV, "0")
            entry = _run(g, "triton")[0]
        peaks[mode] = max(p.live for p in simulate(entry)[0])
        if mode == "0":
            assert _compact_writers(entry.backward_plan) and not _csr_out_steps(
                entry.backward_plan) and not _csr_wgrads(entry.backward_plan)
    assert peaks["auto"] < peaks["0"], peaks


def test_declined_with_fewer_than_two_rows_per_node():
    got = _run(_graph(), "triton")          # 24 nodes, at most 24 (dst, relation) rows
    assert not _csr_out_steps(got[0].backward_plan) and not _csr_wgrads(
        got[0].backward_plan)
    _same(got, _run(_graph(), "torch"), 1e-5, 1e-4)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_on_a_sampled_block(dtype, tol):
    """A mini-batch block (bipartite: 4 seed destinations, their sources) with more
    (destination, relation) rows than twice its nodes takes the same three rules; RGCNConv
    on it equals the torch backend's, output and every gradient."""
    g = _dense_graph()
    block = next(iter(NeighborLoader(g, [-1], input_nodes=torch.arange(4), batch_size=4,
                                     shuffle=False))).blocks[0]
    results = {}
    for backend in ("triton", "torch"):
        dev = device_for(backend)
        b = block.to(dev)
        torch.manual_seed(0)
        layer = RGCNConv(8, 12, g.num_relations, backend=backend).to(dev, dtype)
        x = torch.randn(b.num_nodes, 8, generator=torch.Generator().manual_seed(2))
        x = x.to(dev, dtype).requires_grad_()
        out = layer(x, b)
        (out.float() * torch.linspace(-1, 1, out.numel(), device=dev).view_as(out)).sum() \
            .backward()
        results[backend] = [out.detach().float().cpu(), x.grad.float().cpu()] + [
            p.grad.float().cpu() for p in layer.parameters()]
        if backend == "triton":
            entry = layer.program.compiled_for(b)
            assert _csr_out_steps(entry.backward_plan) and _csr_wgrads(entry.backward_plan)
            assert not _compact_writers(entry.forward_plan)
    got, want = results["triton"], results["torch"]
    assert rel_err(got[0], want[0]) < tol
    for a, b_ in zip(got[1:], want[1:]):
        assert rel_err(a, b_) < 10 * tol


def test_explain_names_the_ops_that_run():
    """``explain`` names each GEMM step's op: the CSR prologue GEMM, the CSR weight
    gradient and the CSR scatter epilogue GEMM (not the plain segment GEMM)."""
    layer = hcompile(models.rgcn, backend="torch", in_dim=8, out_dim=12, num_relations=8)
    text = explain(layer, _dense_graph())
    ops = text.split("ops called:")
    assert "segment_mm_csr (Triton segment GEMM, CSR prologue" in ops[1]
    assert "hector::segment_mm_wgrad_csr" in ops[2]
    assert "segment_mm_csr_scatter (Triton segment GEMM, CSR scatter epilogue" in ops[2]
