"""The plan runner drops each value after the last step that reads it, so a plan's peak
memory is its largest live set rather than the sum of its intermediates (HGT on mag held
every backward temporary to the end: 16 GiB at the step's peak on the H200).  Checked on the
real plans: every step's output is released unless the plan returns it or the backward
keeps it, and the gradients stay those of torch autograd."""
import gc
import sys
import weakref
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import execute, models
from hector.compiler.program import compile as hcompile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import random_relational, rel_err  # noqa: E402

MODELS = [(models.hgt, dict(in_dim=8, out_dim=8, heads=2)),
          (models.rgat, dict(in_dim=8, out_dim=4, heads=2)),
          (models.rgcn, dict(in_dim=8, out_dim=8))]


def _graph():
    ei, et = random_relational(num_nodes=20, num_edges=70, num_relations=3, empty=(1,))
    return hector.Graph(ei, edge_type=et, num_nodes=20, num_relations=3,
                        node_type=(torch.arange(20) >= 12).long())


def _run(model, dims, autodiff="ir"):
    torch.manual_seed(0)
    g = _graph()
    m = hcompile(model, num_relations=3, num_node_types=2, backend="torch", autodiff=autodiff,
                 **dims)
    x = torch.randn(20, dims["in_dim"], generator=torch.Generator().manual_seed(1),
                    requires_grad=True)
    out = m(g, x=x)
    gx, = torch.autograd.grad((out * out).sum(), [x])
    return m, g, gx


@pytest.mark.parametrize("model,dims", MODELS, ids=lambda c: getattr(c, "__name__", ""))
def test_last_uses_name_each_value_once_at_its_last_reader(model, dims):
    m, g, _ = _run(model, dims)
    cp = m.program.compiled_for(g)
    for plan in (cp.forward_plan, cp.backward_plan):
        drops = plan.last_uses
        assert len(drops) == len(plan.steps)
        seen = [v for d in drops for v in d]
        assert len(seen) == len(set(seen))
        for i, dead in enumerate(drops):
            for v in dead:
                readers = [j for j, s in enumerate(plan.steps) if v in s.inputs]
                producer = [j for j, s in enumerate(plan.steps) if v in (s.output, s.extra)]
                assert max(readers + producer) == i


@pytest.mark.parametrize("model,dims", MODELS, ids=lambda c: getattr(c, "__name__", ""))
def test_intermediates_are_released_while_the_plan_runs(model, dims, monkeypatch):
    """Weak references to every step output: when the last step runs, only the values the
    plans return and the values still to be read are alive (the forward's saved values
    included: the backward drops them after their last reader)."""
    refs, alive_at = [], []            # (weakref, value); per call: (step, values alive)
    real = execute.run_step

    def spy(step, args, ix, backend, *rest):
        gc.collect()
        alive_at.append((step, {v for r, v in refs if r() is not None}))
        out = real(step, args, ix, backend, *rest)
        extra = (step.extra,) if isinstance(out, tuple) else ()
        for t, v in zip(out if isinstance(out, tuple) else (out,), (step.output,) + extra):
            if isinstance(t, torch.Tensor):
                refs.append((weakref.ref(t), v))
        return out

    monkeypatch.setattr(execute, "run_step", spy)
    m, g, _ = _run(model, dims)
    cp = m.program.compiled_for(g)
    last = cp.backward_plan.steps[-1]
    alive = [vals for step, vals in alive_at if step is last][-1]
    # The forward's saved values are freed by the backward too, after their last reader.
    read_last = {v for v, leaf in zip(cp.saved_values, cp.saved_leaves) if leaf in last.inputs}
    # An output that is a view (RGAT's, of its attention's rows) holds its base alive.
    bases = {s.inputs[0] for s in cp.forward_plan.steps if s.output in cp.forward_plan.outputs
             and getattr(s.spec, "schedule", None) == "view"}
    allowed = (set(cp.backward_plan.outputs) | set(last.inputs) | read_last
               | set(cp.forward_plan.outputs) | bases)
    assert alive <= allowed, [v for v in alive if v not in allowed]
    # and most of the backward's intermediates are gone by then
    temps = {s.output for s in cp.backward_plan.steps} - set(cp.backward_plan.outputs)
    assert len(temps - alive) >= len(temps) // 2, (len(temps & alive), len(temps))


@pytest.mark.parametrize("model,dims", MODELS, ids=lambda c: getattr(c, "__name__", ""))
def test_releasing_values_keeps_the_gradients(model, dims):
    _, _, got = _run(model, dims, "ir")
    _, _, ref = _run(model, dims, "torch")
    assert rel_err(got, ref) < 1e-5


def test_attention_output_keeps_no_padding_rows(monkeypatch):
    """HGT's derived graph has more rows than nodes (compact sources outnumber them): the
    attention step returns node rows that own their storage, so the padded output is not
    kept alive through the backward by a slice."""
    from helpers import device_for
    if device_for("triton").type == "cpu":
        import os
        if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            pytest.skip("no CUDA and TRITON_INTERPRET is not set")
    seen = []
    real = execute.run_attention

    def spy(step, inputs, ix, backend):
        out = real(step, inputs, ix, backend)
        seen.append((out[0], ix.graph.num_nodes))
        return out

    monkeypatch.setattr(execute, "run_attention", spy)
    torch.manual_seed(0)
    dev = device_for("triton")
    g = _graph().to(dev)
    m = hcompile(models.hgt, num_relations=3, num_node_types=2, backend="triton",
                 in_dim=8, out_dim=8, heads=2).to(dev)
    x = torch.randn(20, 8, device=dev, requires_grad=True)
    m(g, x=x).sum().backward()
    assert seen
    for out, nodes in seen:
        assert out.shape[0] == nodes
        assert out.untyped_storage().nbytes() == out.numel() * out.element_size()


@pytest.mark.parametrize("model,dims", MODELS, ids=lambda c: getattr(c, "__name__", ""))
def test_second_backward_needs_retain_saved(model, dims):
    """The first backward freed the saved values: a second one through the same forward
    says how to keep them, and inside ``hector.retain_saved`` it gives the same gradients."""
    torch.manual_seed(0)
    g = _graph()
    m = hcompile(model, num_relations=3, num_node_types=2, backend="torch", **dims)
    x = torch.randn(20, dims["in_dim"], requires_grad=True)
    loss = m(g, x=x).square().sum()
    first, = torch.autograd.grad(loss, [x], retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_saved"):
        torch.autograd.grad(loss, [x])
    with hector.retain_saved():
        loss = m(g, x=x).square().sum()
    a, = torch.autograd.grad(loss, [x], retain_graph=True)
    b, = torch.autograd.grad(loss, [x])
    assert torch.equal(a, first) and torch.equal(b, first)
