"""Horizontal fusion: typed linears reading the same rows become one GEMM.

``[reshape](linear(x, W_i) [+ b_i])`` for several ``i`` with the same input rows ``x`` and
weights sliced alike is ``linear(x, wcat(W_i)) [+ wcat(b_i)]`` read back as column windows
(``cols``, views of one output): the gathered rows of ``x`` are read once instead of once per
linear, one launch instead of several.  HGT's K and V on compact (source, relation) rows after
``reorder`` folded the node-type linears into the relation's: on synthetic mag two GEMMs of
N = 64 reading the same 10M gathered rows become one of N = 128.

Mostly linears of *gathered* rows (a node row read per compact or edge row): there the fused
GEMM saves the scattered reads.  Over node rows the input is read in order anyway, and one
output would tie its windows' lifetimes: HGT's K, Q and V on a graph of mixed source types,
where Q is kept for the attention backward and K and V are rebuilt there instead of kept
(``autodiff.recomputed``), would keep all three alive.  A layer input's linears with
declared, shared weights that only an attention reads (gathered) or that are added to its
output join too (:func:`_node_member`: the Transformer's query, key, value and root
projections, one GEMM instead of four, and one of each kind backward).

Its backward (autodiff gives a fused linear's gradient as the ``place`` of its windows'
gradients: a concat) is free where the windows' gradients come from one fused attention
backward as its k and v gradients (k's window first): that backward writes them side by
side into one buffer (``joint_kv``), which the transposed GEMM (dx) and the weight gradient
read as one matrix.  Elsewhere the ``place`` is never built: its readers take the pieces
apart (:func:`distribute`).

Per-head score products of one node value (:func:`fuse_scores`): ``linear(z, A_i)`` with
one-column per-head weights ``A_i (H, C, 1)`` (GAT's ``<z_h, a_src_h>`` and ``<z_h,
a_dst_h>``) become one product of ``z``'s flattened rows with their block-diagonal ``(H C,
k H)`` matrix (``wblocks``), read back as column windows.  Lowering then forms that product in
the epilogue of ``z``'s own GEMM (``lower._extra_products``, the ``(x W) V`` form): no GEMM of
its own.  Its backward is one concat of the k narrow score gradients, read by one transposed
GEMM (dz) and one weight gradient (of the block matrix, which the weight root's own backward
takes apart into the ``A_i``'s): :func:`distribute` leaves a concat that narrow built.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Dict, List, Optional, Tuple

from ...kernels.segment_mm.spec import EXTRA_MAX_COLS, EXTRA_MAX_N, NARROW, padded_width
from .. import ir as N
from ..ir import NODE, Op, Value, WEIGHT, rewrite, toposort
from .common import Decision

NAME = "siblings"


def _parts(v: Value, uses: Counter) -> Optional[Tuple[Value, Value, Optional[Value]]]:
    """(input rows, weight, bias or None) of ``v`` = ``[reshape](linear(x, W) [+ b])`` with a
    dense weight, whose inner values nothing else reads; else None."""
    inner = v.args[0] if v.op == Op.RESHAPE else v
    if inner is not v and uses[inner] > 1:
        return None
    bias = None
    if inner.op == Op.ADD:
        lin = [a for a in inner.args if a.op == Op.LINEAR]
        bias = [a for a in inner.args if a.kind == WEIGHT]
        if len(lin) != 1 or len(bias) != 1 or uses[lin[0]] > 1:
            return None
        inner, bias = lin[0], bias[0]
    if inner.op != Op.LINEAR:
        return None
    x, w = inner.args
    # (a stored-transposed weight is read in place by its own GEMM: of gathered rows it
    # stays so; node rows read by an attention fuse anyway, see :func:`_node_member`)
    if len(w.shape) != 2 or (w.op == Op.WT and x.op == Op.GATHER):
        return None
    if bias is not None and (len(bias.shape) != 1 or bias.per != w.per
                             or bias.shape[0] != w.shape[1]):
        return None
    return x, w, bias


def _widest(order, uses: Counter) -> Dict[Value, Tuple[Value, Value, Optional[Value]]]:
    """Each candidate's parts, taking a reshape around a linear over the linear itself (the
    window then has the reshape's heads)."""
    found = {}
    for v in order:
        parts = _parts(v, uses)
        if parts is None:
            continue
        inner = v.args[0] if v.op == Op.RESHAPE else v
        found.pop(inner, None)
        if inner.op == Op.ADD:
            found.pop(next(a for a in inner.args if a.op == Op.LINEAR), None)
        found[v] = parts
    return found


def _node_member(v: Value, x: Value, w: Value, readers) -> bool:
    """Whether ``v``, a linear of node rows ``x``, may join one GEMM with its siblings: ``x`` a
    layer input, a parameter for weight (as declared, not a product ``reorder`` made), shared
    by every row, and ``v`` read only per edge (gathered: an attention's query, key or value)
    or added (a root term the attention's store adds).  Such windows are kept for the
    attention backward anyway, so one output ties no lifetimes that were apart (unlike HGT's
    per-type K, Q, V, or GAT's projection, whose score products ride on its own GEMM); their
    gradients are built as one concat (:func:`distribute`), read by one transposed GEMM and
    one weight gradient: the Transformer's four projections."""
    param = w.args[0] if w.op == Op.WT else w
    if x.op != Op.INPUT or w.per is not None or param.op != Op.PARAM:
        return False
    return bool(readers[v]) and all(r.op in (Op.GATHER, Op.ADD) for r in readers[v])


def _declined(widths: List[int]) -> str:
    """Why one GEMM of these output widths would cost more than one per width ('' if not).
    A one-column output (a one-head score term, N <= NARROW) has its own kernel in fp32,
    which reads a row in one step; beside a wide one it would be padded to a tl.dot tile
    (RGAT's ``z W_r`` and ``z W_r a_src`` on mag, then with N = 32 + 2 on that kernel: one
    64-wide tile, inference 3.5 -> 5.0 ms).  Nor may the fused output pad to more columns
    than the separate ones (wider score terms, N = heads, are padded tl.dot tiles either
    way and meet this rule): the fp32 GEMMs are bound by their multiply-adds."""
    if min(widths) <= NARROW:
        return (f"an output of {min(widths)} columns runs on the narrow kernel (fp32); fused "
                "it would pad to a full tile")
    if padded_width(sum(widths)) > sum(padded_width(n) for n in widths):
        return (f"one GEMM computes {padded_width(sum(widths))} padded columns, separate "
                f"ones {sum(padded_width(n) for n in widths)}")
    return ""


def fuse_linears(outputs, decisions: List[Decision]):
    """Groups of linears of one input, slicing and bias-ness -> one GEMM and its windows."""
    order = toposort(outputs)
    uses = Counter(a for v in order for a in v.args)
    uses.update(outputs)               # an output is read by the caller
    outs = set(outputs)
    readers: Dict[Value, List[Value]] = defaultdict(list)
    for v in order:
        for a in dict.fromkeys(v.args):
            readers[a].append(v)
    groups: Dict[tuple, List[Tuple[Value, tuple]]] = defaultdict(list)
    for v, parts in _widest(order, uses).items():
        x, w, b = parts
        if x.op == Op.GATHER or _node_member(v, x, w, readers):
            groups[(x, w.per, b is not None)].append((v, parts))
    window: Dict[Value, Tuple[int, int]] = {}      # member -> (group, its first column)
    fused_groups: List[List[tuple]] = []
    for (x, per, biased), found in groups.items():
        if len(found) < 2:
            continue
        members, parts = [m for m, _ in found], [p for _, p in found]
        ws = [p[1] for p in parts]
        why = _declined([w.shape[1] for w in ws])
        if why:
            decisions.append(Decision(NAME, f"{len(members)} linears of one {x.kind} input",
                                      False, why))
            continue
        start = 0
        for m, w in zip(members, ws):
            window[m] = (len(fused_groups), start)
            start += w.shape[1]
        fused_groups.append(parts)
        decisions.append(Decision(NAME, f"{len(members)} linears of one {x.kind} input", True,
                                  f"one GEMM of N = {start} (widths "
                                  f"{'+'.join(str(w.shape[1]) for w in ws)}): the input rows "
                                  f"read once{', biases in one epilogue' if biased else ''}"
                                  f"{'; a window is an output' if outs & set(members) else ''}"))
    def build(group: int, memo: Dict[Value, Value]) -> Value:
        parts = fused_groups[group]
        x = memo[parts[0][0]]      # (weights: not visited yet for later members, and
        fused = N.linear(x, fused_weight([memo.get(p[1], p[1]) for p in parts]))
        if parts[0][2] is not None:                                      # (unchanged)
            fused = N.binary(Op.ADD, fused, fused_weight([memo.get(p[2], p[2]) for p in parts]))
        return fused
    return _read_as_windows(outputs, window, build)


def _read_as_windows(outputs, window: Dict[Value, tuple], build):
    """``outputs`` with each member ``v`` of ``window`` (``v -> (group, first column)``) read
    as its columns of its group's one fused value, ``build(group, memo)``, made once from the
    rewritten inputs.  Keyed by the graph as it was: a later group reads an earlier group's
    windows, so its members were rebuilt."""
    if not window:
        return outputs
    built: Dict[object, Value] = {}

    def rule(v: Value, new: Value, memo: Dict[Value, Value]):
        if v not in window:
            return None
        group, start = window[v]
        if group not in built:
            built[group] = build(group, memo)
        return N.cols(built[group], start, v.shape)
    return rewrite(outputs, rule, original=True)


def fused_weight(ws: List[Value]) -> Value:
    """The fused GEMM's weight, ``wcat(W_i)``; when every ``W_i`` is ``wmul(wsrc(A_i), B_i)``
    with per-head ``B_i`` of one head shape (HGT's ``K_tau W_r`` and ``V_tau W_r``, and their
    biases), the one product ``wmul(wsrc(wcat(A_i)), wheads(B_i))`` instead: the same matrix
    (the concatenated inputs' head blocks meet their own heads' weights), built with one
    source-type gather and one per-head product instead of one each per sibling -- the weight
    roots' launches, forward and backward, are most of a small HGT step's."""
    if all(w.op == Op.WMUL and w.args[0].op == Op.WSRC and len(w.args[1].shape) == 3
           for w in ws):
        a = [w.args[0].args[0] for w in ws]
        b = [w.args[1] for w in ws]
        if (len({x.shape[:-1] for x in a}) == 1 and len({x.per for x in a}) == 1
                and len({x.shape[1:] for x in b}) == 1 and len({x.per for x in b}) == 1):
            return N.wmul(N.wsrc(N.wcat(a)), N.wheads(b))
    if all(w.op == Op.WT for w in ws):
        # weights stored transposed ([out, in]: the Transformer's nn.Linear weights): stacked
        # in that layout, so the GEMM reads the stack in place and the parameters' gradients
        # are row blocks of the stack's (no copy turns one around)
        return N.wT(N.wcat([w.args[0] for w in ws], rows=True))
    return N.wcat(ws)


#: Most columns of the one score product: what a GEMM's epilogue forms (fp32's cap,
#: ``segment_mm.spec.extra_max_cols``).  Wider, it would be a GEMM of its own doing H times the
#: multiply-adds of the per-head products.
SCORE_MAX_COLS = max(EXTRA_MAX_COLS.values())


def _score_weight(v: Value) -> bool:
    """Whether ``v`` is ``linear(z, A)`` of node rows with a one-column per-head weight
    ``A (H, C, 1)`` shared by every row: a per-head score term."""
    if v.op != Op.LINEAR or v.kind != NODE:
        return False
    w = v.args[1]
    return len(w.shape) == 3 and w.shape[2] == 1 and w.per is None


def _scores_declined(z: Value, members: List[Value], readers) -> str:
    """Why ``members`` (score linears of ``z``) stay separate products ('' if not)."""
    H, C = z.shape
    odd = sorted({r.op for m in members for r in readers[m] if r.op != Op.GATHER})
    if odd:
        return (f"a score term is read by {', '.join(odd)} (not only gathered per edge): its "
                "window of the fused product would be a strided view only the attention "
                "kernels read in place")
    if len(members) * H > SCORE_MAX_COLS:
        return (f"{len(members)} x {H} heads = {len(members) * H} columns: more than a GEMM's "
                f"epilogue forms ({SCORE_MAX_COLS}); as a GEMM of its own the block-diagonal "
                "product would do H times the multiply-adds of the per-head ones")
    lin = z.args[1] if z.op == Op.LINEAR else None
    # (a weight stored transposed, ``wT`` of a parameter, is read in place by the same GEMM)
    if (lin is None or len(lin.shape) != 2 or lin.per is not None
            or (lin.op == Op.WT and lin.args[0].op != Op.PARAM)):
        return ("the value is not the output of a GEMM with one dense weight: the fused "
                "product would be a GEMM of its own (no epilogue to ride on)")
    x = z.args[0]
    if H * C > EXTRA_MAX_N or min(x.heads * x.dim, H * C) <= NARROW:
        return (f"its GEMM ({x.heads * x.dim} -> {H * C} columns) has no epilogue product "
                f"(rows wider than {EXTRA_MAX_N}, or the narrow kernel)")
    return ""


def fuse_scores(outputs, decisions: List[Decision]):
    """Per-head score linears of one node value -> one product with their block-diagonal
    weight, read back as column windows (module docstring)."""
    order = toposort(outputs)
    readers: Dict[Value, List[Value]] = defaultdict(list)
    for v in order:
        for a in dict.fromkeys(v.args):
            readers[a].append(v)
    for o in outputs:
        readers[o].append(Value("output"))     # (the caller reads an output)
    groups: Dict[Value, List[Value]] = defaultdict(list)
    for v in order:
        if _score_weight(v):
            groups[v.args[0]].append(v)
    window: Dict[Value, Tuple[Value, int]] = {}
    for z, members in groups.items():
        shapes = {m.args[1].shape for m in members}
        if len(members) < 2 or len(shapes) != 1:
            continue
        what = f"{len(members)} per-head score linears of one {z.kind} value ({z.heads} heads)"
        why = _scores_declined(z, members, readers)
        if why:
            decisions.append(Decision(NAME, what, False, why))
            continue
        H, C = z.shape
        for i, m in enumerate(members):
            window[m] = (z, i * H)
        decisions.append(Decision(
            NAME, what, True, f"one product of the {H * C}-column rows with their "
            f"{'block-diagonal ' if H > 1 else ''}{H * C} x {len(members) * H} weight (wblocks, "
            "one kernel to build), read back as column windows: the rows read once, one "
            "product instead of " + str(len(members))))

    def build(z: Value, memo: Dict[Value, Value]) -> Value:
        return N.linear(memo[z], N.wblocks([memo.get(m.args[1], m.args[1]) for m in groups[z]]),
                        1)
    return _read_as_windows(outputs, window, build)


def _kv_place(v: Value) -> Optional[Value]:
    """The attention backward whose k and v gradients ``v`` places side by side (k first,
    each whole, filling the row), or None."""
    if v.op != Op.PLACE or len(v.args) != 2:
        return None
    picks = [a.args[0] if a.op == Op.RESHAPE else a for a in v.args]
    if any(p.op != Op.PICK for p in picks) or picks[0].args[0] != picks[1].args[0]:
        return None
    if (picks[0].attr("role"), picks[1].attr("role")) != ("k", "v"):
        return None
    k = picks[0]
    if v.attr("starts") != (0, k.heads * k.dim):
        return None
    bwd = picks[0].args[0]
    width = sum(p.heads * p.dim for p in picks)
    return bwd if width == v.heads * v.dim else None


def joint_gradients(outputs, decisions: List[Decision]):
    """``place(pick(B, k), pick(B, v))`` -> ``pick(joint_kv(B), kv)``: the attention backward
    writes both gradients into one buffer, so the concat is no copy."""
    targets = {b for v in toposort(outputs) for b in [_kv_place(v)] if b is not None}
    if not targets:
        return outputs
    done = []

    def rule(v: Value, new: Value, memo):
        # (targets are backward nodes of the graph as it was; the places read rebuilt ones)
        if v in targets:
            return N.joint_kv(new)
        b = _kv_place(new)
        if b is not None and b.attr("joint", False):
            done.append(v)
            joint = N.pick(b, "kv")
            return joint if joint.shape == v.shape else N.reshape(joint, v.heads)
        return None

    new_outputs = rewrite(outputs, rule, original=True)
    decisions.append(Decision(NAME, f"k and v gradients of {len(done)} attention backward(s)",
                              True, "written side by side into one buffer: the fused GEMM's "
                              "backward reads them as one matrix, no concat"))
    return new_outputs


def _windows(p: Value):
    """(piece, start, width) of ``place`` ``p``; a piece as one head, so that a bias sum reads
    the fused row's columns (not one broadcast per head) and pairs with the weight gradient
    of the same rows (``lower._bias_sums_with_wgrads``)."""
    return [(N.reshape(a, 1) if a.heads != 1 else a, s, a.heads * a.dim)
            for a, s in zip(p.args, p.attr("starts"))]


def distribute(outputs, decisions: List[Decision]):
    """A ``place`` (the concat of a fused GEMM's window gradients) that no kernel writes
    whole is never built: its readers take the pieces apart, ``linear(place(g_i), W^T) =
    sum_i linear(g_i, W_i^T)`` (``W_i``: the windows of the fused weight), ``wgrad(x,
    place(g_i)) = wcat(wgrad(x, g_i))`` and ``wsum(place(g_i)) = wcat(wsum(g_i))``: the
    backward of separate linears, the forward's one GEMM kept."""
    done, kept = [], set()

    def rule(v: Value):
        p = v.args[0] if v.op in (Op.LINEAR, Op.WSUM) else \
            v.args[1] if v.op == Op.WGRAD else None
        if p is None or p.op != Op.PLACE or not N.place_tiles(p):
            return None
        if p.heads * p.dim <= SCORE_MAX_COLS or p.kind == NODE:
            # (the score gradients of :func:`fuse_scores`' one product; the node rows of
            # :func:`_node_member`'s GEMM: one copy against a GEMM and a weight gradient
            # per window)
            kept.add(p)
            return None
        if v.op == Op.LINEAR:
            w = v.args[1]
            if w.op != Op.WT or len(w.shape) != 2:
                return None
            parts = [N.linear(g, N.wT(N.wcols(w.args[0], s, n)), v.attr("heads"))
                     for g, s, n in _windows(p)]
            out = parts[0]
            for part in parts[1:]:
                out = N.binary(Op.ADD, out, part)
        elif v.op == Op.WGRAD:
            if v.attr("transposed"):     # (its windows are rows of the stored gradient)
                return None
            out = N.wcat([Value(Op.WGRAD, (v.args[0], g), WEIGHT, v.shape[:-1] + (n,),
                                v.attrs) for g, _, n in _windows(p)])
        else:
            if len(v.shape) != 1:
                return None
            out = N.wcat([Value(Op.WSUM, (g,), WEIGHT, (n,), v.attrs)
                          for g, _, n in _windows(p)])
        done.append(v.op)
        return out

    new = rewrite(outputs, rule)
    if kept:
        decisions.append(Decision(NAME, f"{len(kept)} concat(s) of window gradients", False,
                                  f"at most {SCORE_MAX_COLS} columns a row, or node rows: "
                                  "built once (a copy), then read by one GEMM and one weight "
                                  "gradient instead of one of each per window"))
    if done:
        decisions.append(Decision(NAME, f"{len(done)} readers of a concat of window gradients",
                                  True, "read piece by piece ("
                                  + ", ".join(sorted(set(done))) + "): no concat copy"))
    return new


def run(outputs, stats=None, enabled: bool = True):
    decisions: List[Decision] = []
    if not enabled:
        decisions.append(Decision(NAME, "all linears", False,
                                  "disabled (fuse=False): one GEMM per linear"))
        return tuple(outputs), decisions
    outputs = fuse_scores(tuple(outputs), decisions)
    outputs = fuse_linears(tuple(outputs), decisions)
    outputs = joint_gradients(tuple(outputs), decisions)
    outputs = distribute(tuple(outputs), decisions)
    if not decisions:
        decisions.append(Decision(NAME, "all linears", False,
                                  "no two linears read the same rows with weights sliced alike"))
    return tuple(outputs), decisions
