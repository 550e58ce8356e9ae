"""Fusion's attention pattern (the ``fuse`` module's point 1 and 4): the match of
``scatter_sum_dst(edge_softmax(act(score)) * gather_src(v))`` to one ``attention`` operator
(its score's terms read into roles; a dropout of the softmax's weights becomes the
attention's own, with its seed as a role), whether autodiff differentiates it as one operator
(its backward kernels), and the fold of an output bias into the attention's epilogue."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .. import ir as N
from ..ir import EDGE, NODE, Op, Value, WEIGHT
from ..lower import attention_spec
from .common import Decision
from .fuse_rewrite import NAME, _read_once, _rewrite_after



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


def _weights_of(a: Value) -> Optional[Value]:
    """The edge softmax ``a`` is, or drops out of (``dropout(edge_softmax(...))``), or None."""
    inner = a.args[0] if a.op == Op.DROPOUT else a
    return inner if inner.op == Op.EDGE_SOFTMAX else None


def match_attention(v: Value) -> Tuple[Optional[Value], str]:
    """The fused ``attention`` operator equal to ``v``, or (None, why not)."""
    if not (v.op == Op.SCATTER and v.kind == NODE and v.attr("end") == "dst"
            and v.attr("reduce") == "sum" and v.args[0].op == Op.MUL):
        return None, "not a sum over incoming edges of a product"
    a, b = v.args[0].args
    alpha, msg = (a, b) if _weights_of(a) is not None else (b, a)
    dropped = alpha if alpha.op == Op.DROPOUT else None
    alpha = _weights_of(alpha)
    if alpha is None:
        return None, "no edge softmax in the product"
    if alpha.heads != msg.heads:
        return None, f"softmax heads {alpha.heads} != message heads {msg.heads}"
    s, slope = alpha.args[0], None
    if s.op == Op.LEAKY_RELU:
        s, slope = s.args[0], s.attr("slope")
    roles: Dict[str, Value] = {"v": _side(msg, "src") or msg}
    if dropped is not None:
        roles["seed"] = dropped.args[1]
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
    return N.attention(roles, msg.shape, scale, slope,
                       dropped.attr("p") if dropped is not None else 0.0), ""


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


def _fold_bias(outputs, memo: Dict[Value, Value], decisions: List[Decision]):
    """``outputs`` with each ``[reshape](attention) + t`` (see the module's point 4) made
    ``[reshape](attention(..., bias=t))``: ``t`` one weight row (the kernel adds it to every
    row), or node rows as wide as the output (an addend: row ``i`` added to output row
    ``i``); a second term added to an attention that already has one joins it, ``A + b``
    with the node rows first (a node linear plus a bias row is what the GEMM's bias epilogue
    stores).  ``memo`` (original value -> replacement, of an earlier rewrite) is updated to
    map to the new values."""
    alone = _read_once(outputs)
    folded = set()          # the values this rewrite made: ``[reshape](attention(.., bias))``

    def fold(orig: Value, new: Value, _memo) -> Optional[Value]:
        if orig.op != Op.ADD:
            return None
        for i in (0, 1):
            x_o, x, t = orig.args[i], new.args[i], new.args[1 - i]
            att = x.args[0] if x.op == Op.RESHAPE else x
            if att.op != Op.ATTENTION or not alone(x_o):
                continue
            if x not in folded and not (x_o.op == Op.RESHAPE and alone(x_o.args[0])
                                        or x_o.op == Op.ATTENTION):
                continue
            term = _output_term(att, x, t)
            if term is None:
                continue
            roles = N.attention_roles(att)
            had = roles.get("bias")
            if had is not None and had.kind == WEIGHT and t.kind == WEIGHT:
                continue
            decisions.append(_fold_decision(term, had))
            bias = t if had is None else \
                N.binary(Op.ADD, *((had, t) if had.kind != WEIGHT else (t, had)))
            fused = N.attention(dict(roles, bias=bias), att.shape, att.attr("scale"),
                                att.attr("slope"), att.attr("dropout", 0.0))
            out = Value(x.op, (fused,), x.kind, x.shape, x.attrs) if x is not att else fused
            folded.add(out)
            return out
        return None

    return _rewrite_after(outputs, fold, memo)


def _output_term(att: Value, x: Value, t: Value) -> Optional[str]:
    """What ``t`` added to ``x`` (``[reshape](att)``) is for the attention's store: "bias"
    (one weight row of the output's width, not sliced), "addend" (node rows shaped as
    ``x``), or None."""
    width = att.heads * att.dim
    if t.kind == WEIGHT:
        ok = not t.per and tuple(t.shape) == (width,) and tuple(x.shape) == (1, width)
        return "bias" if ok else None
    ok = t.kind == NODE and att.kind == NODE and tuple(t.shape) == tuple(x.shape)
    return "addend" if ok else None


def _fold_decision(term: str, had: Optional[Value]) -> Decision:
    what = "bias" if term == "bias" else "node-rows addend"
    if had is not None:
        return Decision(NAME, f"{what} add into attention (joins its "
                        f"{'bias' if had.kind == WEIGHT else 'addend'})", True,
                        "the kernel adds one term per row, A + b (a node linear plus a bias "
                        "row: the GEMM's bias epilogue stores it)")
    if term == "bias":
        return Decision(NAME, "bias add into attention", True,
                        "the attention kernel adds the bias row as it stores each output row "
                        "(no pass over the node rows)")
    return Decision(NAME, "node-rows addend add into attention", True,
                    "the attention kernel adds addend row i to output row i as it stores it "
                    "(no pass over the node rows); the backward keeps the addend, whose "
                    "gradient is the output's")
