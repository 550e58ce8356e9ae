"""The pass pipeline, readable top to bottom (tinygrad style):

1. ``canonicalize`` -- one spelling per computation (so later patterns match);
2. ``reorder``      -- linear operator reordering (weight-first products, linears moved
                       across aggregations), by a cost model over graph statistics;
3. ``compact``      -- compact materialization of values that depend only on
                       (src|dst, relation), by row counts;
4. ``autodiff``     -- (training) reverse-mode IR for the backward, which then runs through
                       passes 1-3 and 5 itself;
5. ``fuse``         -- grouping into kernels of the two templates (segment GEMM, traversal;
                       score + softmax + aggregation as one attention traversal).

Every pass returns the new IR and its decisions; with ``HECTOR_DEBUG=1`` the verifier checks
the IR after each one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .ir import Value
from .passes import autodiff, canonicalize, compact, fuse as fusion, reorder
from .passes.common import Decision, GraphStats
from .verify import debug_enabled, verify


@dataclass(frozen=True)
class PassRecord:
    name: str
    before: Tuple[Value, ...]
    after: Tuple[Value, ...]
    decisions: Tuple[Decision, ...]


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


@dataclass
class ForwardStage:
    """What the forward pipeline leaves for a later backward: the optimised (unfused) forward
    IR, which value of the fused plan holds each of its values, and the log."""
    optimized: Tuple[Value, ...]
    fused: Tuple[Value, ...]
    mapping: Dict[Value, Value]
    log: List[PassRecord]


def forward_pipeline(outputs: Sequence[Value], stats: Optional[GraphStats], *,
                     reorder: bool = True, compact: bool = True,
                     fuse: bool = True) -> ForwardStage:
    """Passes 1-3 and 5 on the forward IR (no autodiff: inference never pays for it)."""
    log: List[PassRecord] = []
    if debug_enabled():
        verify(outputs, where="captured IR")
    fwd = optimize(outputs, stats, reorder_on=reorder, compact_on=compact, log=log)
    mapping: Dict[Value, Value] = {}
    fused_fwd, decisions = fusion.run(fwd, stats, fuse, mapping=mapping)
    if debug_enabled():
        verify(fused_fwd, where="after pass fuse")
    log.append(PassRecord("fuse", fwd, tuple(fused_fwd), tuple(decisions)))
    return ForwardStage(tuple(fwd), tuple(fused_fwd), mapping, log)


def backward_pipeline(stage: ForwardStage, stats: Optional[GraphStats], *, reorder: bool = True,
                      compact: bool = True, fuse: bool = True):
    """Pass 4 on a finished forward stage, then passes 1-3 and 5 on the backward IR.

    Returns a :class:`hector.compiler.passes.autodiff.Backward`; its records join ``stage.log`` (the
    autodiff record before the forward's fuse, where the pipeline order puts it)."""
    fwd = stage.optimized
    bwd = autodiff.differentiate(fwd)
    record = PassRecord("autodiff", fwd, bwd.outputs, tuple(bwd.decisions))
    at = next((i for i, r in enumerate(stage.log) if r.name == "fuse"), len(stage.log))
    stage.log.insert(at, record)
    bwd = autodiff.bind_saved(bwd, fwd, stage.mapping)
    b_out = optimize(bwd.outputs, stats, reorder_on=reorder, compact_on=compact, log=stage.log,
                     prefix="backward/")
    b_out = _run("backward/fuse", fusion.run, b_out, stats, fuse, stage.log)
    return bwd.with_outputs(b_out)


def run_pipeline(outputs: Sequence[Value], stats: Optional[GraphStats], *, reorder: bool = True,
                 compact: bool = True, fuse: bool = True, backward: bool = False):
    """Forward (and with ``backward``, backward) IR through every pass.

    Returns ``(forward_ir, backward, log)``; ``backward`` is None or a
    :class:`hector.compiler.passes.autodiff.Backward` whose ``outputs`` are compiled too.
    """
    opts = dict(reorder=reorder, compact=compact, fuse=fuse)
    stage = forward_pipeline(outputs, stats, **opts)
    bwd = backward_pipeline(stage, stats, **opts) if backward else None
    return stage.fused, bwd, stage.log


def decisions_of(log: Sequence[PassRecord]) -> Dict[str, Tuple[Decision, ...]]:
    return {r.name: r.decisions for r in log}
