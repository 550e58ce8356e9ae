"""What a compiled plan holds in memory, step by step, from the row counts alone.

A replay of the forward and backward plans the way :mod:`hector.compiler.execute` runs them:
each step's output is allocated when it runs, each value dropped after its last reader
(``Plan.last_uses``; a forward that records for its backward keeps the values the backward
reads, ``BackwardPart.forward_releases``); the forward's inputs and the backward's output
gradients are held throughout.  A value costs ``rows x heads x features x itemsize`` (a
sliced weight one slice per relation or node type); kernel scratch and allocator rounding
are not counted.  So a plan's peak, and the values that make it, can be read on any machine
for any graph size (``explain`` prints it; ``scripts/memory_peak.py`` sets it beside the
CUDA allocator's replay), and :mod:`hector.compiler.schedule` orders steps by the same replay.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import ir as N
from .ir import WEIGHT, Op, Value
from .passes.common import GraphStats
from .plan import Plan, Step

Size = Callable[[Value], int]


def value_bytes(v: Value, stats: GraphStats, itemsize: int = 4) -> int:
    """Bytes of ``v``'s tensor on a graph with ``stats``: rows of its kind (for a sliced
    weight, its slices) times its shape."""
    if v.kind == WEIGHT:
        rows = {"relation": stats.num_relations, "node_type": stats.num_node_types}.get(v.per, 1)
    else:
        rows = stats.rows(v.kind)
    return rows * math.prod(v.shape) * itemsize


def step_allocs(step: Step, size: Size) -> Dict[Value, int]:
    """The tensors ``step`` allocates, by the value that owns them.  A fused attention
    backward owns every gradient it computes, a cosine step its outputs; a ``select`` step
    takes its role's share over (it is a view: the bytes live while either the step's
    output or the pick is alive)."""
    if step.template == "select" or _is_view(step):
        return {step.output: 0}
    if (step.template == "attention" and step.body.op == Op.ATTENTION_BWD
            or step.template == "cosine"):
        # (a joint buffer's "kv" share is k's and v's, counted once)
        return {step.output: sum(b for r, b in role_sizes(step, size).items() if r != "kv")}
    out = {step.output: size(step.output)}
    if step.extra is not None:
        out[step.extra] = size(step.extra)
    return out


def allocate(held: Dict[Value, int], step: Step, makers: Dict[Value, Step], size: Size) -> None:
    """Add ``step``'s tensors to ``held`` (value -> bytes alive); a ``select`` step's pick
    takes its role's bytes over from the backward step (in ``makers``) whose output it
    views, a view step (``schedule="view"``) its own size from its input."""
    held.update(step_allocs(step, size))
    if step.template == "select" and step.inputs[0] in held:
        share = role_sizes(makers[step.inputs[0]], size)[step.body.attr("role")]
        held[step.inputs[0]] -= share
        held[step.output] = share
    elif _is_view(step) and step.inputs[0] in held:
        # A reshape or a column window of its input: its bytes are the input's, alive while
        # either is (HGT's K and V, two windows of one K|V GEMM output, were counted twice).
        share = min(size(step.output), held[step.inputs[0]])
        held[step.inputs[0]] -= share
        held[step.output] = share


def _is_view(step: Step) -> bool:
    return step.template == "traversal" and getattr(step.spec, "schedule", None) == "view"


def role_sizes(step: Step, size: Size) -> Dict[str, int]:
    """An attention backward step's gradients' sizes, by role; a cosine step's outputs'."""
    if step.template == "cosine":
        return {r: size(N.pick(step.body, r)) for r in N.pick_roles(step.body)}
    roles = step.body.attr("roles")
    sizes = {r: size(step.inputs[roles.index(r)]) for r in step.body.attr("needs")}
    if step.body.attr("joint", False):      # k and v in one buffer (ir.joint_kv)
        sizes["kv"] = sizes["k"] + sizes["v"]
    return sizes


def overwritten(step: Step, dead, overwritable) -> Tuple[Value, ...]:
    """The inputs an attention backward step writes its k and v gradients over: both
    ``overwritable`` and read for the last time by the step (all or none, as the
    executor's ``_into_kv`` decides)."""
    if not overwritable or step.template != "attention" or step.body.op != Op.ATTENTION_BWD:
        return ()
    roles = step.body.attr("roles")
    if "k_norm" in roles:     # (the executor's _into_kv: keys formed from v are not written)
        return ()
    mine = tuple(step.inputs[roles.index(r)] for r in ("v", "k")
                 if r in step.body.attr("needs") and r in roles)
    return mine if mine and all(v in overwritable and v in dead for v in mine) else ()


@dataclass(frozen=True)
class Point:
    """The live bytes right after one step ran (before its dead values are dropped)."""
    phase: str              # 'forward' or 'backward'
    index: int
    step: str
    live: int
    values: Tuple[Tuple[Value, int], ...]   # what is alive, largest first


def replay(plan: Plan, releases: Sequence[Sequence[Value]], held: Dict[Value, int],
           size: Size, phase: str = "", overwritable=frozenset()) -> List[Point]:
    """Run ``plan``'s allocations and drops in order; ``held`` (value -> bytes alive before
    the plan) is updated in place to what survives it.  ``overwritable``: leaves an
    attention backward that reads them last writes its k and v gradients over (the
    executor's ``overwritable``): their bytes pass to the gradients."""
    points, makers = [], {s.output: s for s in plan.steps}
    for i, (step, dead) in enumerate(zip(plan.steps, releases)):
        if step.output in held:          # a weight root the caller evaluated already
            continue
        for v in overwritten(step, dead, overwritable):
            held.pop(v, None)
        allocate(held, step, makers, size)
        points.append(Point(phase, i, step.name, sum(held.values()), tuple(sorted(
            ((v, b) for v, b in held.items() if b), key=lambda t: -t[1]))))
        for v in dead:
            held.pop(v, None)
    return points


def peak(plan: Plan, size: Size, held: Optional[Dict[Value, int]] = None) -> int:
    """The largest live total of ``plan`` (its leaves held throughout unless ``held`` says
    what is alive before it)."""
    held = {v: size(v) for v in plan.leaves} if held is None else dict(held)
    points = replay(plan, plan.last_uses, held, size)
    return max((p.live for p in points), default=sum(held.values()))


def simulate(entry, stats: Optional[GraphStats] = None,
             itemsize: int = 4) -> Tuple[List[Point], Dict[Value, str]]:
    """Live bytes after each forward step, then each backward step, of ``entry`` (a
    :class:`~hector.compiler.pipeline.CompiledPlan`; its backward if built), and a label for
    every value that appears (``input x``, ``fwd[3] gemm_...``, ``saved fwd[3] ...``)."""
    stats = stats or entry.stats

    def size(v: Value) -> int:
        # The attention's log-sum-exp is fp32 whatever the dtype.
        return value_bytes(v, stats, 4 if v.op == Op.ATTENTION_LSE else itemsize)
    fwd, names = entry.forward_plan, {}
    for i, s in enumerate(fwd.steps):
        names[s.output] = f"fwd[{i}] {s.name}"
        if s.extra is not None:
            names[s.extra] = f"fwd[{i}] {s.name} (log-sum-exp)"
    held = {v: size(v) for v in fwd.leaves if v.op == Op.INPUT}
    names.update((v, f"input {v.attr('name')}") for v in held)
    if entry.backward_plan is None:
        return replay(fwd, fwd.last_uses, held, size, "forward"), names
    # A training step whose inputs all need gradients: the whole backward's part.
    part = entry.backward_part()
    points = replay(fwd, part.forward_releases, held, size, "forward")
    kept = {v: b for v, b in held.items() if v.op == Op.INPUT}
    for saved, leaf in zip(part.saved_values, part.saved_leaves):
        # A saved input is the input's own tensor: counted once, as the input.
        kept[leaf] = 0 if saved.op == Op.INPUT else held.get(saved, size(saved))
        names[leaf] = "saved " + names.get(saved, f"{saved.op} {saved.kind}")
    for g in entry.grad_leaves:
        kept[g] = size(g)
        names[g] = "output gradient"
    bwd = part.plan
    names.update((s.output, f"bwd[{i}] {s.name}") for i, s in enumerate(bwd.steps))
    # The saved values only the backward holds (not inputs, not outputs) may be overwritten.
    over = {part.saved_leaves[i] for i in part.overwritable
            if part.saved_values[i].op != Op.INPUT and part.saved_values[i] not in fwd.outputs}
    return points + replay(bwd, bwd.last_uses, kept, size, "backward", over), names


def describe_peak(entry, stats: Optional[GraphStats] = None, itemsize: int = 4,
                  top: int = 12) -> str:
    """The peak's step and its largest live values, in MiB (what ``explain`` prints)."""
    points, names = simulate(entry, stats, itemsize)
    if not points:
        return "no steps"
    p = max(points, key=lambda q: q.live)
    lines = [f"peak {p.live / 2**20:.0f} MiB after {p.phase} step [{p.index}] {p.step}; "
             f"alive then (MiB):"]
    lines += [f"  {b / 2**20:9.1f}  {names.get(v, v.op)}" for v, b in p.values[:top]]
    return "\n".join(lines)
