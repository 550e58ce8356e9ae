"""The layer DSL: a layer is a Python function of a builder ``m`` that returns its output::

    def rgcn(m, in_dim, out_dim):
        x = m.node_input("x", in_dim)
        W = m.weight("weight", (in_dim, out_dim), per="relation")
        msg = m.linear(m.src(x), W)                       # edge-wise, W picked by relation
        agg = m.aggregate(msg, "mean", per_relation=True)
        return agg + m.linear(x, m.weight("root", (in_dim, out_dim))) + m.weight("bias", (out_dim,))

Calling it once with a :class:`Model` captures the IR (:mod:`hector.compiler.ir`); nothing runs.
Symbols support ``+ - *`` between values and ``* /`` by Python numbers.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from . import ir as N
from .ir import CDST, EDGE, NODE, Op, Value

INITS = ("glorot", "zeros", "ones")
#: How a weight's tensor is laid out against its declared ``(K, N)`` shape (``Model.weight``).
STORED = (None, "transposed")


class Sym:
    """A DSL value: wraps an IR :class:`Value` so layer code reads like math."""
    __slots__ = ("value", "model")

    def __init__(self, value: Value, model: "Model"):
        self.value, self.model = value, model

    def _other(self, o) -> Value:
        if isinstance(o, Sym):
            return o.value
        raise TypeError(f"cannot combine a DSL value with {type(o).__name__}; only DSL values "
                        "(and numbers, for * and /) are allowed")

    def _wrap(self, v: Value) -> "Sym":
        return Sym(v, self.model)

    def __add__(self, o):
        return self._wrap(N.binary(Op.ADD, self.value, self._other(o)))

    def __sub__(self, o):
        return self._wrap(N.binary(Op.SUB, self.value, self._other(o)))

    def __mul__(self, o):
        if isinstance(o, (int, float)) and not isinstance(o, bool):
            return self._wrap(N.unary(Op.SCALE, self.value, factor=float(o)))
        return self._wrap(N.binary(Op.MUL, self.value, self._other(o)))

    __rmul__ = __mul__

    def __truediv__(self, o):
        if not isinstance(o, (int, float)) or isinstance(o, bool) or o == 0:
            raise TypeError(f"a DSL value can only be divided by a non-zero number, got {o!r}")
        return self * (1.0 / o)

    def __neg__(self):
        return self._wrap(N.unary(Op.NEG, self.value))

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.value.shape

    def __repr__(self) -> str:
        return f"Sym({self.value.op}: {self.value.kind}{list(self.value.shape)})"


@dataclass(frozen=True)
class WeightDecl:
    value: Value
    init: str
    full_shape: Tuple[int, ...]   # the parameter tensor: slices stacked in front
    stored: Optional[str] = None  # "transposed": the tensor is ``[N, K]`` (``Model.weight``)


@dataclass(frozen=True)
class Traced:
    """A captured layer: its outputs, named node inputs and declared weights."""
    outputs: Tuple[Value, ...]
    inputs: Dict[str, Value]
    weights: Dict[str, WeightDecl]
    #: the function asked for a dropout (``m.dropout`` with p > 0): a training call is a
    #: different program (traced with ``training=True``)
    dropout: bool = False


class Model:
    """The builder passed to a DSL function.  ``num_relations`` / ``num_node_types`` size the
    per-relation / per-node-type weights; ``training``: the trace of a training call (where
    ``dropout`` drops)."""

    def __init__(self, num_relations: int = 1, num_node_types: int = 1, training: bool = False):
        self.num_relations, self.num_node_types = num_relations, num_node_types
        self.training, self.uses_dropout = training, False
        self.inputs: Dict[str, Value] = {}
        self.weights: Dict[str, WeightDecl] = {}

    def _s(self, v: Value) -> Sym:
        return Sym(v, self)

    @staticmethod
    def _v(x) -> Value:
        if not isinstance(x, Sym):
            raise TypeError(f"expected a DSL value, got {type(x).__name__}")
        return x.value

    # -- declarations ---------------------------------------------------------------------
    def node_input(self, name: str, dim: int) -> Sym:
        if name in self.inputs:
            raise ValueError(f"node input {name!r} declared twice")
        self.inputs[name] = N.input_(name, dim)
        return self._s(self.inputs[name])

    def weight(self, name: str, shape, per: Optional[str] = None, init: str = "glorot",
               stored: Optional[str] = None) -> Sym:
        """A weight of ``shape`` (``per``: one slice per relation or node type, stacked in
        front).  ``stored="transposed"``: a ``(K, N)`` matrix whose tensor is laid out
        ``[N, K]``, as ``torch.nn.Linear.weight`` (PyG's ``lin.weight``); the program reads
        that tensor in place (the IR's ``wT`` of the stored weight: the GEMMs read it with
        swapped strides, and its gradient is formed in the stored layout), so a layer passes
        its ``nn.Linear`` weight as it is.  Unsliced ``(K, N)`` weights only."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if init not in INITS:
            raise ValueError(f"weight {name!r}: init must be one of {INITS}, got {init!r}")
        if stored not in STORED:
            raise ValueError(f"weight {name!r}: stored must be one of {STORED}, got {stored!r}")
        if stored and (len(shape) != 2 or per is not None):
            raise NotImplementedError(f"weight {name!r}: stored={stored!r} is supported for "
                                      f"an unsliced (K, N) matrix, got shape {shape} per={per}")
        if name in self.weights:
            raise ValueError(f"weight {name!r} declared twice")
        if stored:
            shape = shape[::-1]
        v = N.param(name, shape, per)
        lead = {None: (), "relation": (self.num_relations,), "node_type": (self.num_node_types,)}[per]
        self.weights[name] = WeightDecl(v, init, lead + shape, stored)
        return self._s(N.wT(v) if stored else v)

    # -- movement ---------------------------------------------------------------------------
    def src(self, x: Sym) -> Sym:
        """Node value read at each edge's source."""
        return self._s(N.gather(self._v(x), EDGE, "src"))

    def dst(self, x: Sym) -> Sym:
        """Node value read at each edge's destination."""
        return self._s(N.gather(self._v(x), EDGE, "dst"))

    def aggregate(self, msg: Sym, reduce: str = "sum", per_relation: bool = False) -> Sym:
        """Sum or mean of edge values over each destination's incoming edges; with
        ``per_relation`` the reduction runs per (destination, relation) and the per-relation
        results are summed (RGCN's ``sum_r 1/|N_r(v)| sum_u``)."""
        v = self._v(msg)
        if reduce not in ("sum", "mean"):
            raise ValueError(f"aggregate: reduce must be 'sum' or 'mean', got {reduce!r}")
        if per_relation:
            return self._s(N.scatter(N.scatter(v, CDST, "dst", reduce), NODE, "dst", "sum"))
        return self._s(N.scatter(v, NODE, "dst", reduce))

    # -- math -------------------------------------------------------------------------------
    def linear(self, x: Sym, w: Sym, heads: Optional[int] = None) -> Sym:
        return self._s(N.linear(self._v(x), self._v(w), heads))

    def dot(self, a: Sym, b: Sym) -> Sym:
        return self._s(N.dot(self._v(a), self._v(b)))

    def edge_softmax(self, s: Sym) -> Sym:
        return self._s(N.edge_softmax(self._v(s)))

    def normalize(self, x: Sym) -> Sym:
        """Each row's features (per head) divided by their L2 norm (at least 1e-12), as
        ``torch.nn.functional.normalize``: AGNN's cosine similarity is ``dot`` of two."""
        return self._s(N.normalize(self._v(x)))

    def dropout(self, x: Sym, p: float) -> Sym:
        """Edge values (attention weights, say) zeroed with probability ``p`` in a training
        call, the rest scaled by ``1 / (1 - p)``; ``x`` itself otherwise.  Applied to an
        edge softmax that fusion makes an attention, the fused kernels drop as they go."""
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"dropout: p must be a number in [0, 1), got {p!r}")
        if p == 0:
            return x
        self.uses_dropout = True
        return self._s(N.dropout(self._v(x), float(p))) if self.training else x

    def leaky_relu(self, x: Sym, negative_slope: float = 0.01) -> Sym:
        return self._s(N.unary(Op.LEAKY_RELU, self._v(x), slope=float(negative_slope)))

    def exp(self, x: Sym) -> Sym:
        return self._s(N.unary(Op.EXP, self._v(x)))

    def sigmoid(self, x: Sym) -> Sym:
        return self._s(N.unary(Op.SIGMOID, self._v(x)))

    def tanh(self, x: Sym) -> Sym:
        return self._s(N.unary(Op.TANH, self._v(x)))

    def gelu(self, x: Sym) -> Sym:
        return self._s(N.unary(Op.GELU, self._v(x)))

    def relu(self, x: Sym) -> Sym:
        return self._s(N.unary(Op.RELU, self._v(x)))

    def heads(self, x: Sym, heads: int) -> Sym:
        """Re-split the features of each row into ``heads`` heads (1 = concatenate heads)."""
        return self._s(N.reshape(self._v(x), heads))

    def head_mean(self, x: Sym) -> Sym:
        return self._s(N.head_mean(self._v(x)))

    def matmul(self, a: Sym, b: Sym) -> Sym:
        """Weight-weight product (e.g. folding two linears into one matrix)."""
        return self._s(N.wmul(self._v(a), self._v(b)))

    def basis(self, comp: Sym, bases: Sym) -> Sym:
        """Basis decomposition ``W_r = sum_b comp[r, b] V_b``."""
        return self._s(N.wcombine(self._v(comp), self._v(bases)))

    def blockdiag(self, w: Sym) -> Sym:
        return self._s(N.blockdiag(self._v(w)))


def trace(fn: Callable, num_relations: int = 1, num_node_types: int = 1, training: bool = False,
          **dims) -> Traced:
    """Run the DSL function ``fn(m, **dims)`` once and capture its IR (``training``: as a
    training call, dropouts included).  Only the keywords ``fn`` declares are passed; a
    missing one raises a ``TypeError`` naming it."""
    if not callable(fn):
        raise TypeError(f"fn must be a DSL function, got {type(fn).__name__}")
    m = Model(num_relations, num_node_types, training)
    params = inspect.signature(fn).parameters
    takes_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in dims.items() if takes_all or k in params}
    names = list(params)[1:]
    missing = [n for n in names if n not in kwargs and params[n].default is inspect.Parameter.empty
               and params[n].kind not in (params[n].VAR_KEYWORD, params[n].VAR_POSITIONAL)]
    if missing:
        raise TypeError(f"{getattr(fn, '__name__', 'fn')} needs the dimension(s) {missing}; "
                        f"pass them as keywords")
    out = fn(m, **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    for o in outs:
        if not isinstance(o, Sym) or o.value.kind != NODE:
            raise TypeError(f"{getattr(fn, '__name__', 'fn')} must return node-wise DSL values, "
                            f"got {o!r}")
    return Traced(tuple(o.value for o in outs), dict(m.inputs), dict(m.weights),
                  m.uses_dropout)
