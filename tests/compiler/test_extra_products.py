"""Lowering's extra products: ``x (W V)`` beside ``x W`` over the same rows (RGAT's source
score after ``reorder``) is the second output of ``x W``'s GEMM, formed by its epilogue
(``GemmSpec.extra_cols``), not a GEMM of its own.  Which plans get it, which do not, and the
compiled layers on both backends against torch autograd through the unmerged plan (output
and every gradient, fp32 and bf16)."""
import sys
from pathlib import Path

import pytest
import torch

from hector.compiler import lower as lowering
from hector.compiler import models
from hector.compiler.ir import CSRC, Op

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import rel_err  # noqa: E402
from test_attention_backward import _compiled, _grads, _graph, gat_like  # noqa: E402


def _forward_plan(model, dims, graph, dtype=torch.float32):
    m = _compiled(model, dims, graph)
    return m.program.compiled_for(graph, dtype).forward_plan


def _gemms(plan):
    return [s for s in plan.steps if s.template == "gemm" and s.body.op == Op.LINEAR]


@pytest.mark.parametrize("heads,out_dim", [(1, 16), (1, 128), (2, 32)])
def test_rgat_source_score_rides_on_the_message_gemm(heads, out_dim):
    """(Widths the siblings pass keeps apart: a one-column score, or one that would pad the
    fused GEMM; narrower pairs are one GEMM there, 16 + 2 -> 18 columns.)"""
    g = _graph()
    plan = _forward_plan(models.rgat, dict(in_dim=8, out_dim=out_dim, heads=heads), g)
    src = [s for s in _gemms(plan) if s.spec[1].rows == CSRC]
    assert len(src) == 1, [s.name for s in _gemms(plan)]
    (step,) = src
    assert step.spec[0].N == heads * out_dim and step.spec[0].extra_cols == heads
    att = next(s for s in plan.steps if s.template == "attention")
    assert step.output in att.inputs and step.extra in att.inputs
    assert step.inputs[-1].shape == (heads * out_dim, heads)    # V = the score vector k
    assert "x (W V)" in step.note
    # The destination score reads other rows: still its own GEMM.
    assert [s.spec[0].extra_cols for s in _gemms(plan) if s is not step] == [0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extra_columns_are_capped_per_dtype(dtype):
    """fp32 takes up to 8 columns, half types 2 (the score GEMM they replace is cheaper in
    bf16); N = 128 throughout, wider than one fused sibling tile."""
    cap = lowering.extra_max_cols(dtype)
    assert cap == (8 if dtype == torch.float32 else 2)
    for heads, merged in ((cap, True), (2 * cap, False)):
        dims = dict(in_dim=8, out_dim=128 // heads, heads=heads)
        gemms = _gemms(_forward_plan(models.rgat, dims, _graph(), dtype))
        src = [s for s in gemms if s.spec[1].rows == CSRC]
        assert len(src) == (1 if merged else 2), (heads, [s.name for s in gemms])
        assert [s.spec[0].extra_cols for s in src if s.spec[0].extra_cols] == \
            ([heads] if merged else [])


def test_no_extra_product_when_the_message_gemm_is_narrow():
    """One input feature (K = 1 in fp32): the message GEMM runs on the narrow kernel, which
    has no epilogue product, so its score stays a GEMM of its own -- and the layer compiles
    (it raised in lowering before) and equals the torch backend."""
    g = _graph()
    dims = dict(in_dim=1, out_dim=16, heads=1)
    plan = _forward_plan(models.rgat, dims, g)
    assert all(s.spec[0].extra_cols == 0 for s in _gemms(plan))
    out, grads = _grads(models.rgat, dims, g, "ir", "triton")
    ref_out, ref = _grads(models.rgat, dims, g, "torch", "torch")
    assert rel_err(out, ref_out) < 1e-5
    for name in ref:
        assert rel_err(grads[name], ref[name]) < 1e-4, name


def test_no_extra_product_when_the_row_is_wider_than_a_tile():
    plan = _forward_plan(models.rgat, dict(in_dim=8, out_dim=96, heads=2), _graph())
    assert lowering.EXTRA_MAX_N < 192
    assert all(s.spec[0].extra_cols == 0 for s in _gemms(plan))
    assert len([s for s in _gemms(plan) if s.spec[1].rows == CSRC]) == 2


def test_node_rows_take_one_extra_product():
    """A GAT-like layer: z = x W with both scores x (W a_src) and x (W a_dst) on the same node
    rows; the first becomes z's extra product, the second stays a GEMM."""
    plan = _forward_plan(gat_like, dict(in_dim=6), _graph())
    extra = [s.spec[0].extra_cols for s in _gemms(plan)]
    assert sorted(extra) == [0, 2]


CASES = [(models.rgat, dict(in_dim=8, out_dim=32, heads=2)),
         (models.rgat, dict(in_dim=8, out_dim=16, heads=1)),
         (gat_like, dict(in_dim=6))]


@pytest.mark.parametrize("model,dims", CASES, ids=["rgat_2x32", "rgat_1x16", "gat_like"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merged_plans_equal_torch_autograd(model, dims, backend, dtype, monkeypatch):
    g = _graph()
    out, grads = _grads(model, dims, g, "ir", backend, dtype)
    monkeypatch.setattr(lowering, "_extra_products", lambda steps: steps)
    ref_out, ref = _grads(model, dims, g, "torch", "torch", dtype)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert rel_err(out, ref_out) < tol
    for name in ref:
        assert rel_err(grads[name], ref[name]) < tol * 10, name
