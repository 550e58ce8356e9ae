"""Fusion: group operators into kernels of the two templates.

1. **attention**: ``scatter_sum_dst(edge_softmax(act(score)) * gather_src(v))`` becomes one
   ``attention`` operator -- score, online softmax and weighted aggregation in one traversal,
   the per-edge scores and weights never written to memory.  The score must be a sum of
   terms the traversal can read: ``scale * <q_dst, k_src> [* p_relation]``, a source-side
   term and a destination-side term (each from node, compact or edge rows).
2. **kernels**: every typed linear is a segment-GEMM kernel (a ``wT`` weight folds into its
   transpose flag); weight-only expressions form weight kernels; every other operator is
   inlined into its consumer's traversal kernel when it has one consumer that is a traversal,
   and is materialised otherwise -- each refusal is logged with its reason.  An elementwise
   operator of leaves only (``dout * sigmoid(gate)``: its inputs stay alive anyway) is
   inlined into every traversal that reads it, recomputed there, and materialised only for
   the readers that cannot inline it: so no reader late in a plan holds it alive.
3. **GEMM prologue**: an elementwise function (gelu, relu, sigmoid, tanh) of a dense typed
   linear's input rows, or of its weight gradient's, is applied by the GEMM to each tile it
   loads: HGT's ``gelu(aggregate)`` is never written (0.47 ms per forward on mag).  A sum
   over a CSR of one input's rows (a traversal with one moved source, nothing added) read by
   a typed linear alone is the GEMM's *CSR prologue*: the kernel sums each input row as it
   loads it, so RGCN's per-(destination, relation) mean is never written (on a graph where
   those rows are nearly as many as the edges, wikikg2, two compact-row tensors of traffic).
   A tile walks its rows' entries in lockstep, so a hub row would serialise it: where the
   GEMM's scatter epilogue sums its output rows (or for a weight gradient) the rows are cut
   into short pieces, the sums meeting linearly afterwards, and the prologue is taken by
   default; where rows are stored once it stays opt-in (``HECTOR_CSR_PROLOGUE=1``; slower
   than the traversal kernel on wikikg2, biokg and am before the pieces existed).  The
   backward's weight gradient takes the same prologue, so the forward saves no summed
   rows for it.
6. **CSR scatter epilogue**: the transpose of 3, for the backward: a sum into node rows of
   a typed linear's compact rows gathered onto the edges (RGCN's ``dy[dst] W_r^T`` per
   (dst, relation) row spread over its edges' sources with the mean's weights), the linear
   read by nothing else, is added by the GEMM through the chain's CSR as it finishes each
   row (fp32 atomics): the compact gradient (3.3 GB on wikikg2, at the training peak) is
   never written.  Same cost question as 5; ``HECTOR_CSR_PROLOGUE=0`` turns 3's default
   and 6 off.
4. **attention epilogue**: ``[reshape](attention) + b`` (``b`` one weight row, the
   attention read by nothing else) is the attention's ``bias`` role: its kernel adds ``b``
   as it stores each output row (RGAT's output bias: one pass over the node rows less, 0.24
   ms per forward on synthetic mag).  Done where the attention is formed, for the forward
   and for autodiff alike, so the backward reads the biased output it saved (the kernels
   subtract ``b`` again where they need the attention's own output).  Node rows as wide
   as the output added to it with the heads concatenated (GAT's residual ``x W_res``,
   Transformer's root projection) are an addend in that role, the kernel adding row ``i``
   to output row ``i``; with a bias as well the role is ``x W + b``, which the residual
   GEMM's bias epilogue stores (point 5): the sum costs those two kernels, no node-row
   pass.  The backward keeps the addend (the output it saved includes it).
   A weight gradient reads its ``dy`` rows through a plain gather of node rows in place too
   (RGCN's backward: the destinations' gradient per compact (dst, relation) row; on
   wikikg2 a 3.3 GB copy, and the traversal writing it).
5. **GEMM epilogues**: a sum of a typed linear's compact rows into their nodes (each
   (dst, relation) row has one destination), the linear read by nothing else, is the
   segment GEMM's scatter: the kernel adds each output row into its node row with fp32
   atomics (RGCN after reordering: the compact output is never written; on wikikg2 that is
   3.3 GB alive next to the saved mean at the training peak) -- when the rows are at least
   twice the nodes (a cost question: the node passes it adds against the round trip it
   saves).  A bias add of a typed linear read by nothing else (``[reshape](add(
   linear(x, W), b))``, ``b`` a weight vector sliced as ``W`` is) is the segment GEMM's
   epilogue: no traversal reads the linear's rows back to add ``b`` (HGT's K, Q, V and
   output linears: four launches and 2 GB of traffic per forward on synthetic mag).  A node
   linear added to a scatter epilogue's node rows (and a bias) adds them as its *addend*
   epilogue: RGCN's root GEMM stores ``x W_root + sum + b`` with no node-row pass after it.
7. **cosine score inputs**: an attention's ``k = normalize(x)`` and ``q = k * beta`` (read by
   nothing else) are one ``cosine_qk`` operator, q, k and the norm from one kernel; the
   attention reads the norm where its v is x (AGNN: one row gathered per edge, not two).

The pass is this module's ``run`` (and ``attention_for_autodiff``, the attentions fused
before autodiff) over four modules below it: ``fuse_rewrite`` (the pass's name, the shared
rewrite helpers), ``fuse_attention`` (point 1 and 4), ``fuse_cosine`` (point 7),
``fuse_gemm`` (the GEMM questions of 3, 5 and 6) and ``fuse_group`` (point 2: operators
grouped into kernels).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .. import ir as N
from ..ir import NODE, Op, Value, rewrite
from ..lower import single_kernel
from .common import Decision
from .fuse_attention import _fold_bias, fused_backward, match_attention
from .fuse_cosine import fuse_cosine
from .fuse_gemm import _split_scatter_sums
from .fuse_group import _OPAQUE, _group
from .fuse_rewrite import NAME


def attention_for_autodiff(outputs) -> Tuple[Tuple[Value, ...], Dict[Value, Value],
                                             List[Decision]]:
    """``outputs`` with each attention pattern that :func:`fused_backward` accepts replaced
    by its fused ``attention`` operator (autodiff then differentiates it as one operator),
    and its cosine score inputs by ``cosine_qk`` as the forward has them (point 7);
    returns (outputs, original value -> its replacement, decisions)."""
    decisions: List[Decision] = []
    memo: Dict[Value, Value] = {}

    def fused(v: Value):
        if v.op != Op.SCATTER or v.kind != NODE:
            return None
        att, _ = match_attention(v)
        if att is None:
            return None
        ok, why = fused_backward(att)
        decisions.append(Decision("autodiff", "attention backward as one operator", ok,
                                  "two traversals (by destination, by source), scores "
                                  "recomputed on chip from the forward's log-sum-exp" if ok
                                  else why + ": differentiated through its operators"))
        return att if ok else None

    fused_outputs = _fold_bias(rewrite(outputs, fused, memo), memo, decisions)
    return fuse_cosine(fused_outputs, memo, decisions, "autodiff"), memo, decisions



def run(outputs, stats=None, enabled: bool = True, mapping: Optional[Dict[Value, Value]] = None):
    """``mapping`` (optional) receives unfused value -> the plan value that materialises it
    (kernel outputs; leaves map to themselves); values kept inside a kernel are absent."""
    decisions: List[Decision] = []
    memo: Dict[Value, Value] = {}
    if not enabled:
        decisions.append(Decision(NAME, "all operators", False,
                                  "disabled (fuse=False): one kernel per operator"))
        out = tuple(rewrite(outputs, lambda v: None if v.op in _OPAQUE else single_kernel(v),
                            memo))
        if mapping is not None:
            mapping.update(memo)
        return out, decisions

    def attention(v: Value):
        if v.op != Op.SCATTER or v.kind != NODE:
            return None
        fused, why = match_attention(v)
        if fused is not None:
            decisions.append(Decision(NAME, "score + edge_softmax + aggregate -> attention", True,
                                      f"one traversal, roles {tuple(N.attention_roles(fused))}"))
        elif v.args[0].op == Op.MUL and any(a.op == Op.EDGE_SOFTMAX for a in v.args[0].args):
            decisions.append(Decision(NAME, "edge_softmax aggregation", False, why))
        return fused

    new_outputs = _fold_bias(rewrite(outputs, attention, memo), memo, decisions)
    new_outputs = fuse_cosine(new_outputs, memo, decisions)
    new_outputs = _split_scatter_sums(new_outputs, memo, decisions, stats)
    made: Dict[Value, Value] = {}
    out = tuple(_group(new_outputs, decisions, made, stats))
    if mapping is not None:
        for orig, new in memo.items():
            if new in made:
                mapping[orig] = made[new]
            elif new.op in _OPAQUE:
                mapping[orig] = new
        # An attention with its epilogue bias or addend replaced no original value, nor did
        # an addend the fold formed (``A + b``), but autodiff differentiates those very nodes
        # (``attention_for_autodiff`` folds alike): its backward reads the output saved
        # under the attention, and the addend, which the output includes.
        for v, k in made.items():
            if v.op == Op.ATTENTION and "bias" in v.attr("roles"):
                mapping[v] = k
                b = N.attention_roles(v)["bias"]
                if b in made:
                    mapping[b] = made[b]
        # So do cosine_qk and its outputs (point 7), which replaced no original value; each
        # output is a step, read in the forward or not (lowering: ``ir.select_kernels``).
        for c, k in made.items():
            if c.op == Op.COSINE_QK:
                mapping[c] = k
                mapping.update((N.pick(c, r), s) for r, s in N.select_kernels(k).items())
    return out, decisions

