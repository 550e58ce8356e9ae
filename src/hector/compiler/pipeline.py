"""The compiler pipeline, readable top to bottom (tinygrad style), in two named stages:

:func:`compile_forward` (every call on a new graph shape and dtype):

1. ``canonicalize`` -- one spelling per computation (so later patterns match);
2. ``reorder``      -- linear operator reordering (weight-first products, linears moved
                       across aggregations), by a cost model over graph statistics;
3. ``compact``      -- compact materialization of values that depend only on
                       (src|dst, relation), by row counts;
4. ``fuse``         -- grouping into kernels of the two templates (segment GEMM, traversal;
                       score + softmax + aggregation as one attention traversal);
5. ``lower``        -- the fused IR as a :class:`~hector.compiler.plan.Plan` of steps with
                       their kernel specs.

:func:`compile_backward` (once per entry, by the first forward that needs gradients, so
inference never pays for it):

6. ``autodiff``     -- reverse-mode IR of the optimised (unfused) forward; the forward values
                       the fused forward plan materialises become ``saved`` leaves;
7. passes 1-4 on the backward IR (logged as ``backward/...``), then ``lower`` again.

Every pass appends a :class:`PassRecord` (IR before and after, decisions with reasons) to
the entry's log in the order it ran; with ``HECTOR_DEBUG=1`` the verifier checks the IR after
each one.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .ir import Value
from .lower import lower
from .passes import autodiff, canonicalize, compact, fuse as fusion, reorder
from .passes.common import Decision, GraphStats
from .plan import Plan
from .verify import debug_enabled, verify


@dataclass(frozen=True)
class PassRecord:
    name: str
    before: Tuple[Value, ...]
    after: Tuple[Value, ...]
    decisions: Tuple[Decision, ...]


@dataclass
class CompiledPlan:
    """The compiled entry of one (graph shape, dtype): plans, the pass log, and what the
    backward stage starts from."""
    stats: GraphStats
    dtype: torch.dtype
    options: Dict[str, bool]                 # reorder / compact / fuse switches
    forward_ir: Tuple[Value, ...]            # fused forward IR (kernel nodes)
    forward_plan: Plan
    log: List[PassRecord]
    differentiable: bool = False             # autodiff='ir': compile_backward may build one
    optimized: Tuple[Value, ...] = ()        # unfused forward IR after passes 1-3 (autodiff's input)
    materialised: Dict[Value, Value] = field(default_factory=dict, repr=False)  # see fuse.run
    backward_plan: Optional[Plan] = None
    saved_values: Tuple[Value, ...] = ()     # forward-plan values kept for the backward
    saved_leaves: Tuple[Value, ...] = ()     # their ``saved`` leaves in the backward plan
    grad_leaves: Tuple[Value, ...] = ()      # ``grad_output`` leaves, one per forward output
    grad_targets: Tuple[Value, ...] = ()     # forward leaf whose gradient each output is
    extra: Dict[str, object] = field(default_factory=dict)

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
             compact_on: bool = True, log: Optional[List[PassRecord]] = None,
             prefix: str = "") -> Tuple[Value, ...]:
    """Passes 1-3 (what forward and backward IR both go through before fusion)."""
    log = [] if log is None else log
    outputs = _run(prefix + "canonicalize", canonicalize.run, outputs, stats, True, log)
    outputs = _run(prefix + "reorder", reorder.run, outputs, stats, reorder_on, log)
    outputs = _run(prefix + "compact", compact.run, outputs, stats, compact_on, log)
    return outputs


def compile_forward(outputs: Sequence[Value], stats: Optional[GraphStats],
                    dtype: torch.dtype = torch.float32, *, reorder: bool = True,
                    compact: bool = True, fuse: bool = True,
                    differentiable: bool = False) -> CompiledPlan:
    """Stage 1: passes 1-4 and lowering of the forward IR; returns the compiled entry.
    ``differentiable``: :func:`compile_backward` may later add the backward to it."""
    log: List[PassRecord] = []
    if debug_enabled():
        verify(outputs, where="captured IR")
    optimized = optimize(outputs, stats, reorder_on=reorder, compact_on=compact, log=log)
    materialised: Dict[Value, Value] = {}   # unfused value -> plan value holding it
    fused = _run("fuse", functools.partial(fusion.run, mapping=materialised), optimized,
                 stats, fuse, log)
    return CompiledPlan(stats, dtype, dict(reorder=reorder, compact=compact, fuse=fuse),
                        tuple(fused), lower(fused, dtype), log, differentiable,
                        tuple(optimized), materialised)


def compile_backward(entry: CompiledPlan) -> CompiledPlan:
    """Stage 2 (once per entry, only when ``entry.differentiable``): autodiff of the optimised
    forward IR, passes 1-4 on the backward IR, lowering; its records follow the forward's in
    ``entry.log``."""
    if not entry.differentiable or entry.backward_plan is not None:
        return entry
    opts, stats, log = entry.options, entry.stats, []
    bwd = autodiff.differentiate(entry.optimized)
    log.append(PassRecord("autodiff", entry.optimized, bwd.outputs, tuple(bwd.decisions)))
    bwd = autodiff.bind_saved(bwd, entry.optimized, entry.materialised)
    b_out = optimize(bwd.outputs, stats, reorder_on=opts["reorder"],
                     compact_on=opts["compact"], log=log, prefix="backward/")
    b_out = _run("backward/fuse", fusion.run, b_out, stats, opts["fuse"], log)
    # Fill the entry only once everything above succeeded (a failure is retried cleanly).
    entry.backward_plan = lower(b_out, entry.dtype)
    entry.saved_values, entry.saved_leaves = bwd.saved_values, bwd.saved_leaves
    entry.grad_leaves, entry.grad_targets = bwd.grad_leaves, bwd.targets
    entry.log.extend(log)
    return entry
