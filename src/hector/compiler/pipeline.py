"""The compiler pipeline, readable top to bottom (tinygrad style), in two named stages:

:func:`compile_forward` (every call on a new graph shape and dtype):

1. ``canonicalize`` -- one spelling per computation (so later patterns match);
2. ``reorder``      -- linear operator reordering (weight-first products, linears moved
                       across aggregations), by a cost model over graph statistics;
3. ``compact``      -- compact materialization of values that depend only on
                       (src|dst, relation), by row counts;
   ``siblings``     -- linears reading the same rows as one GEMM (horizontal fusion; off
                       with ``fuse``);
4. ``fuse``         -- grouping into kernels of the two templates (segment GEMM, traversal;
                       score + softmax + aggregation as one attention traversal);
5. ``lower``        -- the fused IR as a :class:`~hector.compiler.plan.Plan` of steps with
                       their kernel specs.

:func:`compile_backward` (once per entry, by the first forward that needs gradients, so
inference never pays for it):

6. ``autodiff``     -- reverse-mode IR of the optimised (unfused) forward; the forward values
                       the fused forward plan materialises become ``saved`` leaves;
7. passes 1-4 on the backward IR (logged as ``backward/...``), then ``lower`` again;
8. ``schedule``     -- the backward's steps re-ordered to lower its peak memory (weight
                       gradients as soon as their inputs exist, so the forward values they
                       read are freed before the attention backward's peak; see
                       :mod:`~hector.compiler.schedule`).

Every pass appends a :class:`PassRecord` (IR before and after, decisions with reasons) to
the entry's log in the order it ran; with ``HECTOR_DEBUG=1`` the verifier checks the IR after
each one.

The stages see the graph only through its row counts, and only through the cost models'
:class:`~hector.compiler.passes.common.Cheaper` questions, which their decisions record.  So
a stage's result (:class:`ForwardStage`, :class:`BackwardStage`) is kept with its questions
and answers, and serves any other graph that answers them the same way: a new mini-batch
block costs one evaluation of a few linear expressions, not a compilation.  The entry of a
graph (:class:`CompiledPlan`) is its statistics plus the stages that fit them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .ir import Op, Value, attention_lse, toposort
from .lower import lower, narrowed
from .passes import autodiff, canonicalize, compact, fuse as fusion, reorder, siblings
from .passes.common import Cheaper, Decision, GraphStats
from . import schedule
from .plan import Plan
from ..checks import debug_enabled
from .verify import verify


@dataclass(frozen=True)
class PassRecord:
    name: str
    before: Tuple[Value, ...]
    after: Tuple[Value, ...]
    decisions: Tuple[Decision, ...]


def _questions(log: Sequence[PassRecord]) -> Tuple[Tuple[Cheaper, bool], ...]:
    """The graph questions the passes of ``log`` asked, with the answers they got."""
    return tuple((d.question, d.applied) for rec in log for d in rec.decisions
                 if d.question is not None)


def _fits(questions, stats: GraphStats) -> bool:
    return all(q.answer(stats) == answer for q, answer in questions)


@dataclass
class ForwardStage:
    """Stage 1's result: graph-independent but for its ``questions``.  Every graph whose
    statistics answer them the same way gets exactly these plans (the passes are
    deterministic and see the graph only through those questions), so one stage serves
    every such graph -- every batch of a mini-batch loop, typically."""
    dtype: torch.dtype
    options: Dict[str, object]               # reorder / compact / fuse switches, strategy
    questions: Tuple[Tuple[Cheaper, bool], ...]
    forward_ir: Tuple[Value, ...]            # fused forward IR (kernel nodes)
    forward_plan: Plan
    log: List[PassRecord]                    # forward passes (reasons cite the first graph)
    differentiable: bool = False             # autodiff='ir': compile_backward may build one
    optimized: Tuple[Value, ...] = ()        # unfused forward IR after passes 1-3 (autodiff's input)
    materialised: Dict[Value, Value] = field(default_factory=dict, repr=False)  # see fuse.run
    backwards: List["BackwardStage"] = field(default_factory=list, repr=False)

    def fits(self, stats: GraphStats) -> bool:
        return _fits(self.questions, stats)


@dataclass(frozen=True)
class BackwardStage:
    """Stage 2's result for one forward stage, shared the same way (its own ``questions``:
    the backward IR goes through the cost models too)."""
    questions: Tuple[Tuple[Cheaper, bool], ...]
    backward_plan: Plan
    saved_values: Tuple[Value, ...]          # forward-plan values kept for the backward
    saved_leaves: Tuple[Value, ...]          # their ``saved`` leaves in the backward plan
    grad_leaves: Tuple[Value, ...]           # ``grad_output`` leaves, one per forward output
    grad_targets: Tuple[Value, ...]          # forward leaf whose gradient each output is
    log: Tuple[PassRecord, ...]
    #: :meth:`part` per gradient subset (a few: which of a layer's inputs need gradients)
    parts: Dict[Tuple[Value, ...], "BackwardPart"] = field(
        default_factory=dict, repr=False, compare=False)

    def fits(self, stats: GraphStats) -> bool:
        return _fits(self.questions, stats)

    def part(self, targets: Tuple[Value, ...], forward_plan: Plan) -> "BackwardPart":
        """What the gradients of ``targets`` alone need (``grad_targets`` order; all of them:
        the whole stage): the backward plan pruned to them (``lower.narrowed``: its
        attention and cosine backwards computing only the gradients they need), the forward
        values it reads and the forward's releases keeping just those (the rest is freed in
        the forward, as when nothing records)."""
        found = self.parts.get(targets)
        if found is None:
            outs = tuple(o for t, o in zip(self.grad_targets, self.backward_plan.outputs)
                         if t in targets)
            plan = (self.backward_plan if len(outs) == len(self.backward_plan.outputs)
                    else narrowed(self.backward_plan, outs))
            read = set(plan.leaves)
            kept = [i for i, leaf in enumerate(self.saved_leaves) if leaf in read]
            saved_values = tuple(self.saved_values[i] for i in kept)
            found = self.parts[targets] = BackwardPart(
                plan, targets, saved_values, tuple(self.saved_leaves[i] for i in kept),
                forward_plan.releases(saved_values))
        return found


@dataclass(frozen=True)
class BackwardPart:
    """The part of a :class:`BackwardStage` that some of its gradients need
    (:meth:`BackwardStage.part`): what a forward that records keeps, and what its backward
    runs."""
    plan: Plan
    targets: Tuple[Value, ...]               # forward leaf whose gradient each output is
    saved_values: Tuple[Value, ...]          # forward-plan values kept for this plan
    saved_leaves: Tuple[Value, ...]          # their ``saved`` leaves in it
    #: the forward plan's ``releases`` keeping ``saved_values`` (what the forward drops
    #: when it records for this part)
    forward_releases: Tuple[Tuple[Value, ...], ...]

    @functools.cached_property
    def overwritable(self) -> Tuple[int, ...]:
        """Indices of the saved values an attention backward step reads (its k and v among
        them): the candidates whose rows that step may write its gradients over."""
        read = {v for s in self.plan.steps
                if s.template == "attention" and s.body.op == Op.ATTENTION_BWD
                for v in s.inputs}
        return tuple(i for i, leaf in enumerate(self.saved_leaves) if leaf in read)


#: Backward stages kept per forward stage (graphs that agree on the forward's questions but
#: not on the backward's); a few at most in practice.
BACKWARDS_PER_STAGE = 4


class CompiledPlan:
    """The compiled entry of one graph shape: its statistics, the forward stage that fits
    them and, once a forward needed gradients, the backward stage.  Reads like one record
    (``forward_plan``, ``backward_plan``, ``log``, ...) whichever graph built the stages."""

    def __init__(self, stats: GraphStats, forward: ForwardStage,
                 backward: Optional[BackwardStage] = None):
        self.stats, self.forward, self.backward = stats, forward, backward

    # The forward stage's fields.
    dtype = property(lambda self: self.forward.dtype)
    options = property(lambda self: self.forward.options)
    forward_ir = property(lambda self: self.forward.forward_ir)
    forward_plan = property(lambda self: self.forward.forward_plan)
    differentiable = property(lambda self: self.forward.differentiable)
    optimized = property(lambda self: self.forward.optimized)
    materialised = property(lambda self: self.forward.materialised)

    # The backward stage's (None / empty before it is built).
    backward_plan = property(lambda self: self.backward and self.backward.backward_plan)
    saved_values = property(lambda self: self.backward.saved_values if self.backward else ())
    saved_leaves = property(lambda self: self.backward.saved_leaves if self.backward else ())
    grad_leaves = property(lambda self: self.backward.grad_leaves if self.backward else ())
    grad_targets = property(lambda self: self.backward.grad_targets if self.backward else ())

    def backward_part(self, targets: Optional[Tuple[Value, ...]] = None) -> "BackwardPart":
        """The backward stage's part for the gradients of ``targets`` (None: all)."""
        wanted = self.grad_targets if targets is None else targets
        return self.backward.part(tuple(wanted), self.forward_plan)

    @property
    def log(self) -> List[PassRecord]:
        """Every pass record, forward then backward, in the order they ran."""
        return self.forward.log + (list(self.backward.log) if self.backward else [])

    def ensure_backward(self) -> "CompiledPlan":
        """Run :func:`compile_backward` on this entry unless it has run (the executor calls
        this lazily; a failed build leaves the entry as it was, so it is retried)."""
        return compile_backward(self)


def _run(name, fn, outputs, stats, enabled, log: List[PassRecord]):
    after, decisions = fn(tuple(outputs), stats, enabled)
    if debug_enabled():
        verify(after, where=f"after pass {name}")
    log.append(PassRecord(name, tuple(outputs), tuple(after), tuple(decisions)))
    return after


def optimize(outputs: Sequence[Value], stats: Optional[GraphStats], *, reorder_on: bool = True,
             compact_on: bool = True, fuse_on: bool = True,
             log: Optional[List[PassRecord]] = None, prefix: str = "") -> Tuple[Value, ...]:
    """Passes 1-3 and horizontal fusion (what forward and backward IR both go through
    before kernel grouping)."""
    log = [] if log is None else log
    outputs = _run(prefix + "canonicalize", canonicalize.run, outputs, stats, True, log)
    outputs = _run(prefix + "reorder", reorder.run, outputs, stats, reorder_on, log)
    outputs = _run(prefix + "compact", compact.run, outputs, stats, compact_on, log)
    outputs = _run(prefix + "siblings", siblings.run, outputs, stats, fuse_on, log)
    return outputs


def compile_forward(outputs: Sequence[Value], stats: Optional[GraphStats],
                    dtype: torch.dtype = torch.float32, *, reorder: bool = True,
                    compact: bool = True, fuse: bool = True,
                    differentiable: bool = False, strategy: str = "auto") -> CompiledPlan:
    """Stage 1: passes 1-4 and lowering of the forward IR; returns the compiled entry.
    ``differentiable``: :func:`compile_backward` may later add the backward to it.
    ``strategy``: the fused attentions' schedule ('auto': dynamic fusion's choice per graph,
    'node' or 'edge'), forward and backward."""
    log: List[PassRecord] = []
    if debug_enabled():
        verify(outputs, where="captured IR")
    optimized = optimize(outputs, stats, reorder_on=reorder, compact_on=compact, fuse_on=fuse,
                         log=log)
    materialised: Dict[Value, Value] = {}   # unfused value -> plan value holding it
    fused = _run("fuse", functools.partial(fusion.run, mapping=materialised), optimized,
                 stats, fuse, log)
    stage = ForwardStage(dtype, dict(reorder=reorder, compact=compact, fuse=fuse,
                                     strategy=strategy),
                         _questions(log), tuple(fused), lower(fused, dtype, strategy), log,
                         differentiable, tuple(optimized), materialised)
    return CompiledPlan(stats, stage)


def compile_backward(entry: CompiledPlan) -> CompiledPlan:
    """Stage 2 (once per entry, only when ``entry.differentiable``): autodiff of the optimised
    forward IR, passes 1-4 on the backward IR, lowering; its records follow the forward's in
    ``entry.log``.  A backward stage the entry's forward stage already holds is reused when
    this entry's statistics answer its questions the same way."""
    if not entry.differentiable or entry.backward is not None:
        return entry
    stage = entry.forward
    for known in stage.backwards:
        if known.fits(entry.stats):
            if debug_enabled():
                check_same_plan(known.backward_plan,
                                _backward_stage(stage, entry.stats).backward_plan, entry.stats)
            entry.backward = known
            return entry
    # Set only once the build succeeded (a failure is retried cleanly).
    entry.backward = _backward_stage(stage, entry.stats)
    stage.backwards.append(entry.backward)
    del stage.backwards[:-BACKWARDS_PER_STAGE]
    return entry


def _backward_stage(stage: ForwardStage, stats: GraphStats) -> BackwardStage:
    opts, log = stage.options, []
    forward, materialised, fused = _autodiff_input(stage)
    bwd = autodiff.bind_saved(autodiff.differentiate(forward), forward, materialised)
    log.append(PassRecord("autodiff", forward, bwd.outputs, tuple(fused) + bwd.decisions))
    b_out = optimize(bwd.outputs, stats, reorder_on=opts["reorder"],
                     compact_on=opts["compact"], fuse_on=opts["fuse"], log=log,
                     prefix="backward/")
    b_out = _run("backward/fuse", fusion.run, b_out, stats, opts["fuse"], log)
    plan = schedule.for_memory(lower(b_out, stage.dtype, opts["strategy"]))
    return BackwardStage(_questions(log), plan, bwd.saved_values,
                         bwd.saved_leaves, bwd.grad_leaves, bwd.targets, tuple(log))


def _autodiff_input(stage: ForwardStage):
    """(forward IR autodiff differentiates, its value -> forward plan value map, decisions).
    With fusion on, attentions whose fused backward applies are differentiated as one
    operator (``fuse.attention_for_autodiff``), so their gradients run on the attention
    backward kernels; the fused forward plan saves their log-sum-exp for it."""
    if not stage.options["fuse"]:
        return stage.optimized, stage.materialised, []
    forward, memo, decisions = fusion.attention_for_autodiff(stage.optimized)
    materialised = {memo[o]: p for o, p in stage.materialised.items() if o in memo}
    # Values no original one became (an attention with a bias or addend, the addend ``A + b``
    # of ``fuse_attention._fold_bias``) are the forward's own.
    materialised.update((v, p) for v, p in stage.materialised.items() if v not in memo)
    for v in toposort(forward):
        if v.op == Op.ATTENTION and v in materialised:
            materialised[attention_lse(v)] = attention_lse(materialised[v])
    return forward, materialised, decisions


def check_same_plan(shared: Plan, own: Plan, stats: GraphStats) -> None:
    """``HECTOR_DEBUG=1``: a shared stage's plan must equal the one compiled for ``stats``
    itself (else a pass reads the graph beside its ``Cheaper`` questions)."""
    if shared != own:
        raise AssertionError(f"a shared compiled stage differs from the compilation for "
                             f"{stats}: a pass reads graph statistics outside its Cheaper "
                             f"questions")
