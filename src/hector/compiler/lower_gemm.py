"""Lowering of ``gemm`` steps: a typed linear's body (its prologue, bias, addend, scatter and
CSR epilogues, a weight or bias gradient) -> its ``GemmSpec`` and ``RowSegments`` and the
step's note (:func:`gemm_spec`), and the readers of a GEMM body that fusion and the runtime
share (:func:`gemm_input`, :func:`gemm_parts`, :func:`gemm_addend`, :func:`csr_epilogue`).

Separate from :mod:`.lower` (which dispatches to it) because the GEMM body's shape rules are
one template's business; the fuse passes and ``steps_triton.gemm`` import them from here.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..kernels.segment_mm.spec import GemmSpec, fp32_dot
from .ir import Op, Value, WEIGHT, arg
from .lower_traversal import linear_traversal
from .plan import LinearTraversal, RowSegments

#: IR ops a segment GEMM applies to its input tiles (``fuse``'s prologue), spelled as the
#: kernels name them (``segment_mm.spec.PROLOGUES``; a test checks they agree).
PROLOGUE_OPS = (Op.GELU, Op.RELU, Op.SIGMOID, Op.TANH)


def gemm_input(x: Value) -> Tuple[Value, Optional[str]]:
    """(a GEMM step's input rows, the prologue its kernel applies to them or None)."""
    if x.op in PROLOGUE_OPS:
        return x.args[0], x.op
    return x, None


def gemm_addend(body: Value) -> Tuple[Value, Optional[Value]]:
    """(the rest of the body, the addend argument or None) of a GEMM step's body:
    ``add(linear or add(linear, bias), addend)`` when fusion gave the linear a node-row
    addend as its epilogue (``fuse``: RGCN's relation sum added by the root GEMM)."""
    if body.op == Op.ADD and body.args[1].op == Op.ARG and body.args[1].kind != WEIGHT:
        return body.args[0], body.args[1]
    return body, None


def gemm_parts(body: Value) -> Tuple[Value, Value]:
    """(the typed linear, its bias argument or None) of a GEMM step's body: ``linear``, or
    ``[reshape](add(linear, bias))`` when fusion gave the linear its bias add as the
    kernel's epilogue, or ``scatter(linear)`` (its scatter epilogue; ``fuse``); an addend
    (:func:`gemm_addend`) is set aside first."""
    body = gemm_addend(body)[0]
    if body.op == Op.SCATTER and body.args[0].op == Op.GATHER:   # (CSR scatter epilogue)
        return body.args[0].args[0], None
    if body.op == Op.SCATTER:
        return body.args[0], None
    if body.op == Op.RESHAPE:
        body = body.args[0]
    if body.op == Op.ADD:
        return body.args[0], body.args[1]
    return body, None


#: Longest CSR row a segment GEMM's CSR prologue or epilogue walks where rows may be cut
#: (a scatter epilogue or a CSR epilogue sums them afterwards, a weight gradient over
#: them): longer rows become pieces of this many entries (``steps_triton.gemm``), so a tile
#: never walks a hub alone.
CSR_PIECE = 16


def csr_epilogue(body: Value) -> Optional[Tuple[Tuple[tuple, ...], float]]:
    """(movements, coefficient) of ``scatter(gather(rows))`` as a CSR scatter epilogue of
    the GEMM computing ``rows`` (``fuse`` asks it of a traversal, lowering of the GEMM's
    body): the chain must be a one-source linear traversal, nothing added; else None."""
    if not (body.op == Op.SCATTER and body.args[0].op == Op.GATHER):
        return None
    g = body.args[0]
    stand_in = Value(body.op, (Value(g.op, (arg(0, g.args[0]),), g.kind, g.shape, g.attrs),),
                     body.kind, body.shape, body.attrs)
    lt = linear_traversal(stand_in)[0]
    if lt is None or len(lt.sources) != 1 or lt.addends or lt.bias is not None:
        return None
    _, movements, coef = lt.sources[0]
    return movements, coef


def gemm_spec(body: Value, dtype: torch.dtype):
    if body.op == Op.WSUM:
        return None, (f"bias gradient db = sum dy over {body.args[0].kind} rows, segments by "
                      f"{body.per}: the weight-gradient kernel with x a column of ones")
    if body.op == Op.WGRAD:
        x, prologue = gemm_input(body.args[0])
        seg = body.per or "one segment"
        how = (f"; x read in place from {x.args[0].kind} rows by {x.attr('end')}"
               if x.op == Op.GATHER else "")
        how += f"; {prologue}(x) applied to each loaded tile" if prologue else ""
        if x.op == Op.SCATTER:
            how += ("; x rows summed through the CSR of " + linear_traversal(x)[0].describe()
                    .split("; ", 1)[1] + " as they are loaded (CSR prologue; rows cut into "
                    f"pieces of at most {CSR_PIECE} entries)")
        dy = body.args[1]
        how += (f"; dy read in place from {dy.args[0].kind} rows by {dy.attr('end')}"
                if dy.op == Op.GATHER else "")
        how += ("; written transposed, in the layout the weight is stored in"
                if body.attr("transposed") else "")
        return None, (f"weight gradient dW = sum x^T dy over {x.kind} rows, segments by "
                      f"{seg}{how}")
    csr_out = csr_epilogue(body)
    out_scatter = ((body.kind, body.attr("end")) if body.op == Op.SCATTER and csr_out is None
                   else None)
    body, addend = gemm_addend(body)
    body, bias = gemm_parts(body)
    x, prologue = gemm_input(body.args[0])
    w = body.args[1]
    transpose = w.op == Op.WT
    wshape = w.args[0].shape if transpose else w.shape
    per_head = len(wshape) == 3
    K = x.dim if per_head else x.heads * x.dim
    N = body.dim if per_head else body.heads * body.dim
    gathered = x.op == Op.GATHER
    csr = None
    if x.op == Op.SCATTER:     # fuse's CSR prologue: one moved source, nothing added
        (csr,) = linear_traversal(x)[0].sources
    # CSR rows cut into pieces where their sums meet linearly afterwards: an epilogue that
    # adds the output rows (no bias, which each piece would add again)
    pieces = csr_out is not None or (csr is not None and out_scatter is not None
                                     and bias is None)
    rows = RowSegments(rows=x.kind, segments=w.per, per_head=per_head, transpose_weight=transpose,
                       gather=(x.args[0].kind, x.attr("end")) if gathered else None, csr=csr,
                       scatter=out_scatter, csr_out=csr_out, pieces=pieces)
    # (steps_triton.gemm.run_gemm: node_perm or the head-major order, permutations both; a CSR
    # prologue's rows in order of length within each segment, a permutation too)
    # (a CSR epilogue's rows: its pieces by length within each segment, ``scatter`` their
    # CSR rows, ``gather`` the input rows they read)
    permuted = w.per == "node_type" or per_head or csr is not None or csr_out is not None
    gs = GemmSpec(has_gather=permuted or gathered,
                  has_scatter=permuted or bool(out_scatter) or csr_out is not None,
                  transpose_weight=transpose, dtype=dtype, K=K, N=N,
                  input_precision=fp32_dot() if dtype == torch.float32 else "ieee",
                  gather_unique=permuted and not gathered and csr_out is None,
                  scatter_unique=permuted and not out_scatter and csr_out is None,
                  has_bias=bias is not None, prologue=prologue, has_csr=csr is not None,
                  has_addend=addend is not None, has_csr_out=csr_out is not None)
    seg = {"relation": f"{x.kind} rel_ptr", "node_type": "node_type_ptr (+node_perm)",
           None: "one segment"}[w.per] + (f"; rows gathered from {x.args[0].kind} by "
                                          f"{x.attr('end')}" if gathered else "")
    if out_scatter is not None:
        seg += (f"; output rows summed into their {out_scatter[0]} rows by {out_scatter[1]} "
                "(scatter epilogue, fp32 atomics)")
    if csr_out is not None:
        seg += ("; output rows added through the CSR of " + LinearTraversal(
            sources=((0,) + csr_out,)).describe().split("; ", 1)[1] + " as they are finished "
                "(CSR scatter epilogue, fp32 atomics; rows cut into pieces of at most "
                f"{CSR_PIECE} entries, ordered by length within each segment)")
    if csr is not None:
        cut = f"rows cut into pieces of at most {CSR_PIECE} entries, " if pieces else ""
        seg += ("; input rows summed through the CSR of " + LinearTraversal(
            sources=(csr,)).describe().split("; ", 1)[1] + " as they are loaded (CSR prologue; "
                f"{cut}rows ordered by length within each segment)")
    return (gs, rows), (f"segments: {seg}{', head-major (per-head weights)' if per_head else ''}"
                        f"{'; + bias per ' + (w.per or 'row') + ' (epilogue)' if bias else ''}"
                        f"{'; ' + prologue + ' of the input rows (prologue)' if prologue else ''}"
                        f"{'; + a ' + addend.kind + ' row per output row (addend epilogue)' if addend is not None else ''}")
