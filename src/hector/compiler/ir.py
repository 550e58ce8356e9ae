"""The inter-operator IR: one generic node type, :class:`Value`, in the tinygrad style.

A ``Value`` is a frozen dataclass with tuple children, so structurally equal expressions are
equal and hash alike: common subexpressions collapse for free, and golden pass tests compare
trees with ``==``.

Every value has a *kind* saying which rows it has:

* ``node``        one row per node (weights of a typed linear picked by the row's node type),
* ``edge``        one row per edge, in the graph's canonical (relation, dst) order,
* ``compact_src`` one row per unique (src, relation) pair (``graph.compact_src``),
* ``compact_dst`` one row per unique (dst, relation) pair (``graph.compact_dst``),
* ``weight``      a parameter, optionally sliced by relation or node type (attr ``per``).

Row values hold ``[rows, heads, features]`` tensors and ``shape == (heads, features)``; a
weight's ``shape`` is the shape of one slice (``(K, N)`` for a dense typed linear,
``(H, K, N)`` for a per-head one, ``(h, d)`` or ``(n,)`` for an elementwise operand).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple

NODE, EDGE, CSRC, CDST, WEIGHT = "node", "edge", "compact_src", "compact_dst", "weight"
ROW_KINDS = (NODE, EDGE, CSRC, CDST)
PER = (None, "relation", "node_type")

#: Row kinds whose rows carry a relation (so per-relation weights can be picked per row).
RELATION_ROWS = (EDGE, CSRC, CDST)

#: (from kind, to kind) -> endpoint of a gather; a scatter is the reverse move.
MOVES = {(NODE, EDGE): ("src", "dst"), (NODE, CSRC): ("src",), (NODE, CDST): ("dst",),
         (CSRC, EDGE): ("src",), (CDST, EDGE): ("dst",)}



class Op:
    """The IR's operator names: every module compares ``Value.op`` with these constants, never
    with a bare string (the strings are what the printer shows)."""
    # leaves
    INPUT, PARAM, CONST = "input", "param", "const"
    SAVED, GRAD_OUTPUT = "saved", "grad_output"     # leaves of a backward IR
    SEED = "seed"          # the dropout seed a training call draws (one per program)
    HAS_EDGES = "has_edges"  # per node: 1 where it has an incoming edge, else 0 (graph data)
    ARG = "arg"                                     # a kernel body's i-th input
    # row operators
    LINEAR, GATHER, SCATTER = "linear", "gather", "scatter"
    EDGE_SOFTMAX, DOT, HEAD_MEAN, RESHAPE = "edge_softmax", "dot", "head_mean", "reshape"
    REDUCE_TO, EXPAND = "reduce_to", "expand"        # broadcasting and its adjoint
    ADD, SUB, MUL = "add", "sub", "mul"
    NEG, EXP, SIGMOID, TANH, GELU, RELU = "neg", "exp", "sigmoid", "tanh", "gelu", "relu"
    LEAKY_RELU, SCALE = "leaky_relu", "scale"
    DROPOUT = "dropout"    # edge values zeroed by a hash of (seed, edge, head), others / (1-p)
    # each row's features per head over their L2 norm (at least eps), and its derivative
    NORMALIZE, NORMALIZE_GRAD = "normalize", "normalize_grad"
    LEAKY_RELU_GRAD, GELU_GRAD = "leaky_relu_grad", "gelu_grad"   # derivatives for autodiff
    # weight operators
    WMUL, WCOMBINE, BLOCKDIAG, WT, WGRAD, WSUM = ("wmul", "wcombine", "blockdiag", "wT",
                                                  "wgrad", "wsum")
    WSCALE = "wscale"
    WSRC = "wsrc"          # a per-node-type weight re-sliced per relation by its source type
    WCAT = "wcat"          # weights side by side along their output columns
    WHEADS = "wheads"      # per-head weights stacked along their head axis
    WCOLS = "wcols"        # a window of a weight's output columns (the inverse)
    WBLOCKS = "wblocks"    # per-head column weights as one block-diagonal matrix
    # horizontal fusion (siblings pass): one GEMM's output read as column windows, and the
    # adjoint, windows placed side by side
    COLS, PLACE = "cols", "place"
    # made by fusion
    ATTENTION, KERNEL = "attention", "kernel"
    # the fused attention's backward (made by autodiff of an ``attention`` node)
    ATTENTION_LSE = "attention_lse"     # the forward's per-destination log-sum-exp
    ATTENTION_BWD, PICK = "attention_bwd", "pick"   # every role's gradient; one of them
    # AGNN's score inputs as one operator (q, k and each row's norm: made by fusion) and its
    # backward (the gradients of x and beta: made by autodiff); read through ``pick`` too
    COSINE_QK, COSINE_QK_BWD = "cosine_qk", "cosine_qk_bwd"


UNARY = (Op.NEG, Op.EXP, Op.SIGMOID, Op.TANH, Op.GELU, Op.RELU, Op.LEAKY_RELU, Op.SCALE,
         Op.LEAKY_RELU_GRAD, Op.GELU_GRAD)
BINARY = (Op.ADD, Op.SUB, Op.MUL)
WEIGHT_OPS = (Op.PARAM, Op.WMUL, Op.WCOMBINE, Op.BLOCKDIAG, Op.WT, Op.WSCALE, Op.WSRC,
              Op.WCAT, Op.WHEADS, Op.WCOLS, Op.WBLOCKS)
#: Values with no computation of their own: passes leave them alone, lowering makes no step.
LEAVES = (Op.INPUT, Op.PARAM, Op.CONST, Op.SAVED, Op.GRAD_OUTPUT, Op.ARG, Op.SEED,
          Op.HAS_EDGES)
#: The score terms a fused ``attention`` node can read, in the order its arguments hold them.
ATTENTION_ROLES = ("v", "q", "k", "a_src", "a_dst", "p", "bias", "seed", "k_norm")


@dataclass(frozen=True)
class Value:
    op: str
    args: Tuple["Value", ...] = ()
    kind: str = NODE
    shape: Tuple[int, ...] = (1, 1)
    attrs: Tuple[Tuple[str, Any], ...] = ()
    _hash: int = field(default=0, compare=False, repr=False)

    def __post_init__(self):
        # Hash once: passes memoise on values, and a recursive hash per lookup is quadratic.
        object.__setattr__(self, "_hash", hash((self.op, self.args, self.kind, self.shape,
                                                self.attrs)))

    def __hash__(self) -> int:
        return self._hash

    def attr(self, key: str, default=None):
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def with_attrs(self, **kw) -> "Value":
        d = dict(self.attrs)
        d.update(kw)
        return Value(self.op, self.args, self.kind, self.shape, tuple(sorted(d.items())))

    @property
    def heads(self) -> int:
        return self.shape[0]

    @property
    def dim(self) -> int:
        return self.shape[-1]

    @property
    def per(self) -> Optional[str]:
        return self.attr("per")

    def __repr__(self) -> str:  # the printer gives the full listing; this stays short
        return f"Value({self.op}, {self.kind}{list(self.shape)})"


def _attrs(**kw) -> Tuple[Tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in kw.items() if v is not None))


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


# -- leaves -------------------------------------------------------------------------------
def input_(name: str, dim: int, heads: int = 1) -> Value:
    return Value(Op.INPUT, (), NODE, (heads, dim), _attrs(name=name))


def param(name: str, shape: Tuple[int, ...], per: Optional[str] = None) -> Value:
    _need(per in PER, f"weight {name!r}: per must be one of {PER}, got {per!r}")
    _need(all(isinstance(s, int) and s > 0 for s in shape),
          f"weight {name!r}: shape must be positive ints, got {shape}")
    return Value(Op.PARAM, (), WEIGHT, tuple(shape), _attrs(name=name, per=per))


def seed() -> Value:
    """The dropout seed leaf: a one-element int64 device tensor that a training call draws
    (``attention.op.draw_seed``) and its backward reads again (no gradient)."""
    return Value(Op.SEED, (), WEIGHT, (1,))


def dropout(x: Value, p: float) -> Value:
    """``x`` with each (edge, head) zeroed with probability ``p`` and the rest scaled by
    ``1 / (1 - p)``: the keep-mask is a hash of (seed, canonical edge id, head)
    (``kernels.attention.reference.dropout_keep``), so both backends and the backward draw
    the same one without storing it."""
    _need(x.kind == EDGE, f"dropout: only edge values (the mask is per edge and head), got "
          f"{x.kind}")
    _need(isinstance(p, float) and 0.0 < p < 1.0, f"dropout: p must be in (0, 1), got {p!r}")
    return Value(Op.DROPOUT, (x, seed()), EDGE, x.shape, _attrs(p=p))


def saved(v: Value, key: int) -> Value:
    """A forward value read by a backward IR (a leaf there: passes do not look inside)."""
    return Value(Op.SAVED, (), v.kind, v.shape, _attrs(key=key, per=v.per))


def grad_input(v: Value, key: int) -> Value:
    """The incoming gradient of the ``key``-th forward output ``v`` (a leaf of the backward
    IR)."""
    return Value(Op.GRAD_OUTPUT, (), v.kind, v.shape, _attrs(key=key))


def arg(i: int, like: Value) -> Value:
    """Placeholder for a kernel's ``i``-th input inside its body."""
    return Value(Op.ARG, (), like.kind, like.shape, (("index", i), ("per", like.per)))


# -- row operators ------------------------------------------------------------------------
def linear(x: Value, w: Value, heads: Optional[int] = None) -> Value:
    """Typed linear: ``x_row @ W[type(row)]``; dense ``(K, N)`` weights act on the flattened
    ``heads * features`` row and split the result into ``heads``; per-head ``(H, K, N)``
    weights act head by head."""
    _need(x.kind in ROW_KINDS, f"linear: input must be row-wise, got {x.kind}")
    _need(w.kind == WEIGHT, f"linear: weight must be a weight, got {x.kind}")
    if w.per == "relation":
        _need(x.kind in RELATION_ROWS, f"linear: a per-relation weight needs edge or compact "
              f"rows, got {x.kind} rows")
    if w.per == "node_type":
        _need(x.kind == NODE, f"linear: a per-node-type weight needs node rows, got {x.kind}")
    if len(w.shape) == 3:
        _need(w.shape[0] == x.heads and w.shape[1] == x.dim,
              f"linear: per-head weight {w.shape} does not fit input {x.shape}")
        return Value(Op.LINEAR, (x, w), x.kind, (x.heads, w.shape[2]))
    _need(len(w.shape) == 2 and w.shape[0] == x.heads * x.dim,
          f"linear: weight {w.shape} does not fit input {x.shape} (K = heads * features)")
    heads = heads or 1
    _need(w.shape[1] % heads == 0, f"linear: output width {w.shape[1]} not divisible by heads {heads}")
    return Value(Op.LINEAR, (x, w), x.kind, (heads, w.shape[1] // heads), _attrs(heads=heads))


def gather(x: Value, to: str, end: str) -> Value:
    _need((x.kind, to) in MOVES and end in MOVES[(x.kind, to)],
          f"gather: cannot move {x.kind} rows to {to} rows by {end}")
    return Value(Op.GATHER, (x,), to, x.shape, _attrs(end=end, norm=None))


def gather_mean_grad(x: Value, to: str, end: str) -> Value:
    """``x[row(e)] / count(row(e))``: the adjoint of a mean scatter."""
    return Value(Op.GATHER, (x,), to, x.shape, _attrs(end=end, norm="mean"))


def scatter(x: Value, to: str, end: str, reduce: str = "sum") -> Value:
    _need((to, x.kind) in MOVES and end in MOVES[(to, x.kind)],
          f"scatter: cannot move {x.kind} rows to {to} rows by {end}")
    _need(reduce in ("sum", "mean"), f"scatter: reduce must be 'sum' or 'mean', got {reduce!r}")
    return Value(Op.SCATTER, (x,), to, x.shape, _attrs(end=end, reduce=reduce))


def edge_softmax(s: Value) -> Value:
    _need(s.kind == EDGE, f"edge_softmax: scores must be edge-wise, got {s.kind}")
    return Value(Op.EDGE_SOFTMAX, (s,), EDGE, s.shape)


def dot(a: Value, b: Value) -> Value:
    _need(a.kind == b.kind and a.kind in ROW_KINDS, f"dot: kinds differ ({a.kind}, {b.kind})")
    _need(a.shape == b.shape, f"dot: shapes differ ({a.shape}, {b.shape})")
    return Value(Op.DOT, (a, b), a.kind, (a.heads, 1))


def _operand_shape(v: Value) -> Tuple[int, int]:
    if v.kind == WEIGHT:
        _need(len(v.shape) in (1, 2), f"elementwise weight operand must be 1-D or 2-D, got {v.shape}")
        return (1, v.shape[0]) if len(v.shape) == 1 else v.shape
    return v.shape


def broadcast(a: Tuple[int, int], b: Tuple[int, int]) -> Tuple[int, int]:
    out = []
    for x, y in zip(a, b):
        _need(x == y or 1 in (x, y), f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


def binary(op: str, a: Value, b: Value) -> Value:
    _need(op in BINARY, f"unknown binary op {op!r}")
    if a.kind == WEIGHT and b.kind == WEIGHT:
        _need(a.shape == b.shape and (a.per == b.per or None in (a.per, b.per)),
              f"{op}: weight operands {a.shape}/{a.per} and {b.shape}/{b.per} do not match")
        return Value(op, (a, b), WEIGHT, a.shape, _attrs(per=a.per or b.per))
    rows = a if a.kind != WEIGHT else b
    for w in (a, b):
        if w.kind == WEIGHT and w.per == "relation":
            _need(rows.kind in RELATION_ROWS, f"{op}: per-relation operand on {rows.kind} rows")
        if w.kind == WEIGHT and w.per == "node_type":
            _need(rows.kind == NODE, f"{op}: per-node-type operand on {rows.kind} rows")
    if a.kind != WEIGHT and b.kind != WEIGHT:
        _need(a.kind == b.kind, f"{op}: row kinds differ ({a.kind}, {b.kind}); gather first")
    return Value(op, (a, b), rows.kind, broadcast(_operand_shape(a), _operand_shape(b)))


def unary(op: str, x: Value, **attrs) -> Value:
    _need(op in UNARY, f"unknown unary op {op!r}")
    return Value(op, (x,), x.kind, x.shape, _attrs(per=x.per, **attrs) if x.kind == WEIGHT
                 else _attrs(**attrs))


#: The smallest norm ``normalize`` divides by (``torch.nn.functional.normalize``'s default).
NORMALIZE_EPS = 1e-12


def normalize(x: Value) -> Value:
    """``x / max(||x||, eps)`` per row and head, the norm over the features."""
    _need(x.kind in ROW_KINDS, f"normalize: row values only, got {x.kind}")
    return Value(Op.NORMALIZE, (x,), x.kind, x.shape)


def normalize_grad(g: Value, x: Value) -> Value:
    """The gradient of :func:`normalize` at ``x`` given its output's gradient ``g``:
    ``(g - y <g, y>) / ||x||`` with ``y = normalize(x)`` (``g / eps`` where ``||x|| <= eps``)."""
    _need(g.kind == x.kind and g.shape == x.shape, "normalize_grad: g and x must match")
    return Value(Op.NORMALIZE_GRAD, (g, x), x.kind, x.shape)


def head_mean(x: Value) -> Value:
    return Value(Op.HEAD_MEAN, (x,), x.kind, (1, x.dim))


def reshape(x: Value, heads: int) -> Value:
    width = x.heads * x.dim
    _need(width % heads == 0, f"reshape: {width} features do not split into {heads} heads")
    return Value(Op.RESHAPE, (x,), x.kind, (heads, width // heads))


def cols(x: Value, start: int, shape: Tuple[int, int]) -> Value:
    """Columns ``[start, start + h * d)`` of ``x``'s flattened rows, as ``(h, d)`` rows: a view
    (the rows keep ``x``'s row stride).  What one GEMM computing several linears' outputs
    side by side gives each of them (:mod:`~hector.compiler.passes.siblings`)."""
    width = shape[0] * shape[1]
    _need(x.kind in ROW_KINDS, f"cols: input must be row-wise, got {x.kind}")
    _need(isinstance(start, int) and 0 <= start and start + width <= x.heads * x.dim,
          f"cols: columns [{start}, {start + width}) are not inside {x.heads * x.dim}")
    return Value(Op.COLS, (x,), x.kind, tuple(shape), _attrs(start=start))


def place(pieces: Sequence[Value], starts: Sequence[int], shape: Tuple[int, int]) -> Value:
    """Rows of ``shape`` holding each piece's flattened row at its column ``starts[i]`` and
    zeros elsewhere (the adjoint of :func:`cols`; pieces that tile the row make a concat)."""
    _need(len(pieces) == len(starts) and pieces, "place: one start per piece, at least one")
    kinds = {p.kind for p in pieces}
    _need(len(kinds) == 1 and kinds <= set(ROW_KINDS), f"place: pieces on rows {sorted(kinds)}")
    spans = sorted((s, s + p.heads * p.dim) for p, s in zip(pieces, starts))
    _need(all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) and spans[0][0] >= 0
          and spans[-1][1] <= shape[0] * shape[1], f"place: pieces at {list(starts)} overlap "
          f"or leave the row of {shape[0] * shape[1]} columns")
    order = sorted(range(len(pieces)), key=lambda i: starts[i])
    return Value(Op.PLACE, tuple(pieces[i] for i in order), pieces[0].kind, tuple(shape),
                 (("starts", tuple(starts[i] for i in order)),))


def place_tiles(p: Value) -> bool:
    """Whether ``place`` ``p``'s pieces fill its row end to end (then it is their concat)."""
    starts = p.attr("starts")
    ends = [s + a.heads * a.dim for a, s in zip(p.args, starts)]
    return starts[0] == 0 and ends[-1] == p.heads * p.dim and list(starts[1:]) == ends[:-1]


def expand(x: Value, shape: Tuple[int, int]) -> Value:
    """Broadcast ``x`` up to ``shape`` (the adjoint of :func:`reduce_to`)."""
    return x if x.shape == tuple(shape) else Value(Op.EXPAND, (x,), x.kind, tuple(shape))


def reduce_to(x: Value, shape: Tuple[int, int]) -> Value:
    """Sum the broadcast axes of ``x`` down to ``shape`` (the adjoint of broadcasting)."""
    return x if x.shape == tuple(shape) else Value(Op.REDUCE_TO, (x,), x.kind, tuple(shape))


# -- weight operators (tiny: computed once per call, never per row) -------------------------
def wmul(a: Value, b: Value) -> Value:
    """Weight-weight product ``A @ B`` (batched over the slicing of either operand); a 1-D
    ``a`` (a bias row) gives the row ``a @ B``; a per-head ``b`` ``(H, k, n)`` acts as its
    block-diagonal ``(H k, H n)`` matrix (never built)."""
    _need(a.kind == WEIGHT and b.kind == WEIGHT, "wmul: operands must be weights")
    k, n = (b.shape[0] * b.shape[1], b.shape[0] * b.shape[2]) if len(b.shape) == 3 else \
        (b.shape[0], b.shape[-1])
    _need(len(a.shape) in (1, 2) and len(b.shape) in (2, 3) and a.shape[-1] == k,
          f"wmul: {a.shape} @ {b.shape} does not fit")
    _need(a.per == b.per or None in (a.per, b.per), f"wmul: slicings {a.per} and {b.per} differ")
    return Value(Op.WMUL, (a, b), WEIGHT, a.shape[:-1] + (n,), _attrs(per=a.per or b.per))


def wsrc(w: Value) -> Value:
    """A per-node-type weight sliced per relation instead: relation ``r``'s slice is the
    slice of ``r``'s source node type (valid only on graphs whose relations each leave nodes
    of one type: ``GraphStats.typed_sources``).  HGT's ``K_tau`` folded into its ``W_r``."""
    _need(w.kind == WEIGHT and w.per == "node_type",
          f"wsrc: the weight must be sliced per node type, got per={w.per!r}")
    return Value(Op.WSRC, (w,), WEIGHT, w.shape, _attrs(per="relation"))


def wcat(ws: Sequence[Value], rows: bool = False) -> Value:
    """Weights side by side along their last (output) axis, sliced alike: ``(K, N_i) ->
    (K, sum N_i)`` for matrices, ``(N_i,) -> (sum N_i,)`` for bias rows; ``rows``: matrices
    stacked along their first axis instead, ``(N_i, K) -> (sum N_i, K)`` (weights stored
    transposed: ``wT(wcat(S_i, rows=True))`` is ``wcat(wT(S_i))`` in the layout they are
    stored in)."""
    _need(len(ws) >= 2 and all(w.kind == WEIGHT for w in ws), "wcat: two or more weights")
    _need(len({w.per for w in ws}) == 1, f"wcat: slicings {[w.per for w in ws]} differ")
    _need(len(ws[0].shape) in (1, 2) and not (rows and len(ws[0].shape) != 2),
          f"wcat: shapes {[w.shape for w in ws]} do not stand side by side")
    if rows:
        _need(len({w.shape[1:] for w in ws}) == 1, f"wcat: shapes {[w.shape for w in ws]} "
              "do not stack")
        shape = (sum(w.shape[0] for w in ws),) + ws[0].shape[1:]
        return Value(Op.WCAT, tuple(ws), WEIGHT, shape, _attrs(per=ws[0].per, rows=True))
    _need(len({w.shape[:-1] for w in ws}) == 1,
          f"wcat: shapes {[w.shape for w in ws]} do not stand side by side")
    shape = ws[0].shape[:-1] + (sum(w.shape[-1] for w in ws),)
    return Value(Op.WCAT, tuple(ws), WEIGHT, shape, _attrs(per=ws[0].per))


def wheads(ws: Sequence[Value]) -> Value:
    """Per-head weights ``(H_i, k, n)`` stacked along the head axis, sliced alike: ``(sum
    H_i, k, n)``, the block-diagonal matrix of all their heads in order (what multiplies a
    :func:`wcat` of per-head inputs, head block by head block)."""
    _need(len(ws) >= 2 and all(w.kind == WEIGHT and len(w.shape) == 3 for w in ws),
          "wheads: two or more per-head weights")
    _need(len({w.per for w in ws}) == 1, f"wheads: slicings {[w.per for w in ws]} differ")
    _need(len({w.shape[1:] for w in ws}) == 1,
          f"wheads: head shapes {[w.shape for w in ws]} differ")
    shape = (sum(w.shape[0] for w in ws),) + ws[0].shape[1:]
    return Value(Op.WHEADS, tuple(ws), WEIGHT, shape, _attrs(per=ws[0].per))


def wcols(w: Value, start: int, n: int) -> Value:
    """Output columns ``[start, start + n)`` of weight ``w`` (a window of a :func:`wcat`)."""
    _need(w.kind == WEIGHT and 0 <= start and n > 0 and start + n <= w.shape[-1],
          f"wcols: columns [{start}, {start + n}) are not inside {w.shape}")
    return Value(Op.WCOLS, (w,), WEIGHT, w.shape[:-1] + (n,), _attrs(per=w.per, start=start))


def wblocks(ws: Sequence[Value]) -> Value:
    """Per-head column weights ``A_i (H, C, 1)`` as one dense ``(H C, k H)`` matrix: column
    ``i H + h`` holds ``A_i``'s head ``h`` in rows ``h C .. h C + C - 1``, zeros elsewhere
    (one head: the columns side by side).  The flattened ``[rows, H C]`` input times it gives
    every ``<z_h, A_i[h]>`` at once, ``A_i``'s terms in columns ``[i H, (i + 1) H)``
    (GAT's two score products as one)."""
    _need(len(ws) >= 1 and all(w.kind == WEIGHT and len(w.shape) == 3 and w.shape[2] == 1
                               for w in ws), "wblocks: per-head weights of one column each")
    _need(all(w.per is None for w in ws), "wblocks: weights shared by every row (not sliced)")
    _need(len({w.shape for w in ws}) == 1, f"wblocks: shapes {[w.shape for w in ws]} differ")
    H, C, _ = ws[0].shape
    return Value(Op.WBLOCKS, tuple(ws), WEIGHT, (H * C, len(ws) * H))


def wcombine(comp: Value, basis: Value) -> Value:
    """Basis decomposition ``W_r = sum_b comp[r, b] V_b``."""
    _need(comp.per is not None and len(comp.shape) == 1, "wcombine: comp must be sliced, (B,)")
    _need(basis.per is None and len(basis.shape) >= 2 and basis.shape[0] == comp.shape[0],
          f"wcombine: basis {basis.shape} does not fit comp {comp.shape}")
    return Value(Op.WCOMBINE, (comp, basis), WEIGHT, basis.shape[1:], _attrs(per=comp.per))


def blockdiag(w: Value) -> Value:
    """Block-diagonal weight ``(nb, k, n) -> (nb*k, nb*n)`` (RGCN's num_blocks)."""
    _need(len(w.shape) == 3, f"blockdiag: weight must be (blocks, k, n), got {w.shape}")
    nb, k, n = w.shape
    return Value(Op.BLOCKDIAG, (w,), WEIGHT, (nb * k, nb * n), _attrs(per=w.per))


def wscale(w: Value, s: Value) -> Value:
    """A per-head weight ``(H, K, N)`` whose head ``h`` matrix is scaled by ``s[h]`` (``s``
    ``(H, 1)``, sliced like ``w`` or not at all): HGT's relation prior folded into the key
    weights, ``<q, x W_r> p_r = <q, x (W_r p_r)>``."""
    _need(len(w.shape) == 3 and s.shape == (w.shape[0], 1),
          f"wscale: scale {s.shape} does not fit a per-head weight {w.shape}")
    _need(s.per in (None, w.per), f"wscale: scale sliced by {s.per}, weight by {w.per}")
    return Value(Op.WSCALE, (w, s), WEIGHT, w.shape, _attrs(per=w.per))


def wT(w: Value) -> Value:
    """``w`` with its last two axes swapped (``wT(wT(w))`` is ``w``: a weight declared
    ``stored="transposed"`` is ``wT`` of its tensor, and the input gradient of its linear
    reads the tensor itself)."""
    if w.op == Op.WT:
        return w.args[0]
    shape = w.shape[:-2] + (w.shape[-1], w.shape[-2])
    return Value(Op.WT, (w,), WEIGHT, shape, _attrs(per=w.per))


def wgrad(x: Value, dy: Value, w: Value) -> Value:
    """Gradient of a typed linear's weight: segment-grouped outer products ``sum_rows x^T dy``.
    For ``w = wT(s)`` (a weight stored transposed) the gradient of ``s`` itself, in its
    layout: the same sums, written transposed (``transposed``), so no copy turns it around."""
    if w.op == Op.WT:
        s = w.args[0]
        return Value(Op.WGRAD, (x, dy), WEIGHT, s.shape, _attrs(per=s.per, transposed=True))
    return Value(Op.WGRAD, (x, dy), WEIGHT, w.shape, _attrs(per=w.per))


def wsum(dy: Value, w: Value) -> Value:
    """Gradient of a broadcast weight operand: rows summed per slice (and broadcast axes)."""
    return Value(Op.WSUM, (dy,), WEIGHT, w.shape, _attrs(per=w.per))


def const(kind: str, shape: Tuple[int, ...], value: float) -> Value:
    return Value(Op.CONST, (), kind, tuple(shape), _attrs(value=float(value)))


def has_edges() -> Value:
    """``[N, 1, 1]``: 1.0 on the nodes with an incoming edge, else 0 (graph data, bound by
    the executor like a constant; no gradient)."""
    return Value(Op.HAS_EDGES, (), NODE, (1, 1))


# -- made by fusion ------------------------------------------------------------------------
def attention(roles: Dict[str, Value], shape: Tuple[int, int], scale: float,
              slope: Optional[float], dropout: float = 0.0) -> Value:
    """The fused ``attention`` operator: ``sum over incoming edges of softmax(act(score)) *
    v_src [+ bias]`` with ``score = scale <q_dst, k_src> [* p] + a_src + a_dst``; ``roles``
    maps the terms present (:data:`ATTENTION_ROLES`) to their values (``bias``: a weight row
    of ``heads * dim`` added to every output row by the kernel's epilogue, rows without
    edges included, or node rows shaped as the output, row ``i`` added to output row ``i``;
    ``seed``: the dropout seed leaf, with ``dropout`` > 0: the attention weights dropped as
    :func:`dropout` drops edge values; ``k_norm``: a promise that k's rows are v's divided by
    it, one value per node (:func:`cosine_qk`'s norm): the kernels form each key from the v
    row they gather, and it carries no gradient).  Read them back with
    :func:`attention_roles`."""
    _need("v" in roles and set(roles) <= set(ATTENTION_ROLES),
          f"attention: roles must include 'v' and be among {ATTENTION_ROLES}, got {sorted(roles)}")
    _need(("q" in roles) == ("k" in roles), "attention: q and k come together")
    _need(("seed" in roles) == (dropout > 0), "attention: a dropout needs its seed role")
    order = tuple(r for r in ATTENTION_ROLES if r in roles)
    attrs = (("roles", order), ("scale", scale), ("slope", slope))
    return Value(Op.ATTENTION, tuple(roles[r] for r in order), NODE, tuple(shape),
                 attrs + ((("dropout", dropout),) if dropout > 0 else ()))


def attention_roles(v: Value, items: Optional[Sequence] = None) -> Dict[str, Any]:
    """Role name -> ``items[i]`` for an ``attention`` node (``items``: its arguments by
    default, or anything parallel to them, such as the tensors bound to them)."""
    _need(v.op == Op.ATTENTION, f"attention_roles: not an attention node ({v.op})")
    return dict(zip(v.attr("roles"), v.args if items is None else items))


def attention_lse(att: Value) -> Value:
    """The per-destination log-sum-exp of the activated scores of attention ``att`` (the fused
    forward computes it for its softmax; the fused backward reads it instead of recomputing
    the scores' normaliser).  ``att``: an ``attention`` node or the kernel computing one."""
    return Value(Op.ATTENTION_LSE, (att,), NODE, (att.heads, 1))


def attention_bwd(att: Value, grad: Value, lse: Value, needs: Tuple[str, ...]) -> Value:
    """The gradients of attention ``att`` given its output's gradient ``grad``: one traversal
    by destination (q, a_dst) and one by source (v, k, a_src), the scores recomputed on chip
    from ``lse``.  A tuple-valued node: read each role's gradient with :func:`pick`.  For
    ``k`` with a per-relation ``p`` it is the gradient of the effective key ``k * p_r``.
    Arguments: the attention's own, then ``grad``, ``att`` (its output), ``lse``."""
    roles = att.attr("roles")
    _need(att.op == Op.ATTENTION, f"attention_bwd: not an attention node ({att.op})")
    _need(set(needs) <= set(roles) - {"p", "bias"},
          f"attention_bwd: needs {needs} not among {roles}")
    return Value(Op.ATTENTION_BWD, att.args + (grad, att, lse), NODE, att.shape,
                 att.attrs + (("needs", tuple(needs)),))


def attention_of_bwd(b: Value) -> Value:
    """The forward ``attention`` node an ``attention_bwd`` node differentiates (its arguments
    as ``b`` binds them: inside a kernel body, ``arg`` placeholders)."""
    _need(b.op == Op.ATTENTION_BWD, f"attention_of_bwd: not an attention_bwd node ({b.op})")
    n = len(b.attr("roles"))
    return Value(Op.ATTENTION, b.args[:n], NODE, b.shape,
                 tuple(kv for kv in b.attrs if kv[0] not in ("needs", "joint")))


def joint_kv(b: Value) -> Value:
    """``attention_bwd`` node ``b`` writing the k and v gradients side by side into one
    buffer (``pick(.., "kv")``; ``pick`` of k or v reads a view of it): the input of a GEMM
    over both (the siblings pass fused K and V into one GEMM, whose backward reads them as
    one matrix)."""
    _need(b.op == Op.ATTENTION_BWD and {"k", "v"} <= set(b.attr("needs")),
          "joint_kv: an attention backward needing the k and v gradients")
    return b.with_attrs(joint=True)


def cosine_qk(x: Value, beta: Optional[Value] = None) -> Value:
    """``k = normalize(x)``, ``q = beta k`` and the norm each row of ``x`` was divided by
    (clamped at :data:`NORMALIZE_EPS`), as one operator (``hector::cosine_qk``: one pass over
    x's rows).  ``beta``: a one-element shared weight, or None for 1 (``q`` equals ``k``).
    A tuple-valued node: read ``q``, ``k`` (x's rows and shape) and ``norm`` (one value per
    row) with :func:`pick`."""
    _need(x.kind in ROW_KINDS and x.heads == 1,
          f"cosine_qk: one head of row values (one norm per row), got {x.kind}{list(x.shape)}")
    _need(beta is None or (beta.kind == WEIGHT and beta.per is None and beta.shape == (1,)),
          "cosine_qk: beta must be a one-element shared weight")
    return Value(Op.COSINE_QK, (x,) if beta is None else (x, beta), x.kind, x.shape)


def cosine_qk_bwd(dq: Value, dk: Value, c: Value) -> Value:
    """The gradients of :func:`cosine_qk` node ``c``'s inputs given those of its ``q`` and
    ``k`` (``hector::cosine_qk_backward``: one pass over the rows, reading x and the norm).
    A tuple-valued node: ``pick(.., "x")``, and ``pick(.., "beta")`` where ``c`` has a
    beta.  Arguments: ``dq``, ``dk``, x, c's norm and k[, beta]; :func:`narrow` to beta's
    gradient alone reads ``dq``, k and beta (``<dq, k>``)."""
    _need(c.op == Op.COSINE_QK, f"cosine_qk_bwd: not a cosine_qk node ({c.op})")
    x, beta = c.args[0], c.args[1:]
    _need(dq.kind == dk.kind == x.kind and dq.shape == dk.shape == x.shape,
          "cosine_qk_bwd: dq and dk must match x")
    return Value(Op.COSINE_QK_BWD, (dq, dk, x, pick(c, "norm"), pick(c, "k")) + beta, x.kind,
                 x.shape, (("needs", ("x",) + (("beta",) if beta else ())),))


def narrow(b: Value, roles) -> Value:
    """Tuple-valued backward node ``b`` computing only the outputs ``roles`` (some of
    :func:`pick_roles`), its arguments the ones those read: an ``attention_bwd``'s
    ``needs``; a ``cosine_qk_bwd`` asked for beta alone reads ``dq``, k and beta."""
    needs = tuple(r for r in b.attr("needs") if r in roles)
    _need(b.op in (Op.ATTENTION_BWD, Op.COSINE_QK_BWD) and needs and not b.attr("joint"),
          f"narrow: {b.op} to {sorted(roles)}")
    attrs = tuple((k, needs if k == "needs" else v) for k, v in b.attrs)
    args = b.args
    if b.op == Op.COSINE_QK_BWD and "x" not in needs:
        args = (args[0], args[4], args[5])
    return Value(b.op, args, b.kind, b.shape, attrs)


def _cosine_outputs(b: Value) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """Role -> (kind, shape) of each output of a cosine_qk or cosine_qk_bwd node."""
    if b.op == Op.COSINE_QK:
        x = b.args[0]
        return {"q": (x.kind, x.shape), "k": (x.kind, x.shape), "norm": (x.kind, (1, 1))}
    return {r: (b.kind, b.shape) if r == "x" else (WEIGHT, (1,)) for r in b.attr("needs")}


def pick_roles(b: Value) -> Tuple[str, ...]:
    """The outputs of tuple-valued node ``b`` that :func:`pick` reads."""
    if b.op in (Op.COSINE_QK, Op.COSINE_QK_BWD):
        return tuple(_cosine_outputs(b))
    return tuple(b.attr("needs")) + (("kv",) if b.attr("joint", False) else ())


def pick(b: Value, role: str) -> Value:
    """Role ``role``'s gradient out of ``attention_bwd`` node ``b`` (rows and shape of the
    role's value), or one output of a cosine_qk or cosine_qk_bwd node (``of`` names it)."""
    if b.op in (Op.COSINE_QK, Op.COSINE_QK_BWD):
        outputs = _cosine_outputs(b)
        _need(role in outputs, f"pick: {b.op} has no output {role!r} ({sorted(outputs)})")
        kind, shape = outputs[role]
        return Value(Op.PICK, (b,), kind, shape, (("of", b.op), ("role", role)))
    if role == "kv":      # the joint buffer of :func:`joint_kv`
        _need(b.attr("joint", False), "pick: 'kv' needs an attention backward made joint_kv")
        k, v = (b.args[b.attr("roles").index(r)] for r in ("k", "v"))
        return Value(Op.PICK, (b,), k.kind, (1, k.heads * k.dim + v.heads * v.dim),
                     (("role", role),))
    _need(role in b.attr("needs"), f"pick: {role!r} is not among {b.attr('needs')}")
    like = b.args[b.attr("roles").index(role)]
    return Value(Op.PICK, (b,), like.kind, like.shape, (("role", role),))


def kernel(template: str, body: Value, inputs: Sequence[Value]) -> Value:
    """A fused kernel of ``template`` computing ``body``, whose ``arg`` leaves are ``inputs``."""
    return Value(Op.KERNEL, tuple(inputs), body.kind, body.shape,
                 (("body", body), ("per", body.per), ("template", template)))


def select_kernels(k: Value) -> Dict[str, Value]:
    """Role -> the ``select`` kernel reading that output of kernel ``k``, whose body is a
    ``cosine_qk`` (as fusion groups a ``pick``): lowering makes every one a step, read in
    the forward or not, since a backward may keep any (the norm, where the attention
    forms no key from it)."""
    body = k.attr("body")
    _need(k.op == Op.KERNEL and body.op == Op.COSINE_QK, "select_kernels: a cosine_qk kernel")
    out = {}
    for role in pick_roles(body):
        p = pick(body, role)
        out[role] = kernel("select", Value(Op.PICK, (arg(0, k),), p.kind, p.shape, p.attrs),
                           (k,))
    return out


# -- walking ------------------------------------------------------------------------------
def toposort(outputs) -> Tuple[Value, ...]:
    """Every value reachable from ``outputs``, each after its arguments."""
    order, seen = [], set()
    stack = [(v, False) for v in reversed(list(outputs))]
    while stack:
        v, done = stack.pop()
        if done:
            order.append(v)
            continue
        if v in seen:
            continue
        seen.add(v)
        stack.append((v, True))
        stack.extend((a, False) for a in reversed(v.args) if a not in seen)
    return tuple(order)


def rewrite(outputs, fn, memo=None, original: bool = False):
    """Bottom-up rewrite: ``fn(value_with_rewritten_args)`` returns a replacement or None.
    ``memo`` (optional dict) receives original value -> its replacement.  With ``original``,
    ``fn(original_value, value_with_rewritten_args, memo)``: for rules keyed by values of the
    graph as it was, whose replacements are built from rewritten ones."""
    memo = {} if memo is None else memo
    for v in toposort(outputs):
        args = tuple(memo[a] for a in v.args)
        new = v if args == v.args else Value(v.op, args, v.kind, v.shape, v.attrs)
        out = fn(v, new, memo) if original else fn(new)
        memo[v] = new if out is None else out
    return tuple(memo[o] for o in outputs)


def is_weight_only(v: Value) -> bool:
    return v.kind == WEIGHT
