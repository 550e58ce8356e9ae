"""Fusion's segment-GEMM questions (the ``fuse`` module's points 3, 5 and 6): which
gathers, elementwise functions and CSR sums a GEMM reads in place (its gather index, its
prologue, its CSR prologue), which sums of its compact rows it adds into node rows (its
scatter and CSR scatter epilogues, with their cost question), which bias it adds (its
epilogue), the ``HECTOR_CSR_PROLOGUE`` switch, and the split of a scatter of two linears'
sum into two scatter epilogues."""
from __future__ import annotations

import os
from typing import Dict, List, Optional

from .. import ir as N
from ..ir import EDGE, NODE, Op, Value, WEIGHT
from ..lower_gemm import PROLOGUE_OPS, csr_epilogue
from .common import Cheaper, Decision
from .fuse_rewrite import NAME, _read_once, _rewrite_after



def _sums_compact_rows(v: Value) -> bool:
    """``v`` sums compact rows into their nodes: ``scatter_sum_dst`` of (dst, relation) rows
    or ``scatter_sum_src`` of (src, relation) rows (one node per row)."""
    return (v.op == Op.SCATTER and v.kind == NODE and v.attr("reduce") == "sum"
            and (v.args[0].kind, v.attr("end")) in ((N.CDST, "dst"), (N.CSRC, "src")))


def _scatter_decision(what: str, kind: str, stats, applied: str, declined: str) -> Decision:
    """The scatter epilogue's cost question for rows of ``kind``: do they number at least
    twice the nodes (the node passes it adds against the compact rows' round trip it
    saves)?  Declined without graph statistics."""
    if stats is None:
        return Decision(NAME, what, False, "no graph statistics to cost it")
    q = Cheaper(new=((2, NODE),), old=((1, kind),))
    ok = q.answer(stats)
    return Decision(NAME, what, ok, f"{stats.rows(kind)} {kind} rows vs {stats.rows(NODE)} "
                    "nodes: " + (applied if ok else declined), q)


def _split_scatter_sums(outputs, memo: Dict[Value, Value], decisions: List[Decision],
                        stats=None):
    """``outputs`` with each ``scatter_sum(add(linear_1, linear_2))`` of compact rows into
    their nodes (each linear read by the add alone, the add by the scatter alone) made
    ``add(scatter_sum(linear_1), scatter_sum(linear_2))`` when the scatter epilogue pays
    (:func:`_scatter_decision`, the question ``gemm_scatter`` asks too): each GEMM then sums its own rows
    into a node buffer, and the two compact-row outputs (RGAT's backward on wikikg2: dv W^T
    and d a_src W_att^T, 3 GiB each, alive together at the training peak) are never written.
    ``memo`` is updated as in :func:`_fold_bias`."""
    alone = _read_once(outputs)

    def split(orig: Value, new: Value, _memo) -> Optional[Value]:
        if not _sums_compact_rows(orig):
            return None
        add = orig.args[0]
        if add.op != Op.ADD or not alone(add) or len(set(add.args)) != 2 or not all(
                a.op == Op.LINEAR and a.kind == add.kind and _csr_gemm(a) and alone(a)
                for a in add.args):
            return None
        d = _scatter_decision("scatter of a sum of two linears into two scatter epilogues",
                              add.kind, stats,
                              "each segment GEMM sums its output rows into a node buffer; no "
                              "compact rows of either linear written",
                              "fewer than two rows per node: one traversal sums both")
        decisions.append(d)
        if not d.applied:
            return None
        return N.binary(Op.ADD, *(Value(orig.op, (lin,), orig.kind, orig.shape, orig.attrs)
                                  for lin in new.args[0].args))

    return _rewrite_after(outputs, split, memo)


def _gemm_gather(a: Value, gemm: Value) -> bool:
    """A plain gather from node rows feeding a typed linear's input, or a weight gradient's
    input rows, is the segment GEMM's gather index: the kernel reads the node rows in place,
    no gathered copy exists (not with per-node-type weights: those already read rows
    through ``node_perm``)."""
    per = gemm.per if gemm.op == Op.WGRAD else gemm.args[1].per if gemm.op == Op.LINEAR else ""
    return (a.op == Op.GATHER and a.args[0].kind == NODE and a.attr("norm") is None
            and per != "node_type" and gemm.op in (Op.LINEAR, Op.WGRAD))


#: Environment switch of the GEMM's CSR prologue and epilogue: unset (or any other value)
#: where they pay (see ``csr_prologue_ok``), "1" for every one-source CSR sum a linear
#: reads, "0" never.
CSR_PROLOGUE_ENV = "HECTOR_CSR_PROLOGUE"


def csr_mode() -> str:
    """``"1"``, ``"0"`` or ``"auto"`` (see :data:`CSR_PROLOGUE_ENV`)."""
    mode = os.environ.get(CSR_PROLOGUE_ENV, "")
    return mode if mode in ("0", "1") else "auto"


def _csr_scatter_linear(v: Value) -> Optional[Value]:
    """The typed linear whose compact rows ``v`` sums into node rows through a one-source
    gather-then-scatter chain (``scatter(gather(linear))``, nothing added: a weighted CSR
    from the linear's rows to the nodes), or None."""
    if not (v.op == Op.SCATTER and v.kind == NODE and v.attr("reduce") == "sum"
            and v.args[0].op == Op.GATHER and v.args[0].kind == EDGE):
        return None
    g = v.args[0]
    lin = g.args[0]
    if not (lin.op == Op.LINEAR and lin.kind in (N.CDST, N.CSRC) and _csr_gemm(lin)):
        return None
    return lin if csr_epilogue(v) is not None else None


def _dy_gather(a: Value, wgrad: Value) -> bool:
    """A plain gather of node rows as a weight gradient's ``dy`` (RGCN's: the incoming
    gradient of each compact (destination, relation) row's destination) is read by the
    kernel through an index, as its ``x`` is (one weight per relation or a shared one, not
    per head: those read dy in a head-major or ``node_perm`` order)."""
    return (_row_wgrad(wgrad) and a.op == Op.GATHER and a.args[0].kind == NODE
            and a.attr("norm") is None)


def _row_wgrad(v: Value) -> bool:
    """A weight gradient of one weight per relation or a shared one (not per head, not per
    node type): its rows are read in their own order, so an index or a CSR can stand for
    them."""
    return v.op == Op.WGRAD and len(v.shape) == 2 and v.per in (None, "relation")


def _stored_weight(lin: Value) -> Value:
    """A typed linear's weight as stored (the operand of its ``wT`` when read transposed)."""
    return lin.args[1].args[0] if lin.args[1].op == Op.WT else lin.args[1]


def _bias_fits(lin: Value, bias: Value) -> bool:
    """``bias`` is one weight row per segment of ``lin``'s weight, as wide as its output:
    what the GEMM's bias epilogue adds.  A per-head bias ``(H, C)`` of an output of H heads
    (Transformer's query, key and value biases) is that row too: the output's flattened
    columns are its heads side by side, as the bias's stored elements are."""
    return bias.per == _stored_weight(lin).per and tuple(bias.shape) in (
        (lin.heads * lin.dim,), tuple(lin.shape))


def _csr_gemm(gemm: Value) -> bool:
    """A typed linear whose input can be a CSR prologue: one weight per relation or a shared
    one, not per head (its rows are head-major permuted) nor per node type (``node_perm``)."""
    if gemm.op != Op.LINEAR:
        return False
    w = _stored_weight(gemm)
    return len(w.shape) == 2 and w.per in (None, "relation")


def _prologue(a: Value, gemm: Value) -> bool:
    """An elementwise function of the input rows of a dense typed linear or of its weight
    gradient (HGT's ``gelu(aggregate)`` into the output linear) is the segment GEMM's
    prologue, recomputed wherever it is read (an erf per element next to K multiply-adds)
    -- unless its rows are a gather (that gather would become a copy)."""
    if a.op not in PROLOGUE_OPS or a.args[0].op == Op.GATHER or a.kind == WEIGHT:
        return False
    if gemm.op == Op.LINEAR:
        return len(_stored_weight(gemm).shape) == 2
    return gemm.op == Op.WGRAD and len(gemm.shape) == 2
