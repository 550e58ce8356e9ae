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
   subtract ``b`` again where they need the attention's own output).
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
"""
from __future__ import annotations

import os
from collections import Counter
from typing import Dict, List, Optional, Tuple

from .. import ir as N
from ..ir import EDGE, LEAVES, NODE, Op, Value, WEIGHT, arg, kernel, rewrite, toposort
from ..lower import (PROLOGUE_OPS, attention_spec, csr_epilogue, linear_traversal,
                     single_kernel, template_of)
from .common import Cheaper, Decision

NAME = "fuse"


def _terms(s: Value) -> List[Value]:
    return _terms(s.args[0]) + _terms(s.args[1]) if s.op == Op.ADD else [s]


def _side(t: Value, end: str) -> Optional[Value]:
    """The value a term reads from the ``end`` side, or None."""
    if t.op == Op.GATHER and t.attr("end") == end and t.attr("norm") is None and t.kind == EDGE:
        return t.args[0]
    return None


def _qk(t: Value):
    """``[scale(] [mul(] dot(q_dst, k_src) [, p)] [, c)]`` -> (q, k, p, c) or None."""
    c = 1.0
    if t.op == Op.SCALE:
        c, t = t.attr("factor"), t.args[0]
    p = None
    if t.op == Op.MUL:
        w = [a for a in t.args if a.kind == WEIGHT]
        rest = [a for a in t.args if a.kind != WEIGHT]
        if len(w) != 1 or len(rest) != 1:
            return None
        p, t = w[0], rest[0]
    if t.op != Op.DOT:
        return None
    q, k = _side(t.args[0], "dst"), _side(t.args[1], "src")
    if q is None or k is None:
        q, k = _side(t.args[1], "dst"), _side(t.args[0], "src")
    if q is None or k is None or q.kind not in (NODE,) and q.kind != N.CDST:
        return None
    return q, k, p, c


def match_attention(v: Value) -> Tuple[Optional[Value], str]:
    """The fused ``attention`` operator equal to ``v``, or (None, why not)."""
    if not (v.op == Op.SCATTER and v.kind == NODE and v.attr("end") == "dst"
            and v.attr("reduce") == "sum" and v.args[0].op == Op.MUL):
        return None, "not a sum over incoming edges of a product"
    a, b = v.args[0].args
    alpha, msg = (a, b) if a.op == Op.EDGE_SOFTMAX else (b, a)
    if alpha.op != Op.EDGE_SOFTMAX:
        return None, "no edge softmax in the product"
    if alpha.heads != msg.heads:
        return None, f"softmax heads {alpha.heads} != message heads {msg.heads}"
    s, slope = alpha.args[0], None
    if s.op == Op.LEAKY_RELU:
        s, slope = s.args[0], s.attr("slope")
    roles: Dict[str, Value] = {"v": _side(msg, "src") or msg}
    if roles["v"].kind == N.CDST or (roles["v"].kind == NODE and _side(msg, "src") is None):
        return None, "message is not a source-side value"
    scale = 1.0
    for t in _terms(s):
        qk = _qk(t) if "q" not in roles else None
        if qk is not None:
            roles["q"], roles["k"], p, scale = qk
            if p is not None:
                roles["p"] = p
        elif _side(t, "src") is not None and "a_src" not in roles:
            roles["a_src"] = _side(t, "src")
        elif _side(t, "dst") is not None and "a_dst" not in roles:
            roles["a_dst"] = _side(t, "dst")
        elif t.kind == EDGE and "a_src" not in roles:
            roles["a_src"] = t      # an edge-wise term: read per edge (edge-sourced lowering)
        else:
            return None, f"score term {t.op} is not a q.k, source or destination term"
    if "q" in roles and roles["q"].kind != NODE:
        return None, "query depends on the relation (compact dst rows)"
    return N.attention(roles, msg.shape, scale, slope), ""


def fused_backward(att: Value) -> Tuple[bool, str]:
    """Whether attention ``att`` is differentiated as one operator (its backward kernels), or
    (False, why) through its unfused operators.  The kernels take every term on the rows
    the forward's op call traverses (``AttentionRows``): the graph's nodes, a derived graph
    whose sources are one row kind and whose destinations are the nodes; a destination
    term per (dst, relation) row (RGAT's) is read per edge, and its gradient summed back
    into those rows."""
    rows = attention_spec(att, None)[1]
    roles = N.attention_roles(att)
    if rows.score_on_edges:
        return False, "the score is per edge (a relation-dependent destination term with q.k)"
    side = [roles[r].kind for r in ("v", "k", "a_src") if r in roles]
    if any(kind != rows.source for kind in side):
        return False, f"source terms on {sorted(set(side))} rows, not all on {rows.source} rows"
    return True, ""


def attention_for_autodiff(outputs) -> Tuple[Tuple[Value, ...], Dict[Value, Value],
                                             List[Decision]]:
    """``outputs`` with each attention pattern that :func:`fused_backward` accepts replaced
    by its fused ``attention`` operator (autodiff then differentiates it as one operator);
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

    fused_outputs = rewrite(outputs, fused, memo)
    return _fold_bias(fused_outputs, memo, decisions), memo, decisions


def _fold_bias(outputs, memo: Dict[Value, Value], decisions: List[Decision]):
    """``outputs`` with each ``[reshape](attention) + b`` (see the module's point 4) made
    ``[reshape](attention(..., bias=b))``; ``memo`` (original value -> replacement, of an
    earlier rewrite) is updated to map to the new values."""
    alone = _read_once(outputs)

    def fold(orig: Value, new: Value, _memo) -> Optional[Value]:
        if orig.op != Op.ADD:
            return None
        x, b = orig.args if orig.args[1].kind == WEIGHT else orig.args[::-1]
        att = x.args[0] if x.op == Op.RESHAPE else x
        if att.op != Op.ATTENTION or b.kind != WEIGHT or "bias" in att.attr("roles"):
            return None
        width = att.heads * att.dim
        if (b.per or tuple(b.shape) != (width,) or tuple(x.shape) != (1, width)
                or not alone(att) or not alone(x)):
            return None
        decisions.append(Decision(NAME, "bias add into attention", True,
                                  "the attention kernel adds the bias row as it stores each "
                                  "output row (no pass over the node rows)"))
        roles = dict(N.attention_roles(att), bias=b)
        fused = N.attention(roles, att.shape, att.attr("scale"), att.attr("slope"))
        return Value(x.op, (fused,), x.kind, x.shape, x.attrs) if x is not att else fused

    return _rewrite_after(outputs, fold, memo)


def _read_once(outputs):
    """``alone(v)``: ``v`` is read by one operator of ``outputs``' graph and is not an
    output."""
    consumers = Counter(a for v in toposort(outputs) for a in set(v.args))
    is_output = set(outputs)
    return lambda v: consumers[v] == 1 and v not in is_output


def _rewrite_after(outputs, fn, memo: Dict[Value, Value]):
    """``rewrite(outputs, fn, original=True)``, with ``memo`` (original value -> its
    replacement by an earlier rewrite) updated to map to the new values."""
    again: Dict[Value, Value] = {}
    out = rewrite(outputs, fn, again, original=True)
    for k, v in memo.items():
        memo[k] = again.get(v, v)
    return out


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
    new_outputs = _split_scatter_sums(new_outputs, memo, decisions, stats)
    made: Dict[Value, Value] = {}
    out = tuple(_group(new_outputs, decisions, made, stats))
    if mapping is not None:
        for orig, new in memo.items():
            if new in made:
                mapping[orig] = made[new]
            elif new.op in _OPAQUE:
                mapping[orig] = new
        # An attention with its epilogue bias replaced no original value, but autodiff
        # differentiates that very node (``attention_for_autodiff`` folds alike): its
        # backward reads the output saved under it.
        mapping.update((v, k) for v, k in made.items()
                       if v.op == Op.ATTENTION and "bias" in v.attr("roles"))
    return out, decisions


#: What grouping never looks inside: leaves, and kernels already formed.
_OPAQUE = LEAVES + (Op.KERNEL,)


def _group(outputs, decisions: List[Decision], made: Dict[Value, Value], stats=None):
    order = toposort(outputs)
    consumers = Counter(a for v in order for a in set(v.args))
    is_output = set(outputs)
    apart = set()     # sums over a CSR kept out of the traversal that reads them (split)

    def inline_ok(a: Value, consumer: Value) -> bool:
        if a.op in _OPAQUE or a.kind == WEIGHT:
            return False
        if gemm_scatter(a) or gemm_csr_scatter(a):
            return False
        if Op.COLS in (a.op, consumer.op) or a.op == Op.PLACE:
            return False      # a window is a view of its materialised input; a place a concat
        if a in apart:
            decisions.append(Decision(NAME, f"{a.op} into {consumer.op}", False,
                                      "a sum over a CSR that traversal_csr runs by itself "
                                      "(rows batched per program) stays out of an elementwise "
                                      "traversal, which would reduce one row per program"))
            return False
        if template_of(a) != "traversal" or template_of(consumer) not in ("traversal",):
            if template_of(a) == "traversal" and consumer.op == Op.LINEAR:
                decisions.append(Decision(NAME, f"{a.op} into linear", False,
                                          "the segment GEMM reads its input rows from memory"))
            return False
        if a in is_output:
            return False
        if consumers[a] > 1 and not _of_leaves(a):
            decisions.append(Decision(NAME, f"{a.op} into {consumer.op}", False,
                                      f"read by {consumers[a]} operators: materialised once"))
            return False
        if consumers[a] > 1:
            decisions.append(Decision(NAME, f"{a.op} into {consumer.op}", True,
                                      f"read by {consumers[a]} operators, elementwise of "
                                      "leaves: recomputed in each traversal that reads it"))
            return True
        decisions.append(Decision(NAME, f"{a.op} into {consumer.op}", True,
                                  "single consumer in the same traversal"))
        return True

    def build(v: Value, inputs: List[Value], trail: Optional[List] = None) -> Value:
        """Body of the kernel rooted at ``v``; external inputs appended to ``inputs``;
        ``trail`` (optional) receives (value, its consumer) for every value inlined."""
        args = []
        for i, a in enumerate(v.args):
            if v.op == Op.LINEAR and a.op == Op.WT and a.kind == WEIGHT:
                args.append(N.wT(_placeholder(materialise(a.args[0]), inputs)))
            elif i == 0 and _gemm_gather(a, v):
                args.append(gemm_gather(a, v, inputs))
            elif i == 0 and _prologue(a, v):
                args.append(prologue(a, v, inputs))
            elif i == 0 and csr_prologue_ok(a, v):
                args.append(csr_prologue(a, v, inputs))
            elif inline_ok(a, v):
                if trail is not None:
                    trail.append((a, v))
                args.append(build(a, inputs, trail))
            else:
                args.append(_placeholder(materialise(a), inputs))
        return Value(v.op, tuple(args), v.kind, v.shape, v.attrs)

    def traversal(v: Value, inputs: List[Value]) -> Value:
        """``v``'s traversal body.  When it is not a linear traversal (``traversal_csr``
        cannot run it, so the edgewise kernel's reduce form would: one program per row) but
        a sum over a CSR inside it is one by itself, that sum becomes its own kernel and
        this one a row map reading it (HGT's dx: the compact rows' gradients summed per
        node, 3.6 -> ~1.2 ms on mag)."""
        logged, trail = len(decisions), []
        body = build(v, inputs, trail)
        if linear_traversal(body)[0] is not None:
            return body
        split = []
        for a, consumer in trail:
            if a.op != Op.SCATTER or consumer.op in (Op.SCATTER, Op.GATHER):
                continue
            mark = len(decisions)
            alone = build(a, [])
            del decisions[mark:]
            if linear_traversal(alone)[0] is not None:
                split.append(a)
        if not split:
            return body
        apart.update(split)
        del decisions[logged:]
        inputs.clear()
        return build(v, inputs)

    def materialise(v: Value) -> Value:
        if v.op in _OPAQUE:
            return v
        if v not in made:
            inputs: List[Value] = []
            template = template_of(v)
            if v.kind == WEIGHT:   # weight expressions stay whole: tiny, once per call
                body = _weight_body(v, inputs)
            elif addend_epilogue(v) is not None:
                body, template = with_addend(v, inputs), "gemm"
            elif epilogue(v) is not None:
                body, template = with_epilogue(v, inputs), "gemm"
            elif gemm_scatter(v):
                body = Value(v.op, (build(v.args[0], inputs),), v.kind, v.shape, v.attrs)
                template = "gemm"
            elif gemm_csr_scatter(v):
                g = v.args[0]
                body = Value(v.op, (Value(g.op, (build(g.args[0], inputs),), g.kind, g.shape,
                                          g.attrs),), v.kind, v.shape, v.attrs)
                template = "gemm"
            elif template == "traversal":
                body = traversal(v, inputs)
            else:
                body = build(v, inputs)
            made[v] = kernel(template, body, inputs)
        return made[v]

    scatter_epilogue: Dict[Value, bool] = {}
    scattered = set()      # linears whose rows a scatter epilogue sums (gemm_scatter)

    def gemm_scatter(v: Value) -> bool:
        """``v`` sums a typed linear's compact rows into their nodes (``scatter_sum_dst`` of
        (dst, relation) rows, ``scatter_sum_src`` of (src, relation) rows: one node per row),
        the linear read by nothing else: the GEMM's scatter epilogue does the sum -- when
        the graph has at least twice as many of those rows as nodes.  (The GEMM's atomics
        hide behind its FMA-bound product; what the epilogue adds is a zeroed node buffer and
        the node-row pass that adds the other terms, what it saves is the compact rows'
        write and read: RGCN forward on the H200, wikikg2 (5.2 rows per node) 7.89 -> 6.94
        ms, mag (0.78) 3.04 -> 3.13 ms.)"""
        if v in scatter_epilogue:
            return scatter_epilogue[v]
        lin = v.args[0] if _sums_compact_rows(v) else None
        ok = lin is not None and (lin.op == Op.LINEAR and _csr_gemm(lin) and consumers[lin] == 1
                                  and lin not in is_output)
        if ok:
            d = _scatter_decision(
                "scatter into linear (epilogue)", lin.kind, stats,
                "the segment GEMM sums each output row into its node row (fp32 atomics): no "
                "compact rows written and read back",
                "fewer than two rows per node: the node passes would cost more than the "
                "compact rows' round trip")
            decisions.append(d)
            ok = d.applied
        scatter_epilogue[v] = ok
        if ok:
            scattered.add(lin)
        return ok

    csr_scatter: Dict[Value, bool] = {}

    def gemm_csr_scatter(v: Value) -> bool:
        """``v`` sums a typed linear's compact rows into node rows through a gather onto
        the edges and a scatter off them (RGCN's backward: each (dst, relation) row's
        gradient ``dy[dst] W_r^T`` gathered onto its edges with the mean's ``1 / count`` and
        summed into their sources), the linear and the gather read by nothing else: the
        GEMM's CSR scatter epilogue adds each output row into the chain's node rows (fp32
        atomics), so the compact rows (on wikikg2 3.3 GB, at the training peak) are never
        written -- when those rows number at least twice the nodes (the scatter epilogue's
        question; ``HECTOR_CSR_PROLOGUE=0`` turns it off)."""
        if v in csr_scatter:
            return csr_scatter[v]
        lin = _csr_scatter_linear(v)
        ok = (lin is not None and csr_mode() != "0" and consumers[v.args[0]] == 1
              and consumers[lin] == 1 and lin not in is_output and v.args[0] not in is_output)
        if ok:
            d = _scatter_decision(
                "gather + scatter into linear (CSR scatter epilogue)", lin.kind, stats,
                "the segment GEMM adds each output row into the node rows of its row's edges "
                "(fp32 atomics, the chain's weights): no compact rows written and read back",
                "fewer than two rows per node: a traversal sums the GEMM's rows")
            decisions.append(d)
            ok = d.applied
        csr_scatter[v] = ok
        return ok

    def epilogue(v: Value) -> Optional[Tuple[Value, Value]]:
        """(linear, bias) when ``v`` is ``[reshape](add(linear, bias))`` and the GEMM can
        add the bias itself: the linear (not per head) read by the add alone, the add by the
        reshape alone, the bias a weight row sliced like the linear's weight."""
        add = v.args[0] if v.op == Op.RESHAPE else v
        if add.op != Op.ADD or (add is not v and (consumers[add] > 1 or add in is_output)):
            return None
        lin = [a for a in add.args if a.op == Op.LINEAR]
        bias = [a for a in add.args if a.kind == WEIGHT]
        if len(lin) != 1 or len(bias) != 1:
            return None
        (lin,), (bias,) = lin, bias
        if (consumers[lin] > 1 or lin in is_output or len(_stored_weight(lin).shape) != 2
                or not _bias_fits(lin, bias)):
            return None
        return lin, bias

    def addend_epilogue(v: Value) -> Optional[Tuple[Value, Optional[Value], Value]]:
        """(linear, bias or None, addend) when ``v`` is ``add(add(linear, addend), bias)``
        or ``add(linear, addend)`` (either order inside each add) and the addend is a
        scatter-epilogue GEMM's output (``gemm_scatter``): RGCN's root linear then adds the
        relation sum its GEMM left in a node buffer, and the bias, as it stores its rows,
        instead of a node-row pass reading three node tensors and writing a fourth (433 us
        of RGCN's 6.9 ms forward on synthetic wikikg2, H200).  The linear: node rows, read
        by this add alone, one weight per segment (not per head), bias as ``epilogue``
        takes one."""
        if v.op != Op.ADD or v.kind == WEIGHT:
            return None
        bias = next((a for a in v.args if a.kind == WEIGHT), None)
        inner = v
        if bias is not None:
            inner = next(a for a in v.args if a is not bias)
            if (inner.op != Op.ADD or consumers[inner] > 1 or inner in is_output
                    or any(a.kind == WEIGHT for a in inner.args)):
                return None
        lin = [a for a in inner.args if a.op == Op.LINEAR]
        rest = [a for a in inner.args if a.op != Op.LINEAR]
        if len(lin) != 1 or len(rest) != 1 or not (gemm_scatter(rest[0])
                                                    or gemm_csr_scatter(rest[0])):
            return None
        (lin,), (addend,) = lin, rest
        if (consumers[lin] > 1 or lin in is_output or len(_stored_weight(lin).shape) != 2
                or lin.kind != v.kind or addend.kind != v.kind
                or tuple(addend.shape) != tuple(v.shape) or lin.args[0].op == Op.SCATTER
                or (bias is not None and not _bias_fits(lin, bias))):
            return None
        return lin, bias, addend

    def with_addend(v: Value, inputs: List[Value]) -> Value:
        lin, bias, addend = addend_epilogue(v)
        decisions.append(Decision(
            NAME, "sum into linear (addend epilogue)", True,
            "the node GEMM adds the scatter GEMM's node rows" + (" and the bias" if bias else "")
            + " as it stores its rows: no node-row pass over three inputs"))
        linear = build(lin, inputs)          # (x and W become the kernel's arguments 0, 1)
        if bias is not None:
            linear = N.binary(Op.ADD, linear, _placeholder(materialise(bias), inputs))
        return N.binary(Op.ADD, linear, _placeholder(materialise(addend), inputs))

    def with_epilogue(v: Value, inputs: List[Value]) -> Value:
        lin, bias = epilogue(v)
        decisions.append(Decision(NAME, "bias add into linear", True,
                                  "the segment GEMM's epilogue adds the bias row"))
        linear = build(lin, inputs)          # (x and W become the kernel's arguments 0, 1)
        add = N.binary(Op.ADD, linear, _placeholder(materialise(bias), inputs))
        return add if v.op == Op.ADD else Value(v.op, (add,), v.kind, v.shape, v.attrs)

    def _weight_body(v: Value, inputs: List[Value]) -> Value:
        if v.op in _OPAQUE:
            return _placeholder(v, inputs)
        # (a weight gradient inside is a GEMM step of its own: siblings' ``wcat`` of them)
        return Value(v.op, tuple(_weight_body(a, inputs)
                                 if a.kind == WEIGHT and template_of(a) == "weight"
                                 else gemm_gather(a, v, inputs) if i == 0 and _gemm_gather(a, v)
                                 else dy_gather(a, v, inputs) if i == 1 and _dy_gather(a, v)
                                 else prologue(a, v, inputs) if i == 0 and _prologue(a, v)
                                 else csr_prologue(a, v, inputs)
                                 if i == 0 and v.op == Op.WGRAD and csr_prologue_ok(a, v)
                                 else _placeholder(materialise(a), inputs)
                                 for i, a in enumerate(v.args)),
                     v.kind, v.shape, v.attrs)

    def prologue(a: Value, gemm: Value, inputs: List[Value]) -> Value:
        """``a`` (an elementwise function of rows) kept in the GEMM's body: its prologue."""
        decisions.append(Decision(NAME, f"{a.op} into {gemm.op}", True,
                                  "applied by the segment GEMM to each input tile it loads "
                                  "(prologue): no transformed copy of the rows"))
        return Value(a.op, (_placeholder(materialise(a.args[0]), inputs),), a.kind, a.shape,
                     a.attrs)

    def csr_prologue_ok(a: Value, gemm: Value) -> bool:
        """``a`` (a sum over a CSR of one input's rows, read by this typed linear or weight
        gradient alone) can be the GEMM's CSR prologue: the kernel sums each input row as it
        loads it.  For a linear whose scatter epilogue sums its rows (``gemm_scatter``: rows
        at least twice the nodes, nearly edge-sized) and for a weight gradient (the
        backward's rebuilt rows): the kernels walk rows cut into short pieces
        (``steps_triton.gemm``), and the summed rows are neither written nor saved.  Otherwise
        (rows stored once, which cannot be cut) only with ``HECTOR_CSR_PROLOGUE=1``: measured
        slower than the traversal kernel and a plain GEMM where a graph has long rows
        (docs/perf-notes.md, "Session 19"); ``HECTOR_CSR_PROLOGUE=0``: never."""
        mode = csr_mode()
        wgrad = _row_wgrad(gemm)
        if mode == "0" or not (mode == "1" or gemm in scattered or wgrad):
            return False
        if not ((_csr_gemm(gemm) or wgrad) and a.op == Op.SCATTER and a.kind != WEIGHT
                and template_of(a) == "traversal" and consumers[a] == 1
                and a not in is_output):
            return False
        mark = len(decisions)
        lt, _ = linear_traversal(build(a, []))
        del decisions[mark:]
        return lt is not None and len(lt.sources) == 1 and not lt.addends and lt.bias is None

    def csr_prologue(a: Value, gemm: Value, inputs: List[Value]) -> Value:
        decisions.append(Decision(NAME, f"{a.op} into {gemm.op}", True,
                                  "CSR prologue: the segment GEMM sums each input row through "
                                  "the traversal's CSR as it loads it (no summed rows written "
                                  "and read back)"))
        mark = len(decisions)
        body = build(a, inputs)
        del decisions[mark:]        # (its inner fusions are the traversal's usual ones)
        return body

    def dy_gather(a: Value, wgrad: Value, inputs: List[Value]) -> Value:
        """``a`` (a gather of node rows) kept in a weight gradient's body as its dy rows."""
        decisions.append(Decision(NAME, f"gather {a.args[0].kind}->{a.kind} into wgrad (dy)",
                                  True, "the weight-gradient kernel reads dy's node rows "
                                  "through the gather's index: no gathered copy"))
        return Value(a.op, (_placeholder(materialise(a.args[0]), inputs),), a.kind, a.shape,
                     a.attrs)

    def gemm_gather(a: Value, gemm: Value, inputs: List[Value]) -> Value:
        """``a`` (a gather of node rows) kept in the GEMM's body over its node rows."""
        decisions.append(Decision(NAME, f"gather {a.args[0].kind}->{a.kind} into {gemm.op}",
                                  True, "becomes the segment GEMM's gather index"))
        return Value(a.op, (_placeholder(materialise(a.args[0]), inputs),), a.kind, a.shape,
                     a.attrs)

    return [materialise(o) for o in outputs]


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
    what the GEMM's bias epilogue adds."""
    return bias.per == _stored_weight(lin).per and tuple(bias.shape) == (lin.heads * lin.dim,)


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


def _of_leaves(v: Value) -> bool:
    """An elementwise operator whose row inputs are all leaves (inputs, saved values,
    incoming gradients): recomputing it where it is read costs a multiply, not a tensor."""
    return (v.op in N.UNARY + N.BINARY and v.op not in (Op.EXP,)
            and all(a.op in LEAVES or a.kind == WEIGHT for a in v.args))


def _placeholder(v: Value, inputs: List[Value]) -> Value:
    if v not in inputs:
        inputs.append(v)
    return arg(inputs.index(v), v)
