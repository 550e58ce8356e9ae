"""``traversal`` steps on the Triton backend.

* A spec with a :class:`~hector.compiler.plan.LinearTraversal` ->
  :func:`hector.kernels.traversal.op.traverse` on the movement chain's weighted CSR, composed
  once per graph (:func:`movement_csr`; a backward's reversed chain, :func:`_reversed_chain`,
  is the forward's CSR transposed), every CSR of a plan built before any step runs
  (:func:`prepare_traversals`).  The GEMM steps' CSR prologues and scatter epilogues
  (:mod:`.gemm`) walk the same CSRs.
* A plain edge softmax -> :func:`hector.kernels.traversal.op.edge_softmax`.
* Any other body -> the edgewise kernel (:func:`.edgewise.run_edgewise`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import List, Optional

import torch

from ...graph.graph import recipe
from ...kernels.traversal.csr import (WeightedCSR, compose, from_groups, narrow_cols,
                                       one_per_row, resolve_layouts, scaled)
from ...kernels.traversal.op import edge_softmax as edge_softmax_kernel, traverse
from ...kernels.traversal.schedule import one_long_bin
from ..ir import Op, toposort
from ..steps_torch import GraphIndex, _operand
from .edgewise import run_edgewise


def _movement_weight(ix: GraphIndex, move: tuple) -> Optional[torch.Tensor]:
    """``[many]`` weight of each moved row: ``1 / count`` of its ``one`` row for a mean,
    None (1) otherwise."""
    _, one, many, end, how = move
    if how != "mean":
        return None
    return ix.counts(one, many, end).index_select(0, ix.move(one, many, end)).reciprocal()


def _movement_factor(ix: GraphIndex, move: tuple) -> WeightedCSR:
    """One gather (``[many, one]``, an entry per ``many`` row) or scatter (``[one, many]``) as
    a weighted CSR; a mean weighs each entry by ``1 / count`` of its ``one`` row."""
    op, one, many, end, how = move
    idx, val = ix.move(one, many, end), _movement_weight(ix, move)
    if op == "gather":
        return one_per_row(idx, val, ix.rows[one])
    ptr, perm = ix.grouped(one, many, end)
    return from_groups(ptr, perm, val, ix.rows[one], ix.rows[many])


def _through_rows(ix: GraphIndex, movements: tuple) -> Optional[WeightedCSR]:
    """A gather onto ``many`` rows then a scatter off them (RGCN's source rows onto edges,
    then a mean per (destination, relation); its backward's reverse): one entry per ``many``
    row, in the scatter's grouping, which the graph holds (by destination: its CSR; by
    compact destination row: canonical order) or sorts once.  No composition: that sorted
    every entry by (row, column) and merged repeats (a parallel edge's entry stays apart here
    and adds the same term), four times the index work of a new mini-batch's plan.  None for
    another chain."""
    if len(movements) != 2:
        return None
    (op1, one1, many1, end1, _), (op2, one2, many2, end2, _) = movements
    if (op1, op2) != ("gather", "scatter") or many1 != many2:
        return None
    ptr, perm = ix.grouped(one2, many2, end2)
    col = ix.move(one1, many1, end1).index_select(0, perm)
    w1, w2 = (_movement_weight(ix, m) for m in movements)
    val = w1 if w2 is None else w2 if w1 is None else w1 * w2
    val = (torch.ones(perm.numel(), dtype=torch.float32, device=perm.device) if val is None
           else val.index_select(0, perm))
    return WeightedCSR(ptr, narrow_cols(col, ix.rows[one1]), val.contiguous(), ix.rows[one2],
                       ix.rows[one1])


def movement_csr(ix: GraphIndex, movements: tuple, coef: float = 1.0) -> WeightedCSR:
    """``coef`` times the product of a traversal's movements (innermost first) as one
    weighted CSR: built from the graph's index arrays on the first call, kept on the graph
    as a recipe derivation (an overlapped captured step makes it with the blocks)."""
    return ix.graph.derive(("traversal_csr", movements, coef))


@recipe("traversal_csr")
def _movement_csr(graph, movements: tuple, coef: float) -> WeightedCSR:
    ix = GraphIndex.of(graph)
    # A backward's chain is often a forward's reversed: its CSR is that one transposed, bit
    # for bit when there are two movements (each entry sums the same products over the one
    # middle row, in the same order), for one sort instead of a composition.
    mirror = (graph._derived.get(("traversal_csr", _reversed_chain(movements), coef))
              if len(movements) == 2 else None)
    if mirror is not None:
        m = mirror.transpose()
    else:
        m = _through_rows(ix, movements)
        for move in movements if m is None else ():
            f = _movement_factor(ix, move)
            m = f if m is None else compose(f, m)
        m = scaled(m, coef) if coef != 1.0 else m
    if getattr(graph, "capacity", None) is not None and m.bins is None:
        # (a capacity block's CSRs: bins known without reading the batch's lengths)
        m = replace(m, bins=one_long_bin(m.rows, m.nnz))
    return m


def _reversed_chain(movements: tuple) -> tuple:
    """The chain whose weighted CSR is the transpose of ``movements``' one: reversed, each
    gather a scatter and back (a mean keeps its ``1 / count`` weights)."""
    flip = {("gather", None): ("scatter", "sum"), ("scatter", "sum"): ("gather", None),
            ("gather", "mean"): ("scatter", "mean"), ("scatter", "mean"): ("gather", "mean")}
    return tuple(flip[(op, how)][:1] + (one, many, end) + flip[(op, how)][1:]
                 for op, one, many, end, how in reversed(movements))


def prepare_traversals(plans, ix: GraphIndex) -> None:
    """Build the weighted CSRs of every movement-and-addition traversal among ``plans``'
    steps (each a plan's step list) and find all their row bins with one host read, before
    any runs: each CSR read its own on its first launch, a device sync each on CUDA (RGCN's
    forward launches two per layer, the mean per (destination, relation) and the sum over
    relations).  Once per (plan, graph): a later call finds the CSRs memoised and their bins
    set.  A forward that records for its backward passes both plans, so the backward reads
    nothing: with several GPUs a read there would wait for the gradient all-reduces DDP has
    started, and so for the slowest rank, in the middle of every step."""
    csrs = []
    for steps in plans:
        key = ("traversals_prepared", id(steps))
        if key in ix.memo:
            continue
        ix.memo[key] = True
        for step in steps:
            spec = step.spec
            if step.template != "traversal" or spec.kernel is None \
                    or spec.edgewise is not None or spec.softmax is not None:
                continue
            csrs += [movement_csr(ix, movements, coef)
                     for _, movements, coef in spec.linear.sources]
    resolve_layouts(csrs)


def run_traversal(step, inputs: List[torch.Tensor], ix: GraphIndex) -> torch.Tensor:
    """A movement-and-addition traversal on the ``traversal_csr`` kernel: rows read in place
    through each source's composed CSR; the addends and the bias are fused into the first
    launch, and each further source adds onto the previous launch's output."""
    if step.spec.edgewise is not None:
        return run_edgewise(step, inputs, ix)
    if step.spec.softmax is not None:
        index, slope = step.spec.softmax
        # (the op is differentiable: torch autodiff may record it too)
        return edge_softmax_kernel(ix.graph, inputs[index], slope, backend="triton")
    lt = step.spec.linear
    bias = None if lt.bias is None else _bias_row(step, inputs[lt.bias], lt.bias, ix)
    shape = tuple(step.body.shape)

    def rows(t):   # a reshape in the body is a view of the same row
        return t.reshape((t.shape[0],) + shape)

    out = None
    for index, movements, coef in lt.sources:
        m = movement_csr(ix, movements, coef)
        if out is None:
            out = traverse(m, rows(inputs[index]), [rows(inputs[i]) for i, _ in lt.addends],
                           [c for _, c in lt.addends], bias, backend="triton")
        else:
            out = traverse(m, rows(inputs[index]), [out], [1.0], backend="triton")
    return out


def _bias_row(step, t: torch.Tensor, index: int, ix: GraphIndex) -> torch.Tensor:
    """The bias weight as one output row, broadcast the way the torch backend's ``add`` does."""
    arg = next(b for b in toposort([step.body]) if b.op == Op.ARG and b.attr("index") == index)
    return _operand(t, arg, step.body.kind, ix).expand((1,) + tuple(step.body.shape)).reshape(-1)
