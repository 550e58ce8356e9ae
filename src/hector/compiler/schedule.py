"""Step order for memory: the last lowering stage.

``lower`` lists steps in the IR's topological order, which knows nothing of sizes: a
backward plan computed the attention's gradients while the forward values only the weight
gradients read (run last) were still alive, and held every input gradient's addend until one
fused sum at the end.  :func:`for_memory` re-orders the steps (any order that respects the
data dependencies computes the same values: each step is a pure function of its inputs)
greedily: among the steps whose inputs exist, run the one that adds the fewest bytes net
(its outputs minus the values it is the last reader of), a ``select`` view first, ties in
lowering's order.  The new order is kept only when its replayed peak
(:func:`hector.compiler.memory.peak`) is lower.

Sizes here cannot be the graph's: one compiled stage serves every graph that answers its
cost questions alike (``pipeline``), so the order must not depend on row counts.  The greedy
counts a value ``heads x features`` per row, an edge row as :data:`EDGE_ROWS` node rows and a
weight as nothing; the new order is kept only if its peak is lower under that size and no
higher under each of :data:`CHECK_ROWS` (other ratios of edge and compact rows to nodes), so
that it does not trade one graph family's peak for another's.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, Sequence

from .ir import CDST, CSRC, EDGE, WEIGHT, Value
from .memory import allocate, peak, step_allocs
from .plan import Plan

#: Node rows an edge row weighs in the graph-independent size (about the mean degree).
EDGE_ROWS = 8
#: Rows per node row of (edge, compact_src, compact_dst) the order is checked under too:
#: sparse and dense graphs, and many (src, relation) pairs per node (mag: 1.6).
CHECK_ROWS = ((2, 1, 1), (32, 1, 1), (8, 2, 1), (4, 2, 2))


def proxy_size(v: Value, rows=(EDGE_ROWS, 1, 1)) -> int:
    """Graph-independent stand-in for ``v``'s bytes (see the module's docstring): ``rows``
    weighs an edge, compact_src and compact_dst row against a node row."""
    if v.kind == WEIGHT:
        return 0
    per_row = {EDGE: rows[0], CSRC: rows[1], CDST: rows[2]}.get(v.kind, 1)
    return math.prod(v.shape) * per_row


def for_memory(plan: Plan, keep: Sequence[Value] = ()) -> Plan:
    """``plan`` with its steps in the greedy memory order, if that lowers the replayed peak
    and raises it under none of the other size ratios (``keep``: values that outlive the
    plan, never counted as freed)."""
    order = _greedy(plan, set(plan.outputs).union(keep))
    if order == list(range(len(plan.steps))):
        return plan
    new = Plan(tuple(plan.steps[i] for i in order), plan.outputs, plan.leaves)
    if peak(new, proxy_size) >= peak(plan, proxy_size):
        return plan
    for rows in CHECK_ROWS:
        size = functools.partial(proxy_size, rows=rows)
        if peak(new, size) > peak(plan, size):
            return plan
    return new


def _greedy(plan: Plan, kept) -> List[int]:
    """Step indices in run order: each time, the ready step with the least net bytes (a
    ``select`` at once), ties in lowering's order."""
    steps = plan.steps
    made = {}
    for i, s in enumerate(steps):
        made[s.output] = i
        if s.extra is not None:
            made[s.extra] = i
    needs = [{made[v] for v in s.inputs if v in made} for s in steps]
    makers = {s.output: s for s in steps}
    readers: Dict[Value, int] = {}
    for s in steps:
        for v in set(s.inputs):
            readers[v] = readers.get(v, 0) + 1
    size = dict(((v, proxy_size(v)) for v in plan.leaves))
    done, order = set(), []

    def net(i: int) -> int:
        s = steps[i]
        if s.template == "select":
            return -1 << 62                      # a view: free, and it releases its share
        out = step_allocs(s, proxy_size)
        added = sum(b for v, b in out.items() if readers.get(v, 0) or v in kept)
        freed = sum(size.get(v, 0) for v in set(s.inputs)
                    if readers.get(v) == 1 and v not in kept)
        return added - freed

    while len(order) < len(steps):
        ready = [i for i in range(len(steps)) if i not in done and needs[i] <= done]
        i = min(ready, key=lambda j: (net(j), j))
        s = steps[i]
        done.add(i)
        order.append(i)
        allocate(size, s, makers, proxy_size)
        for v in set(s.inputs):
            readers[v] -= 1
    return order
