"""Runs a :class:`~hector.compiler.plan.Plan` on a backend.

Two ways to differentiate:

* ``autodiff="torch"``: the forward plan runs with torch autograd recording its torch ops
  (the reference path);
* ``autodiff="ir"``: :class:`PlanFunction`, a ``torch.autograd.Function`` that runs the
  forward plan without recording, keeps the forward values the backward plan reads
  (``saved`` leaves of the backward IR), and in ``backward`` runs the backward plan, which the
  IR-level autodiff produced and the same passes and lowering compiled.

Backends: ``torch`` evaluates every step with plain torch ops; ``triton`` runs GEMM steps on
the segment-GEMM kernels, attention steps (forward and backward) on the fused attention
kernels, cosine steps on the cosine_qk kernels, traversal steps
whose spec names a kernel (``TraversalSpec.kernel``) on the traversal kernels, and the
remaining traversal and weight steps with torch ops.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..graph.derived import has_in_edges
from .ir import Op, Value, toposort
from .plan import Plan, Step
from .lower import extra_cols
from .lower_gemm import gemm_addend, gemm_parts
from .steps_torch import (GraphIndex, attention_torch_lse, eval_body, eval_op, extra_product,
                          per_argument)
from .steps_triton.attention import run_attention, run_attention_bwd
from .steps_triton.cosine import run_cosine
from .steps_triton.gemm import kernel_weight, run_gemm, run_wgrad, run_wsum, run_weight
from .steps_triton.traversal import prepare_traversals, run_traversal


def triton_step(step: Step) -> bool:
    """Whether the Triton backend runs ``step`` on a Triton kernel (the rest: torch ops)."""
    # The traversal kernels are custom ops (hector::traverse, hector::edge_softmax): a compiled
    # plan runs them as eager does.
    return step.template in ("attention", "gemm", "cosine") or (
        step.template == "traversal" and step.spec.kernel is not None) or (
        step.template == "weight" and kernel_weight(step.body)
        and all(a.op == Op.ARG for a in step.body.args))


def run_step(step: Step, args: List[torch.Tensor], ix: GraphIndex, backend: str,
             donated: frozenset = frozenset()):
    """A step's output; for a forward attention (out, log-sum-exp), for a weight gradient
    paired with a bias gradient (dW, db), for an attention backward a dict role -> gradient
    and for a cosine step a dict role -> output, which ``select`` steps read.
    ``donated``: positions of ``args`` that no one reads after this step (an attention
    backward may write its gradients over them)."""
    if step.template == "select":
        return args[0][step.body.attr("role")]
    if step.template == "cosine":
        return run_cosine(step, args, ix, "triton" if backend == "triton" else "torch")
    if step.template == "attention" and step.body.op == Op.ATTENTION_BWD:
        return run_attention_bwd(step, args, ix, backend if backend == "triton" else "torch",
                                 donated)
    if step.template == "attention" and backend != "triton":
        return attention_torch_lse(step.body, per_argument(step.body, args), ix)
    if backend == "triton" and triton_step(step):
        if step.template == "attention":
            return run_attention(step, args, ix, "triton")
        if step.template == "traversal":
            return run_traversal(step, args, ix)
        if step.template == "weight":
            return run_weight(step.body, args)
        if step.body.op == Op.WGRAD:
            return run_wgrad(step, args[0], args[1], ix)
        if step.body.op == Op.WSUM:
            return run_wsum(step, args[0], ix)
        body, addend = gemm_addend(step.body)
        _, bias = gemm_parts(body)
        return run_gemm(step, args[0], args[1], ix, "triton",
                        args[bias.attr("index")] if bias is not None else None,
                        args[addend.attr("index")] if addend is not None else None,
                        args[-1] if extra_cols(step) else None)
    if extra_cols(step):     # (y, y V): the product the Triton kernel's epilogue forms
        y = eval_body(step.body, args, ix)
        return y, extra_product(y, args[-1], step.extra.shape)
    if step.extra is not None and step.body.op == Op.WGRAD:    # (dW, db) of one dy
        dy = args[step.body.args[1].attr("index")]
        return eval_body(step.body, args, ix), eval_body(step.extra.attr("body"), [dy], ix)
    return eval_body(step.body, args, ix)


def run_plan(plan: Plan, ix: GraphIndex, leaves: Dict[Value, torch.Tensor],
             backend: str, releases=None, consume: bool = False,
             overwritable: frozenset = frozenset(),
             then: Optional[Plan] = None) -> Dict[Value, torch.Tensor]:
    """The plan's values by IR value that survive it: each value in ``releases[i]``
    (default ``plan.last_uses``; a forward that records for its backward keeps the saved
    values: ``BackwardPart.forward_releases``) is dropped after step ``i``.  ``consume``:
    ``leaves`` is emptied, so a leaf the plan drops is freed then (the backward's saved
    values), not when the caller's dict goes.  ``overwritable``: leaves only this run holds
    (saved forward intermediates): a step reading one for the last time, whose storage no
    value alive after it shares, may write its output over it (:func:`_donated`).
    ``then``: the plan that will run next on the same graph (a forward's backward), whose
    traversals are prepared with this plan's."""
    env = dict(leaves)
    given = set(leaves)
    if consume:
        leaves.clear()
    for leaf in plan.leaves:
        if leaf not in env:
            if leaf.op == Op.CONST:
                env[leaf] = torch.full((ix.rows[leaf.kind],) + leaf.shape, leaf.attr("value"),
                                       device=ix.graph.device)
            elif leaf.op == Op.HAS_EDGES:       # (in the layer inputs' dtype)
                dtype = next((t.dtype for v, t in env.items() if v.op == Op.INPUT),
                             next((t.dtype for t in env.values() if t.is_floating_point()),
                                  torch.float32))
                env[leaf] = has_in_edges(ix.graph, dtype).view(-1, 1, 1)
            else:
                raise ValueError(f"plan leaf {leaf.op}({dict(leaf.attrs)}) has no value")
    # The traversal CSRs' row bins in one read; not while torch.compile traces (a host read
    # there would break the graph: each CSR then reads its own inside its custom op).
    if backend == "triton" and not torch.compiler.is_compiling():
        prepare_traversals([plan.steps] + ([then.steps] if then is not None else []), ix)
    for step, dead in zip(plan.steps, plan.last_uses if releases is None else releases):
        if step.output not in given:     # else a weight root the caller evaluated already
            args = [env[i] for i in step.inputs]
            out = run_step(step, args, ix, backend,
                           _donated(step, args, dead, env, overwritable) if overwritable
                           else frozenset())
            if step.extra is not None:
                out, env[step.extra] = out
            env[step.output] = out
        for v in dead:
            env.pop(v, None)
    return env


def _donated(step: Step, args: List[torch.Tensor], dead, env, overwritable) -> frozenset:
    """Positions of ``args`` whose values are ``overwritable``, read for the last time by
    ``step`` (in ``dead``), and whose storage no other value of ``env`` that outlives the
    step shares (a column slice of the same buffer, say)."""
    mine = [i for i, v in enumerate(step.inputs) if v in overwritable and v in dead]
    if not mine:
        return frozenset()
    kept = {t.untyped_storage().data_ptr() for v, val in env.items() if v not in dead
            for t in _tensors(val)}
    return frozenset(i for i in mine if args[i].untyped_storage().data_ptr() not in kept)


def _tensors(val):
    """The tensors of one plan value (a tensor, an (out, lse) pair, a role -> gradient dict)."""
    if isinstance(val, torch.Tensor):
        return (val,)
    items = val.values() if isinstance(val, dict) else val if isinstance(val, tuple) else ()
    return tuple(t for t in items if isinstance(t, torch.Tensor))


_RETAIN = threading.local()


@contextlib.contextmanager
def retain_saved():
    """Forwards run inside keep the values their backward reads until the autograd graph
    goes, so that graph can be back-propagated more than once (``backward(retain_graph=
    True)``).  Outside it a compiled layer's backward frees each saved forward value after
    its last reader, as the plan does with its own values (HGT on mag: 3.9 GiB less at the
    backward's peak), and a second backward through the same forward raises."""
    before = getattr(_RETAIN, "on", False)
    _RETAIN.on = True
    try:
        yield
    finally:
        _RETAIN.on = before


def _stash(ctx, saved: List[torch.Tensor], outs, given) -> None:
    """Keep ``saved`` for the backward: in ``save_for_backward`` when retained or traced;
    otherwise in a list the backward takes over and empties.  A saved value that is also an
    output (an attention whose epilogue added the layer's bias) is listed as a detached
    alias: the output itself in ``ctx`` would be a reference cycle, and in
    ``save_for_backward`` it would live to the end of the backward even when the caller
    dropped it (RGAT on mag: +474 MiB at the peak).  The alias shares the output's version
    counter, so an in-place change of the output is still caught, as autograd would."""
    ctx.stashed = not (getattr(_RETAIN, "on", False) or torch.compiler.is_compiling())
    if not ctx.stashed:      # (traced: the compiled backward frees its inputs itself)
        ctx.save_for_backward(*saved)
        ctx.stash, ctx.private = None, frozenset()
        return
    mine = {id(o) for o in outs}
    ctx.stash = [t.detach() if id(t) in mine else t for t in saved]
    ctx.versions = [(i, t._version) for i, t in enumerate(ctx.stash) if id(saved[i]) in mine]
    # (only the Triton backend's attention backward writes over its inputs)
    ctx.private = (_private(ctx.part, saved, given, outs) if ctx.backend == "triton"
                   else frozenset())


def _private(part, saved: List[torch.Tensor], given, outs) -> frozenset:
    """The saved values that only the backward will hold, among those an attention backward
    may overwrite (``overwritable``): computed by the forward, sharing no storage with its
    outputs or with the caller's tensors (inputs, parameters, weight roots)."""
    if not part.overwritable:
        return frozenset()
    user = {t.untyped_storage().data_ptr() for t in (*given.values(), *outs)}
    return frozenset(part.saved_leaves[i] for i in part.overwritable
                     if part.saved_values[i] not in given
                     and saved[i].untyped_storage().data_ptr() not in user)


def _backward_part(compiled, leaves: Tuple[Value, ...], needs: Sequence[bool]):
    """The part of ``compiled``'s backward the leaves that need gradients ask for (eager:
    a first layer's features need none, so their gradient's steps never run); the whole
    backward while torch.compile traces (one traced backward for every caller)."""
    if torch.compiler.is_compiling():
        return compiled.backward_part()
    wanted = {leaf for leaf, need in zip(leaves, needs) if need}
    return compiled.backward_part(tuple(t for t in compiled.grad_targets if t in wanted))


def _take_saved(ctx) -> List[torch.Tensor]:
    """The saved values, once: the list's references go to the caller (whose plan runner
    drops each after its last reader)."""
    if ctx.stashed and ctx.stash is None:
        raise RuntimeError(
            "a hector compiled layer's backward ran twice through one forward: its saved "
            "values were freed by the first backward (to lower its memory peak); run the "
            "forward inside `with hector.retain_saved():` to back-propagate more than once")
    if ctx.stash is None:
        return list(ctx.saved_tensors)
    stash, ctx.stash = ctx.stash, None
    for i, version in ctx.versions:
        if stash[i]._version != version:
            raise RuntimeError(
                "a hector compiled layer's output was modified by an in-place operation "
                "after the forward, and its backward needs the output as it was: use the "
                "out-of-place operation (e.g. `out = out.relu()`, not `out.relu_()`)")
    return stash


class PlanFunction(torch.autograd.Function):
    """Forward plan in ``forward``, backward plan in ``backward`` (IR-level autodiff).

    ``leaves``: the Values of ``tensors``, in order: the forward plan's leaves, then the
    *weight roots* that are not leaves themselves (``W_r @ k``, a basis combination).  The
    caller evaluates those roots with torch ops outside this function (see
    :func:`eval_weight_roots`), so the backward only returns their gradients and torch
    autograd carries them on to the parameters: no ``torch.autograd.grad`` inside the
    backward, which ``torch.compile`` cannot trace, and nothing recomputed there.
    """

    @staticmethod
    def forward(ctx, compiled, ix, backend, leaves: Tuple[Value, ...], *tensors):
        given = dict(zip(leaves, tensors))
        # A weight root the caller evaluated is also the plan's weight step that computes it:
        # given under that step's value, the plan does not compute it a second time.
        for v, t in zip(leaves, tensors):
            made = compiled.materialised.get(v)
            if made is not None:
                given.setdefault(made, t)
        part = _backward_part(compiled, leaves, ctx.needs_input_grad[4:])
        env = run_plan(compiled.forward_plan, ix, given, backend,
                       releases=part.forward_releases, then=part.plan)
        outs = tuple(env[o] for o in compiled.forward_plan.outputs)
        if torch.compiler.is_compiling():
            # torch 2.11's aot_autograd returned zero gradients for every input when an
            # output here is a view of an intermediate that the caller slices further (HGT's
            # per-type outputs; seen on the H200): traced, the outputs are their own tensors.
            outs = tuple(o.clone() for o in outs)
        ctx.compiled, ctx.part, ctx.ix, ctx.backend = compiled, part, ix, backend
        ctx.leaves = leaves
        # (a parameter the optimised program no longer reads: its zero gradient's shape)
        unread = _unread_params(compiled, leaves)
        ctx.unread = [(i, t.shape, t.dtype, t.device) for i, t in enumerate(tensors)
                      if leaves[i] in unread]
        _stash(ctx, [env[v] for v in part.saved_values], outs, given)
        return outs if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx, *grads):
        compiled, part = ctx.compiled, ctx.part
        env = dict(zip(part.saved_leaves, _take_saved(ctx)))
        outs = compiled.forward_plan.outputs
        # A gradient made dense once here: ``out.sum().backward()`` hands an expanded
        # (stride-0) one, and each step reading it would otherwise copy it for itself (RGCN's
        # backward on synthetic wikikg2: five node-sized copies, 1.3 ms of its 17.6, H200).
        for leaf, g, o in zip(compiled.grad_leaves, grads, outs):
            env[leaf] = g.contiguous() if g is not None else torch.zeros(
                (ctx.ix.rows[o.kind],) + o.shape, device=ix_device(ctx.ix))
        # Saved values only this backward holds may take a step's output in their rows
        # (an attention backward's dk and dv over k and v): not when the backward itself
        # records a graph (create_graph), which would read them again.
        mine = ctx.private if ctx.stashed and not torch.is_grad_enabled() else frozenset()
        env = run_plan(part.plan, ctx.ix, env, ctx.backend, consume=True, overwritable=mine)
        by_target = dict(zip(part.targets, (env[o] for o in part.plan.outputs)))
        grads_in = [by_target.get(leaf) if needs else None
                    for leaf, needs in zip(ctx.leaves, ctx.needs_input_grad[4:])]
        # A parameter the optimised program no longer reads (a key bias that the softmax
        # cancels, dropped by reordering) has gradient zero, given as such: optimizers and
        # DistributedDataParallel expect one for every parameter the layer as written reads.
        for i, shape, dtype, device in ctx.unread:
            if ctx.needs_input_grad[4 + i]:
                grads_in[i] = torch.zeros(shape, dtype=dtype, device=device)
        return (None, None, None, None, *grads_in)


def _unread_params(compiled, leaves: Tuple[Value, ...]) -> frozenset:
    """The parameters among ``leaves`` that neither the plans nor a weight root read (found
    once per entry and leaf order)."""
    memo = compiled.forward.__dict__.setdefault("_unread", {})
    found = memo.get(leaves)
    if found is None:
        targets = set(compiled.grad_targets)
        read = set(toposort([v for v in targets if v.op != Op.PARAM]))
        found = memo[leaves] = frozenset(v for v in leaves if v.op == Op.PARAM
                                         and v not in targets and v not in read)
    return found


def ix_device(ix: GraphIndex) -> torch.device:
    return ix.graph.device


def eval_weight_roots(roots: Sequence[Value], leaves: Dict[Value, torch.Tensor],
                      ix: GraphIndex, backend: str = "torch") -> List[torch.Tensor]:
    """The weight roots' values from the parameters, with torch ops that autograd records
    (tiny: weight-sized expressions); on the Triton backend, the ops that have a kernel of
    their own (``steps_triton.gemm.kernel_weight``) on it, with its registered backward."""
    memo: Dict[Value, torch.Tensor] = dict(leaves)
    for v in toposort(list(roots)):
        if v not in memo:
            args = [memo[a] for a in v.args]
            memo[v] = (run_weight(v, args) if backend == "triton" and kernel_weight(v)
                       else eval_op(v, args, ix))
    return [memo[r] for r in roots]


def execute(compiled, ix: GraphIndex, leaves: Dict[Value, torch.Tensor], backend: str,
            autodiff: str) -> Sequence[torch.Tensor]:
    """Run ``compiled`` (a :class:`hector.compiler.program.CompiledPlan`) on the leaf tensors."""
    plan = compiled.forward_plan
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in leaves.values())
    if autodiff == "ir" and needs_grad:
        compiled.ensure_backward()   # lazily: the first forward that records a graph builds it
    if autodiff == "torch" or not needs_grad or compiled.backward_plan is None:
        env = run_plan(plan, ix, leaves, backend)
        return [env[o] for o in plan.outputs]
    roots = tuple(t for t in compiled.grad_targets if t not in leaves)
    order = tuple(leaves) + roots
    tensors = [leaves[v] for v in leaves] + eval_weight_roots(roots, leaves, ix, backend)
    out = PlanFunction.apply(compiled, ix, backend, order, *tensors)
    return list(out) if isinstance(out, tuple) else [out]
