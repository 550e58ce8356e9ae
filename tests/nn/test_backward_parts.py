"""A compiled layer's backward runs only what the gradients asked for need: with features
that need no gradient (a first layer's, or every mini-batch's input rows) the steps of their
gradient are left out (``Plan.pruned``, ``BackwardStage.part``), and so are the index
structures and launches those steps would cost and the forward values only they read.  The
parameters' gradients are the same either way, on both backends."""
import pytest
import torch

import hector.compiler.execute as execute
from test_compile import _features, make_case

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")    # interpreter chatter

RELATIONAL = ("rgcn", "rgcn_dense", "rgat", "rgat_1h", "hgt")


def step(name, backend, features_need_grad, parameters_need_grad=True):
    """(parameter gradients, feature gradients, [(backward part, whole backward)]) of one
    forward + backward of the case's layer."""
    layer, args = make_case(name, backend=backend)
    for p in layer.parameters():
        p.requires_grad_(parameters_need_grad)
    feats = {k: v.detach().clone().requires_grad_(features_need_grad)
             for k, v in _features(args).items()}
    call = (feats if isinstance(args[0], dict) else feats["x"],) + tuple(args[1:])
    parts, real = [], execute._backward_part

    def spy(compiled, leaves, needs):
        part, whole = real(compiled, leaves, needs), compiled.backward_part()
        parts.append((part, whole))
        return part
    execute._backward_part = spy
    try:
        out = layer(*call)
        flat = torch.cat([o.flatten() for o in out.values()]) if isinstance(out, dict) \
            else out.flatten()
        (flat * torch.linspace(-1, 1, flat.numel(), device=flat.device)).sum().backward()
    finally:
        execute._backward_part = real
    grads = {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}
    assert bool(grads) == parameters_need_grad
    assert all(v.grad is not None for v in feats.values()) == features_need_grad
    return grads, {k: v.grad for k, v in feats.items()}, parts


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", RELATIONAL)
def test_parameter_gradients_do_not_depend_on_the_features_needing_one(name, backend):
    with_x, _, whole = step(name, backend, True)
    without_x, _, pruned = step(name, backend, False)
    assert with_x.keys() == without_x.keys()
    for n in with_x:
        torch.testing.assert_close(without_x[n], with_x[n], rtol=1e-5, atol=1e-6, msg=n)
    (part, full), = pruned
    assert whole[0][0] is whole[0][1]            # every gradient asked: the whole backward
    # Fewer steps and fewer forward values kept for the backward, none of them new.
    assert len(part.plan.steps) < len(full.plan.steps)
    assert set(part.plan.steps) < set(full.plan.steps)
    assert set(part.saved_values) <= set(full.saved_values)
    assert len(part.targets) < len(full.targets)


def test_pruned_plan_is_closed_and_ordered():
    """Every kept step reads leaves of the pruned plan or outputs of earlier kept steps, in
    the whole plan's order; asking for an output the plan does not have is refused."""
    _, _, parts = step("hgt", "torch", False)
    (part, full), = parts
    plan, made = part.plan, set(part.plan.leaves)
    order = {s: i for i, s in enumerate(full.plan.steps)}
    assert [order[s] for s in plan.steps] == sorted(order[s] for s in plan.steps)
    for s in plan.steps:
        assert set(s.inputs) <= made, s.name
        made.update(v for v in (s.output, s.extra) if v is not None)
    assert set(plan.outputs) <= made and set(plan.leaves) <= set(full.plan.leaves)
    with pytest.raises(ValueError, match="every output must be one of the plan's"):
        plan.pruned(full.plan.outputs)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", ("rgcn", "rgat", "hgt"))
def test_frozen_layer_computes_only_the_feature_gradient(name, backend):
    """Parameters that need no gradient (a frozen layer) leave out the weight gradients'
    steps; the features' gradient is what the whole backward gives."""
    _, whole, _ = step(name, backend, True)
    _, frozen, parts = step(name, backend, True, parameters_need_grad=False)
    (part, full), = parts
    assert len(part.plan.steps) < len(full.plan.steps)
    for k in whole:
        torch.testing.assert_close(frozen[k], whole[k], rtol=1e-5, atol=1e-6, msg=k)
