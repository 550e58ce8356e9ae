"""The segment GEMM's scatter epilogue: a typed linear's compact (dst, relation) rows summed
into their destination nodes, the linear read by nothing else, is summed by the GEMM itself
(fp32 atomics) -- no compact output is written.  RGCN after reordering: output and every
gradient equal the torch backend's, fp32 and bf16, with the CSR prologue off, on, and as
the default chooses it (on, with a scatter epilogue); declined by its cost question where
the rows are fewer than twice the nodes."""
import pytest
import torch

from hector.compiler import ir as N
from hector.compiler.passes import fuse_gemm

from test_csr_prologue import _csr_steps, _graph, _run, _same

MODES = ["0", "1", "auto"]


def _set_mode(monkeypatch, mode):
    """``HECTOR_CSR_PROLOGUE`` as ``mode`` ("auto": unset)."""
    if mode == "auto":
        monkeypatch.delenv(fuse_gemm.CSR_PROLOGUE_ENV, raising=False)
    else:
        monkeypatch.setenv(fuse_gemm.CSR_PROLOGUE_ENV, mode)


def _scatter_steps(plan):
    return [s for s in plan.steps if s.template == "gemm" and s.body.op == N.Op.SCATTER]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_rgcn_relation_gemm_sums_into_the_nodes(monkeypatch, mode, dtype, tol):
    _set_mode(monkeypatch, mode)
    g = _graph(num_nodes=12, num_edges=200, relations=8)   # 4 destinations x 8 relations
    got = _run(g, "triton", dtype)
    _same(got, _run(g, "torch", dtype), tol, 10 * tol)
    plan = got[0].forward_plan
    (step,) = _scatter_steps(plan)
    assert step.output.kind == N.NODE and step.spec[1].scatter == (N.NODE, "dst")
    assert step.spec[0].accumulate and "scatter epilogue" in step.note
    assert bool(_csr_steps(plan)) == (mode != "0")
    # nothing reads compact rows back: no step takes a compact_dst input but the GEMM
    assert not [s for s in plan.steps if s is not step
                and any(v.kind == N.CDST for v in s.inputs)]
    log = [str(d) for r in got[0].log if r.name == "fuse" for d in r.decisions]
    assert any("applied: scatter into linear (epilogue)" in d for d in log), log


def test_declined_with_fewer_than_two_rows_per_node():
    g = _graph()                                    # 24 nodes, at most 24 (dst, relation) rows
    got = _run(g, "triton")
    assert not _scatter_steps(got[0].forward_plan)
    (d,) = [d for r in got[0].log if r.name == "fuse" for d in r.decisions
            if d.what == "scatter into linear (epilogue)"]
    assert not d.applied and d.question is not None and "fewer than two rows" in d.reason
    _same(got, _run(g, "torch"), 1e-5, 1e-4)


def test_no_epilogue_without_fusion():
    g = _graph(num_nodes=12, num_edges=200, relations=8)
    got = _run(g, "triton", fuse=False)
    assert not _scatter_steps(got[0].forward_plan)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_root_gemm_adds_the_relation_sum_and_the_bias(monkeypatch, mode, dtype, tol):
    """The addend epilogue: RGCN's root GEMM adds the node rows the relation GEMM's scatter
    left and the bias as it stores its rows, and that GEMM is the forward's last step (no
    node-row pass after it); output and every gradient equal the torch backend's."""
    _set_mode(monkeypatch, mode)
    g = _graph(num_nodes=12, num_edges=200, relations=8)
    got = _run(g, "triton", dtype)
    _same(got, _run(g, "torch", dtype), tol, 10 * tol)
    plan = got[0].forward_plan
    (scatter,) = _scatter_steps(plan)
    added = [s for s in plan.steps if s.template == "gemm" and s.spec[0].has_addend]
    assert len(added) == 1 and added[0] is plan.steps[-1]
    (step,) = added
    assert scatter.output in step.inputs and step.spec[0].has_bias
    assert "addend epilogue" in step.note
    assert not [s for s in plan.steps if s.template == "traversal" and s.output.kind == N.NODE]
    log = [str(d) for r in got[0].log if r.name == "fuse" for d in r.decisions]
    assert any("applied: sum into linear (addend epilogue)" in d for d in log), log


def test_no_addend_without_the_scatter_epilogue():
    """Where the relation GEMM keeps its compact rows (fewer than two per node), their sum
    is a traversal's, which adds the root linear and the bias itself: no addend GEMM."""
    g = _graph()
    got = _run(g, "triton")
    assert not [s for s in got[0].forward_plan.steps
                if s.template == "gemm" and s.spec[0].has_addend]
