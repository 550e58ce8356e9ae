"""Reverse-mode differentiation of the IR (Hector section 3.4).

``differentiate(forward_outputs)`` returns a backward IR made of the same operators: the
adjoint of a typed linear is a typed linear with the transposed weight (same row segments)
plus a segment-grouped outer product for the weight (``wgrad``); of a gather, a scatter by the
same endpoint and vice versa (so a source-side gradient is a traversal grouped by source, no
atomics in the plan); of the edge softmax, ``alpha * (g - sum_dst(alpha * g))``.  The backward
IR then runs through canonicalize / reorder / compact / fuse and the same lowering.

Gradient targets are the node inputs and the *weight roots* -- weight-only expressions a row
operator reads (a parameter, or e.g. ``W_r @ k`` after reordering).  Weight-only expressions
are tiny and are differentiated by torch autograd at run time (the executor chains the
gradient of a root to its parameters).

A fused ``attention`` (score, edge softmax and aggregation as one operator; the pipeline
fuses it before autodiff wherever its backward kernels apply,
``fuse_attention.fused_backward``) is differentiated as one operator too: ``attention_bwd``
gives every role's gradient from two traversals (by destination, by source) that recompute
the scores on chip from the forward's log-sum-exp, so the backward holds no per-edge tensor.

A ``cosine_qk`` (fusion's q, k and norm of AGNN's cosine score, ``fuse_cosine``) is
differentiated as one operator too: the gradients of its q and k outputs (read through
``pick``) give one ``cosine_qk_bwd``, x's and beta's gradients from one kernel.

``bind_saved`` decides what the backward reads from the forward: every forward value the
fused forward plan materialises becomes a ``saved`` leaf; values that fusion kept on chip
(edge softmax weights inside the attention kernel, say) are recomputed by the backward.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Sequence, Tuple

from .. import ir as N
from ..ir import EDGE, LEAVES, NODE, Op, Value, WEIGHT, toposort
from .common import Decision

NAME = "autodiff"


@dataclass(frozen=True)
class Backward:
    outputs: Tuple[Value, ...]            # one gradient per target
    targets: Tuple[Value, ...]            # forward inputs / weight roots
    grad_leaves: Tuple[Value, ...]        # incoming gradient leaf per forward output
    decisions: Tuple[Decision, ...] = ()
    saved_values: Tuple[Value, ...] = ()  # fused-forward values the backward reads
    saved_leaves: Tuple[Value, ...] = ()  # their leaves in the backward IR


def _unbroadcast(g: Value, a: Value) -> Value:
    """``g`` reduced to operand ``a``'s shape (rows) or slices (weights)."""
    if a.kind == WEIGHT:
        return N.wsum(g, a)
    return N.reduce_to(g, a.shape)


def _adjoints(v: Value, g: Value) -> List[Tuple[Value, Value]]:
    """(argument, gradient contribution) pairs of value ``v`` given its gradient ``g``."""
    op, a = v.op, v.args
    if op == Op.LINEAR:
        x, w = a
        dx = N.linear(g, N.wT(w), x.heads if len(w.shape) == 2 else None)
        # (a weight stored transposed: the gradient of the stored tensor, in its layout)
        return [(x, dx), (_stored(w), N.wgrad(x, g, w))]
    if op == Op.GATHER:
        return [(a[0], N.scatter(g, a[0].kind, v.attr("end"), "sum"))]
    if op == Op.SCATTER:
        back = N.gather if v.attr("reduce") == "sum" else N.gather_mean_grad
        return [(a[0], back(g, a[0].kind, v.attr("end")))]
    if op == Op.EDGE_SOFTMAX:
        ag = N.binary(Op.MUL, v, g)
        total = N.gather(N.scatter(ag, NODE, "dst", "sum"), EDGE, "dst")
        return [(a[0], N.binary(Op.MUL, v, N.binary(Op.SUB, g, total)))]
    if op == Op.DOT:
        return [(a[0], N.binary(Op.MUL, N.expand(g, a[1].shape), a[1])),
                (a[1], N.binary(Op.MUL, N.expand(g, a[0].shape), a[0]))]
    if op == Op.ADD:
        return [(a[0], _unbroadcast(g, a[0])), (a[1], _unbroadcast(g, a[1]))]
    if op == Op.SUB:
        return [(a[0], _unbroadcast(g, a[0])), (a[1], _unbroadcast(N.unary(Op.NEG, g), a[1]))]
    if op == Op.MUL:
        return [(a[0], _unbroadcast(N.binary(Op.MUL, g, a[1]), a[0])),
                (a[1], _unbroadcast(N.binary(Op.MUL, g, a[0]), a[1]))]
    if op == Op.NEG:
        return [(a[0], N.unary(Op.NEG, g))]
    if op == Op.SCALE:
        return [(a[0], N.unary(Op.SCALE, g, factor=v.attr("factor")))]
    if op == Op.EXP:
        return [(a[0], N.binary(Op.MUL, g, v))]
    if op == Op.SIGMOID:   # s (1 - s) = s - s s
        return [(a[0], N.binary(Op.MUL, g, N.binary(Op.SUB, v, N.binary(Op.MUL, v, v))))]
    if op == Op.TANH:
        return [(a[0], N.binary(Op.SUB, g, N.binary(Op.MUL, g, N.binary(Op.MUL, v, v))))]
    if op == Op.GELU:
        return [(a[0], N.binary(Op.MUL, g, N.unary(Op.GELU_GRAD, a[0])))]
    if op in (Op.RELU, Op.LEAKY_RELU):
        slope = v.attr("slope") if op == Op.LEAKY_RELU else 0.0
        return [(a[0], N.binary(Op.MUL, g, N.unary(Op.LEAKY_RELU_GRAD, a[0], slope=slope)))]
    if op == Op.HEAD_MEAN:
        return [(a[0], N.unary(Op.SCALE, N.expand(g, a[0].shape), factor=1.0 / a[0].heads))]
    if op == Op.RESHAPE:
        return [(a[0], N.reshape(g, a[0].heads))]
    if op in (Op.REDUCE_TO,):
        return [(a[0], N.expand(g, a[0].shape))]
    if op in (Op.EXPAND,):
        return [(a[0], N.reduce_to(g, a[0].shape))]
    if op == Op.COLS:
        return [(a[0], N.place((g,), (v.attr("start"),), a[0].shape))]
    if op == Op.PLACE:
        return [(p, N.cols(g, s, p.shape)) for p, s in zip(a, v.attr("starts"))]
    if op == Op.ATTENTION:
        return _attention_adjoints(v, g)
    if op == Op.NORMALIZE:
        return [(a[0], N.normalize_grad(g, a[0]))]
    if op == Op.DROPOUT:     # the same mask (same seed) on the gradient
        return [(a[0], Value(Op.DROPOUT, (g, a[1]), g.kind, g.shape, v.attrs))]
    raise NotImplementedError(f"autodiff: no adjoint for IR op {op!r}")


def _attention_adjoints(v: Value, g: Value) -> List[Tuple[Value, Value]]:
    """The fused attention's adjoint: its backward kernels (:func:`N.attention_bwd`) give
    every role's gradient at once; a per-relation prior ``p`` is folded into the keys there
    (``k' = k p_r``), so ``dk = dk' p_r`` and ``dp_r = sum over rows of relation r of
    <dk', k>``; an epilogue ``bias``'s gradient is the output gradient summed over rows (a
    weight row), or the output gradient itself (node rows: an addend)."""
    roles = N.attention_roles(v)
    needs = tuple(r for r, a in roles.items()
                  if r not in ("p", "bias", "seed", "k_norm") and a.op != Op.CONST)
    bwd = N.attention_bwd(v, g, N.attention_lse(v), needs)
    b = roles.get("bias")
    pairs = [] if b is None else [(b, _unbroadcast(N.reshape(g, 1), b)) if b.kind == WEIGHT
                                  else (b, g if g.shape == b.shape else N.reshape(g, b.heads))]
    for role in needs:
        d = N.pick(bwd, role)
        if role == "k" and "p" in roles:
            k, p = roles["k"], roles["p"]
            pairs += [(k, N.binary(Op.MUL, d, p)), (p, N.wsum(N.dot(d, k), p))]
        else:
            pairs.append((roles[role], d))
    return pairs


def _cosine_adjoints(c: Value, g: Dict[str, Value]) -> List[Tuple[Value, Value]]:
    """``cosine_qk`` node ``c``'s adjoint given its outputs' gradients ``g`` (role ->
    gradient; the norm carries none): one ``cosine_qk_bwd`` for x and beta."""
    x = c.args[0]
    zero = N.const(x.kind, x.shape, 0.0)
    b = N.cosine_qk_bwd(g.get("q", zero), g.get("k", zero), c)
    return [(x, N.pick(b, "x"))] + [(beta, N.pick(b, "beta")) for beta in c.args[1:]]


def _accumulate(prev: Value, contrib: Value) -> Value:
    """``prev + contrib`` for two gradient contributions; windows of one value placed apart
    (the gradients of a fused GEMM's column windows) merge into one ``place``, the concat of
    its pieces, instead of a sum of zero-padded rows."""
    if prev.op == contrib.op == Op.PLACE:
        pieces = prev.args + contrib.args
        starts = prev.attr("starts") + contrib.attr("starts")
        try:
            return N.place(pieces, starts, prev.shape)
        except ValueError:      # overlapping windows: a sum after all
            pass
    return N.binary(Op.ADD, prev, contrib)


def _stored(w: Value) -> Value:
    """The tensor a linear's weight ``w`` reads: ``s`` for ``wT(s)`` (declared
    ``stored="transposed"``), else ``w``."""
    return w.args[0] if w.op == Op.WT else w


def weight_roots(outputs: Sequence[Value]) -> List[Value]:
    """Weight-only expressions read by row operators (the weight-side gradient targets); a
    linear's transposed weight ``wT(s)`` counts as ``s``, whose gradient it forms."""
    roots = []
    for v in toposort(outputs):
        if v.kind != WEIGHT:        # (a dropout's seed is no weight: it has no gradient)
            roots.extend(r for i, a in enumerate(v.args) if a.kind == WEIGHT and a.op != Op.SEED
                         for r in [_stored(a) if v.op == Op.LINEAR and i == 1 else a]
                         if r not in roots)
    return roots


def differentiate(outputs: Sequence[Value]) -> Backward:
    order = toposort(outputs)
    grad_leaves = tuple(N.grad_input(o, i) for i, o in enumerate(outputs))
    grads: Dict[Value, Value] = {}
    for o, gl in zip(outputs, grad_leaves):
        grads[o] = N.binary(Op.ADD, grads[o], gl) if o in grads else gl
    roots = set(weight_roots(outputs))
    # a tuple-valued node's outputs' gradients by role (its picks come before it here)
    parts: Dict[Value, Dict[str, Value]] = {}
    for v in reversed(order):
        if v.op == Op.COSINE_QK and v in parts:
            pairs = _cosine_adjoints(v, parts[v])
        elif v not in grads or v.op in LEAVES or v in roots:
            continue
        elif v.op == Op.PICK:
            parts.setdefault(v.args[0], {})[v.attr("role")] = grads[v]
            continue
        else:
            pairs = _adjoints(v, grads[v])
        for arg, contrib in pairs:
            if arg.op in (Op.CONST, Op.HAS_EDGES) or (arg.kind == WEIGHT
                                                       and arg not in roots):
                continue
            grads[arg] = _accumulate(grads[arg], contrib) if arg in grads else contrib
    targets = [v for v in order if v.op == Op.INPUT] + [r for r in weight_roots(outputs)]
    targets = [t for t in targets if t in grads]
    decisions = [Decision(NAME, f"gradient of {t.op} {t.attr('name') or ''}".strip(), True,
                          "reverse-mode over the IR") for t in targets]
    return Backward(tuple(grads[t] for t in targets), tuple(targets), grad_leaves,
                    tuple(decisions))


def bind_saved(bwd: Backward, forward: Sequence[Value], materialised: Dict[Value, Value]) -> Backward:
    """Replace forward values the fused forward plan materialises (``materialised``: unfused
    value -> the plan value holding it; leaves map to themselves) with ``saved`` leaves.  An
    attention's log-sum-exp is a forward value too (its kernel's second output), and so is
    each output of a tuple-valued forward node (a cosine_qk's norm, read or not).  Values
    :func:`recomputed` picks are rebuilt from the inputs in the backward instead of kept."""
    fwd_set = set(toposort(forward))
    fwd_set.update(k for k in materialised if k.op in (Op.ATTENTION_LSE, Op.PICK))
    again = recomputed(bwd.outputs, fwd_set & set(materialised))
    memo: Dict[Value, Value] = {}
    saved_values: List[Value] = []
    saved_leaves: List[Value] = []

    def sub(v: Value) -> Value:
        if v in memo:
            return memo[v]
        rebuilt = v in again or (rebuilding and v.op not in LEAVES and v.kind != WEIGHT)
        if v in fwd_set and v in materialised and not rebuilt:
            key = len(saved_values)
            saved_values.append(materialised[v])
            leaf = N.saved(v, key)
            saved_leaves.append(leaf)
            memo[v] = leaf
            return leaf
        if v in again:
            rebuilding.append(v)     # its row-valued arguments are rebuilt too, not kept
        args = tuple(sub(a) for a in v.args)
        if v in again:
            rebuilding.pop()
        memo[v] = v if args == v.args else Value(v.op, args, v.kind, v.shape, v.attrs)
        return memo[v]

    rebuilding: List[Value] = []
    outs = tuple(sub(o) for o in bwd.outputs)
    decisions = tuple(Decision(NAME, f"{v.op} {v.kind}{list(v.shape)} recomputed in the backward",
                               True, "read only by weight gradients and one typed linear from "
                               "the inputs: rebuilt after the attention backward's peak "
                               "instead of kept from the forward") for v in again)
    return replace(bwd, outputs=outs, saved_values=tuple(saved_values),
                   saved_leaves=tuple(saved_leaves), decisions=bwd.decisions + decisions)


def recomputed(outputs: Sequence[Value], kept: set) -> List[Value]:
    """Forward row values (of ``kept``: those the forward plan materialises) the backward
    ``outputs`` rebuild rather than keep: those read only as a weight gradient's input rows
    (directly, or gathered: the GEMM reads them in place) and made by at most one typed
    linear of an input plus elementwise terms with weights (HGT's ``K_tau x + b``): a
    node-sized GEMM in the backward instead of a node-sized tensor held from the forward
    through the backward's peak (the weight gradients run after it)."""
    readers: Dict[Value, List[Tuple[Value, int]]] = {}
    seen, stack = set(), list(outputs)
    while stack:            # the backward as it will read: kept values are leaves
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in kept:
            continue
        for i, a in enumerate(v.args):
            readers.setdefault(a, []).append((v, i))
            stack.append(a)

    def wgrad_input(v: Value) -> bool:
        rs = readers.get(v, [])
        return bool(rs) and all(
            (r.op == Op.WGRAD and i == 0) or (r.op == Op.GATHER and r.kind != EDGE and
                                             wgrad_input(r)) for r, i in rs)
    return [v for v in toposort(list(outputs)) if v in kept and v.kind == NODE
            and v.op not in LEAVES and wgrad_input(v) and _one_linear_from_inputs(v)]


def _one_linear_from_inputs(v: Value) -> bool:
    if v.kind == WEIGHT or v.op == Op.INPUT:
        return True
    if v.op == Op.LINEAR:     # of an input itself: so at most one linear on any path
        return v.args[0].op == Op.INPUT and v.args[1].kind == WEIGHT
    if v.op in (Op.ADD, Op.SUB, Op.MUL, Op.RESHAPE):
        return all(_one_linear_from_inputs(a) for a in v.args)
    return False
