"""The backward plan's step order for memory (``hector.compiler.schedule``) and the replay that
measures it (``hector.compiler.memory``).

The order must respect every data dependency (same steps, each input made before it is read),
keep the gradients exactly those of the lowering's order, never raise the replayed peak,
and on HGT lower it at mag's row counts (the weight gradients that read forward values run
before the attention backward).  The replay's sizes are checked against the tensors a
torch-backend run makes."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import execute, models, schedule
from hector.compiler.ir import Op
from hector.compiler.memory import simulate, value_bytes
from hector.compiler.passes.common import GraphStats
from hector.compiler.program import compile as hcompile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import random_relational  # noqa: E402

MODELS = [(models.hgt, dict(in_dim=8, out_dim=8, heads=2)),
          (models.hgt, dict(in_dim=8, out_dim=16, heads=1)),
          (models.rgat, dict(in_dim=8, out_dim=4, heads=2)),
          (models.rgcn, dict(in_dim=8, out_dim=8))]
IDS = ["hgt", "hgt-noskip", "rgat", "rgcn"]
#: synthetic:mag's row counts (hector.datasets.synthetic, profile "mag").
MAG = GraphStats(num_nodes=1939743, num_edges=21111007, compact_src_rows=3057409,
                 compact_dst_rows=1514340, num_relations=4, num_node_types=4)


def _graph():
    ei, et = random_relational(num_nodes=20, num_edges=70, num_relations=4, empty=(1,))
    return hector.Graph(ei, edge_type=et, num_nodes=20, num_relations=4,
                        node_type=(torch.arange(20) >= 12).long() * 3, num_node_types=4)


def _run(model, dims, monkeypatch=None, scheduled=True):
    if not scheduled:
        monkeypatch.setattr(schedule, "for_memory", lambda plan, keep=(): plan)
    torch.manual_seed(0)
    m = hcompile(model, num_relations=4, num_node_types=4, backend="torch", **dims)
    g = _graph()
    x = torch.randn(20, dims["in_dim"], generator=torch.Generator().manual_seed(1),
                    requires_grad=True)
    out = m(g, x=x)
    grads = torch.autograd.grad((out * out).sum(), [x] + list(m.parameters()))
    return m.program.compiled_for(g), grads


@pytest.mark.parametrize("model,dims", MODELS, ids=IDS)
def test_order_respects_every_dependency(model, dims):
    cp, _ = _run(model, dims)
    plan = cp.backward_plan
    made = set(plan.leaves)
    for step in plan.steps:
        assert all(v in made for v in step.inputs), step.name
        made.update(v for v in (step.output, step.extra) if v is not None)
    assert all(o in made for o in plan.outputs)


@pytest.mark.parametrize("model,dims", MODELS, ids=IDS)
def test_same_steps_and_gradients_as_lowerings_order(model, dims, monkeypatch):
    cp, grads = _run(model, dims)
    with monkeypatch.context() as mp:
        base, base_grads = _run(model, dims, mp, scheduled=False)
    assert len(cp.backward_plan.steps) == len(base.backward_plan.steps)
    assert set(cp.backward_plan.steps) == set(base.backward_plan.steps)
    for g, b in zip(grads, base_grads):
        torch.testing.assert_close(g, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model,dims", MODELS, ids=IDS)
def test_never_raises_the_peak_but_by_weight_gradients(model, dims, monkeypatch):
    """At mag's rows and the test graph's.  The order is chosen without the graph's sizes
    and without weights (graph-independent), so an early weight gradient may be held
    longer: that, at most, on a 20-node graph where weights are as large as the values."""
    cp, _ = _run(model, dims)
    with monkeypatch.context() as mp:
        base, _ = _run(model, dims, mp, scheduled=False)
    for stats in (cp.stats, MAG):
        new = max(p.live for p in simulate(cp, stats)[0])
        old = max(p.live for p in simulate(base, stats)[0])
        grads = sum(value_bytes(o, stats) for o in cp.backward_plan.outputs
                    if o.kind == "weight")
        assert new <= old + grads


def test_hgt_weight_gradients_run_before_the_attention_backward(monkeypatch):
    cp, _ = _run(models.hgt, dict(in_dim=8, out_dim=8, heads=1))
    steps = cp.backward_plan.steps
    att = next(i for i, s in enumerate(steps) if s.template == "attention")
    # The output linear's weight gradient reads gelu(attention output), a forward value
    # nothing else in the backward reads: it runs first, freeing that value.
    wgrads_before = [s for s in steps[:att] if s.body.op == Op.WGRAD]
    assert wgrads_before
    with monkeypatch.context() as mp:
        base, _ = _run(models.hgt, dict(in_dim=8, out_dim=8, heads=1), mp, scheduled=False)
    new = max(p.live for p in simulate(cp, MAG)[0])
    old = max(p.live for p in simulate(base, MAG)[0])
    assert new < 0.85 * old, (new / 2**20, old / 2**20)


@pytest.mark.parametrize("model,dims", MODELS, ids=IDS)
def test_replay_sizes_are_the_tensors_the_steps_make(model, dims, monkeypatch):
    """Every step output's bytes in the replay equal the tensor the torch backend made."""
    made = []
    real = execute.run_step

    def spy(step, args, ix, backend, *rest):
        out = real(step, args, ix, backend, *rest)
        made.append((step, out))
        return out
    monkeypatch.setattr(execute, "run_step", spy)
    cp, _ = _run(model, dims)
    stats = cp.stats
    checked = 0
    for step, out in made:
        if step.template == "select":
            continue
        if isinstance(out, dict):        # an attention backward: every role's gradient
            got = sum(t.numel() * t.element_size() for t in out.values())
            roles = step.body.attr("roles")
            want = sum(value_bytes(step.inputs[roles.index(r)], stats)
                       for r in step.body.attr("needs"))
        else:
            t = out[0] if isinstance(out, tuple) else out
            got, want = t.numel() * t.element_size(), value_bytes(step.output, stats)
        assert got == want, step.name
        checked += 1
    assert checked >= len(cp.forward_plan.steps)


@pytest.mark.parametrize("heads", [1, 2])
def test_hgt_rebuilds_what_only_weight_gradients_read(heads, monkeypatch):
    """``K_tau x + b`` and ``V_tau x + b`` are read in the backward only by the relation
    weights' gradients: rebuilt there from x (kept anyway) instead of kept from the forward,
    so two node-sized values fewer are alive at the attention backward's peak."""
    from hector.compiler.passes import autodiff
    dims = dict(in_dim=8, out_dim=8, heads=heads)
    cp, grads = _run(models.hgt, dims)
    rebuilt = [d for rec in cp.log for d in rec.decisions if "recomputed in" in d.what]
    assert len(rebuilt) == 2
    with monkeypatch.context() as mp:
        mp.setattr(autodiff, "recomputed", lambda outputs, kept: [])
        kept, kept_grads = _run(models.hgt, dims)
    rows = [v for v in cp.saved_values if v.kind != "weight"]
    assert len(rows) == len([v for v in kept.saved_values if v.kind != "weight"]) - 2
    for g, k in zip(grads, kept_grads):
        torch.testing.assert_close(g, k, rtol=1e-5, atol=1e-6)
    node = MAG.num_nodes * 8 * 4

    def at_attention(entry):       # live bytes at the attention backward
        return max(p.live for p in simulate(entry, MAG)[0]
                   if p.phase == "backward" and "attention" in p.step)
    new, old = at_attention(cp), at_attention(kept)
    assert new <= old - 2 * node + 4096       # (+ the two bias vectors now saved)


@pytest.mark.parametrize("model,dims", MODELS[2:], ids=IDS[2:])
def test_nothing_rebuilt_where_the_attention_or_a_traversal_reads_it(model, dims):
    cp, _ = _run(model, dims)
    assert not [d for rec in cp.log for d in rec.decisions if "recomputed in" in d.what]
