"""Fusion's cosine rule: AGNN's score inputs ``k = normalize(x)`` and ``q = k * beta``
(``beta`` a one-element shared weight, or ``q = k`` itself), read by nothing but one
attention's q and k roles, become one ``cosine_qk`` operator: q, k and each row's norm from
one pass over x's rows (the ``hector::cosine_qk`` kernel) instead of a norm, a division and a
product.  Where the attention's v is that same x on node rows, the attention also takes the
norm (its ``k_norm`` role): its kernels then form each key from the v row they gather per
edge anyway, one row gathered per edge instead of two.  Autodiff differentiates the operator
as one as well (``ir.cosine_qk_bwd``: dx and dbeta from one pass), so the rule runs where the
forward's attentions are formed and where autodiff's are (``fuse.attention_for_autodiff``)."""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from .. import ir as N
from ..ir import NODE, Op, Value, WEIGHT, toposort
from ..lower import attention_spec
from .common import Decision
from .fuse_rewrite import NAME, _rewrite_after

WHAT = "normalize + beta product -> cosine_qk"


def _beta(q: Value, k: Value) -> Tuple[Optional[Value], str]:
    """(beta, "") when ``q`` is ``k`` times a one-element shared weight (None: ``q`` is
    ``k``), else (None, why not)."""
    if q == k:
        return None, ""
    if q.op != Op.MUL or k not in q.args:
        return None, f"q is {q.op}, neither k nor k times a weight"
    w = q.args[1] if q.args[0] == k else q.args[0]
    if w.kind != WEIGHT or w.per is not None or tuple(w.shape) != (1,):
        return None, (f"q is k times {w.op} {w.kind}{list(w.shape)}"
                      + (f" per {w.per}" if w.per else "") + ", not a one-element shared weight")
    return w, ""


def _on_nodes(att: Value) -> bool:
    """Whether attention ``att`` runs on the graph itself with every term per node (what a
    ``k_norm`` indexed by node needs: no derived graph, no keys folded per compact row)."""
    rows = attention_spec(att, None)[1]
    return (rows.graph == "graph" and rows.source == NODE and not rows.score_on_edges
            and not rows.dst_edge)


def match_cosine(att: Value, readers: Dict[Value, Set[Value]],
                 outputs: Set[Value]) -> Tuple[Optional[Value], str]:
    """``att`` with its q and k made by one ``cosine_qk`` (and its ``k_norm`` role where v
    is the normalised x), or (None, why not); (None, "") when its k is no ``normalize``."""
    roles = N.attention_roles(att)
    k, q = roles.get("k"), roles.get("q")
    if k is None or k.op != Op.NORMALIZE:
        return None, ""
    x = k.args[0]
    beta, why = _beta(q, k)
    if why:
        return None, why
    if x.heads != 1:
        return None, f"{x.heads} heads: the cosine_qk kernel normalises one row per node"
    mine = {att} if beta is None else {att, q}
    # (the attention itself may read them in another role too: an addend folded into its
    # store, ``fuse_attention._fold_bias``)
    also = {r for r, a in roles.items() if a == k and r not in ("k", "q")}
    if k in outputs or not readers[k] <= mine or also:
        return None, "normalize(x) is read beside the attention's q and k"
    also = {r for r, a in roles.items() if a == q and r != "q"}
    if beta is not None and (q in outputs or readers[q] != {att} or also):
        return None, "q is read beside the attention"
    c = N.cosine_qk(x, beta)
    new = dict(roles, q=N.pick(c, "q"), k=N.pick(c, "k"))
    if roles["v"] == x and "k_norm" not in roles:
        normed = dict(new, k_norm=N.pick(c, "norm"))
        candidate = N.attention(normed, att.shape, att.attr("scale"), att.attr("slope"),
                                att.attr("dropout", 0.0))
        if _on_nodes(candidate):
            return candidate, ""
    return N.attention(new, att.shape, att.attr("scale"), att.attr("slope"),
                       att.attr("dropout", 0.0)), ""


def fuse_cosine(outputs, memo: Dict[Value, Value], decisions: List[Decision],
                pass_name: str = NAME):
    """``outputs`` with every attention :func:`match_cosine` accepts rewritten so (``memo``,
    original value -> replacement of an earlier rewrite, updated to the new values); each
    attention whose k is a ``normalize`` logs its decision under ``pass_name`` (autodiff's
    logs the accepted ones only: the forward's ``fuse`` said why the others were not)."""
    readers: Dict[Value, Set[Value]] = {}
    for v in toposort(outputs):
        for a in v.args:
            readers.setdefault(a, set()).add(v)
    is_output = set(outputs)

    def rule(orig: Value, new: Value, _memo) -> Optional[Value]:
        if orig.op != Op.ATTENTION:
            return None
        found, why = match_cosine(orig, readers, is_output)
        if found is None:
            if why and pass_name == NAME:
                decisions.append(Decision(NAME, WHAT, False, why))
            return None
        normed = "k_norm" in found.attr("roles")
        if pass_name == NAME:
            decisions.append(Decision(NAME, WHAT, True, (
                "one kernel writes q, k and each row's norm (hector::cosine_qk)"
                + ("; the attention forms each key from the v row it gathers (v is x): one "
                   "row read per edge instead of two" if normed else ""))))
        else:
            c = N.attention_roles(found)["q"].args[0]        # (q is a pick of the cosine)
            grads = "dx and dbeta" if len(c.args) > 1 else "dx"
            decisions.append(Decision(pass_name, "cosine_qk backward as one operator", True,
                                      f"one kernel (hector::cosine_qk_backward): {grads} from "
                                      "dq, dk, x and the saved norm"))
        # (found is built from the graph as it was; rebuild it on the rewritten arguments)
        return Value(found.op, tuple(_rebuilt(a, _memo) for a in found.args), found.kind,
                     found.shape, found.attrs)

    return _rewrite_after(outputs, rule, memo)


def _rebuilt(v: Value, memo: Dict[Value, Value]) -> Value:
    """``v`` (a value of the graph before the rewrite, or a new one built on such values)
    on the rewritten values: ``memo`` maps the old ones to theirs."""
    if v in memo:
        return memo[v]
    args = tuple(_rebuilt(a, memo) for a in v.args)
    return v if args == v.args else Value(v.op, args, v.kind, v.shape, v.attrs)
