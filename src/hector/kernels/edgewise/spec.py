"""What an edge-wise kernel computes: a small expression program over rows, and the op
handler that turns it into the Triton statements the ``edgewise`` template wraps.

A program is a tree of :class:`Node` s.  *Row* nodes say which rows a load reads:

* ``own``: the rows this program owns (a block of output rows; one row when node-parallel);
* ``entry``: inside a ``scatter`` / ``softmax`` loop, the rows listed by the CSR entry;
* ``index(rows, array=j)``: ``arrays[j][rows]`` (an access scheme: node row by src or dst,
  compact row through the compact map, a row's relation or node type).

*Value* nodes have a static ``shape`` ``(h, d)`` and hold ``[rows, h, d]`` data:

* ``load(rows, input=i)``: rows of ``inputs[i]`` (flat rows of ``h * d`` elements, so any
  ``(h, d)`` view of a row reads the same memory);
* ``weight(slice, input=i)``: ``inputs[i][slice]`` of a ``[slices, h, d]`` weight; ``slice``
  is a row node of slice ids, or ``zero`` for an unsliced weight;
* unary ops (``neg exp sigmoid tanh gelu relu leaky_relu scale leaky_relu_grad
  gelu_grad``), binary ``add sub mul div`` (broadcasting ``h``/``d`` of 1), ``dot`` (sum over the
  feature axis), ``reduce_to`` (sum over the axes the target shape has as 1), ``expand``;
* ``scatter(x, ptr=j, perm=k, mean=b)``: for the owned row ``r``, the sum (mean) of ``x``
  over the entries ``perm[ptr[r]:ptr[r+1]]`` (node-parallel over a CSR: no atomics);
* ``softmax(score, ptr=j, perm=k)`` (the root only): per CSR row, the softmax of ``score``
  over the row's entries, written to each entry's row.

Every tile is fp32 ``[BLOCK_E, BH, BD]``: a value with ``h == 1`` (``d == 1``) holds its
single head (feature) replicated across the tile's heads (features), so broadcasting is free
and ``expand`` costs nothing; lanes past the program's ``H``/``D`` are masked out of every
reduction and store.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

#: Programs' forms: one lane per output row; one program per output row reducing CSR rows;
#: one program per CSR row writing a softmax to its entries.
FORMS = ("map", "reduce", "softmax")
UNARY = ("neg", "exp", "sigmoid", "tanh", "gelu", "relu", "leaky_relu", "scale",
         "leaky_relu_grad", "gelu_grad")
BINARY = ("add", "sub", "mul", "div")
ROWS = ("own", "entry", "index", "zero")


@dataclass(frozen=True)
class Node:
    op: str
    args: Tuple["Node", ...] = ()
    shape: Tuple[int, int] = (1, 1)
    attrs: Tuple[Tuple[str, object], ...] = ()

    def attr(self, key, default=None):
        return dict(self.attrs).get(key, default)


def node(op: str, *args: Node, shape=(1, 1), **attrs) -> Node:
    return Node(op, tuple(args), tuple(shape), tuple(sorted(attrs.items())))


def _walk(n: Node):
    seen, order = set(), []

    def visit(x):
        if x in seen:
            return
        seen.add(x)
        for a in x.args:
            visit(a)
        order.append(x)
    visit(n)
    return order


@dataclass(frozen=True)
class EdgewiseSpec:
    """A program: ``root`` evaluated for every output row, reading ``num_inputs`` tensors and
    ``num_arrays`` int index arrays; ``form`` as in :data:`FORMS`."""
    form: str
    root: Node
    num_inputs: int
    num_arrays: int

    def __post_init__(self):
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")
        if (self.form == "softmax") != (self.root.op == "softmax"):
            raise ValueError("a softmax program's root is its softmax (and only it)")
        hs = {n.shape[0] for n in _walk(self.root) if n.op not in ROWS} - {1}
        ds = {n.shape[1] for n in _walk(self.root) if n.op not in ROWS} - {1}
        if len(hs) > 1 or len(ds) > 1:
            raise ValueError(f"shapes must be (1 or H, 1 or D); got heads {sorted(hs)}, "
                             f"features {sorted(ds)}")

    @property
    def H(self) -> int:
        return max(n.shape[0] for n in _walk(self.root) if n.op not in ROWS)

    @property
    def D(self) -> int:
        return max(n.shape[1] for n in _walk(self.root) if n.op not in ROWS)

    def params(self) -> dict:
        """Render parameters of the ``edgewise`` kernel (see kernels/registry.py)."""
        return dict(form=self.form, args=", ".join(self.arg_names()), body=_Codegen(self).body())

    def arg_names(self) -> List[str]:
        return ([f"in{i}" for i in range(self.num_inputs)]
                + [f"arr{j}" for j in range(self.num_arrays)] + ["out", "n_rows"])


_UNARY_CODE = {
    "neg": "-{x}", "exp": "tl.exp({x})", "sigmoid": "tl.sigmoid({x})",
    "tanh": "2.0 * tl.sigmoid(2.0 * {x}) - 1.0", "gelu": "_gelu({x})",
    "relu": "tl.maximum({x}, 0.0)", "leaky_relu": "tl.where({x} > 0, {x}, {x} * {slope})",
    "scale": "{x} * {factor}", "leaky_relu_grad": "tl.where({x} > 0, 1.0, {slope}) + 0.0 * {x}",
    "gelu_grad": "_gelu_grad({x})",
}
_BINARY_CODE = {"add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "div": "{a} / {b}"}


class _Codegen:
    """The op handler: one Triton line per node, memoised per (node, loop scope)."""

    def __init__(self, spec: EdgewiseSpec):
        self.spec, self.lines, self.n = spec, [], 0
        self.H, self.D = spec.H, spec.D
        self.scopes: List[Dict[Node, str]] = [{}]
        self.indent = 0
        self.entry = None          # (row var, mask var) of the enclosing loop's entries

    def fresh(self, prefix="t"):
        self.n += 1
        return f"{prefix}{self.n}"

    def emit(self, line: str):
        self.lines.append("    " * self.indent + line)

    def lookup(self, n: Node):
        for scope in reversed(self.scopes):
            if n in scope:
                return scope[n]
        return None

    # -- rows: (int64 row vector var, its mask var) ------------------------------------------
    def rows(self, r: Node) -> Tuple[str, str]:
        if r.op == "own":
            return "own", "mask_own"
        if r.op == "entry":
            if self.entry is None:
                raise ValueError("an 'entry' row outside a scatter/softmax loop")
            return self.entry
        if r.op == "index":
            got = self.lookup(r)
            if got is None:
                inner, mask = self.rows(r.args[0])
                var = self.fresh("r")
                self.emit(f"{var} = tl.load(arr{r.attr('array')} + {inner}, mask={mask}, "
                          f"other=0).to(tl.int64)")
                got = (var, mask)
                self.scopes[-1][r] = got
            return got
        raise ValueError(f"not a row node: {r.op!r}")

    def lanes(self, shape) -> str:
        h, d = shape
        parts = ([f"offs_h[:, None] * {d}"] if h > 1 else []) + (["offs_d[None, :]"] if d > 1
                                                                  else [])
        return " + ".join(parts + ["lane0"])   # (lane0: always a full [BH, BD] block)

    # -- values: fp32 [BLOCK_E, BH, BD] tile vars --------------------------------------------
    def value(self, n: Node) -> str:
        got = self.lookup(n)
        if got is not None:
            return got
        var = self.fresh()
        op, h_d = n.op, n.shape[0] * n.shape[1]
        if op in ("load", "weight"):
            if op == "weight" and n.args[0].op == "zero":
                row, mask = "(own * 0)", "mask_own"
            else:
                row, mask = self.rows(n.args[0])
            self.emit(f"{var} = tl.load(in{n.attr('input')} + {row}[:, None, None] * {h_d} + "
                      f"({self.lanes(n.shape)})[None, :, :], mask={mask}[:, None, None] & "
                      f"mask_hd[None, :, :], other=0.0).to(tl.float32)")
        elif op in UNARY:
            x = self.value(n.args[0])
            self.emit(f"{var} = " + _UNARY_CODE[op].format(x=x, **dict(n.attrs)))
        elif op in BINARY:
            a, b = self.value(n.args[0]), self.value(n.args[1])
            self.emit(f"{var} = " + _BINARY_CODE[op].format(a=a, b=b))
        elif op == "dot":
            a, b = (self.value(x) for x in n.args)
            if max(n.args[0].shape[1], n.args[1].shape[1]) > 1:
                self.emit(f"{var} = tl.sum(tl.where(mask_hd[None, :, :], {a} * {b}, 0.0), "
                          f"axis=2)[:, :, None] + zeros_d")
            else:
                self.emit(f"{var} = {a} * {b}")
        elif op == "reduce_to":
            x, src = self.value(n.args[0]), n.args[0].shape
            cur = x
            if n.shape[1] == 1 and src[1] > 1:
                self.emit(f"{var} = tl.sum(tl.where(mask_hd[None, :, :], {cur}, 0.0), "
                          f"axis=2)[:, :, None] + zeros_d")
                cur = var
            if n.shape[0] == 1 and src[0] > 1:
                self.emit(f"{var} = tl.sum(tl.where(mask_hd[None, :, :], {cur}, 0.0), "
                          f"axis=1)[:, None, :] + zeros_h")
                cur = var
            if cur == x:
                self.emit(f"{var} = {x}")
        elif op == "expand":   # replicated tiles: broadcasting is free
            self.emit(f"{var} = {self.value(n.args[0])}")
        elif op == "scatter":
            self.scatter(n, var)
        else:
            raise ValueError(f"edgewise: no rule for {op!r}")
        self.scopes[-1][n] = var
        return var

    def loop(self, ptr: int, perm: int, body):
        """``for`` over the owned row's CSR entries in BLOCK_E tiles; ``body()`` runs inside."""
        self.emit(f"start = tl.load(arr{ptr} + row).to(tl.int64)")
        self.emit(f"stop = tl.load(arr{ptr} + row + 1).to(tl.int64)")
        self.emit("for e0 in range(start, stop, BLOCK_E):")
        self.indent += 1
        self.emit("offs_j = e0 + tl.arange(0, BLOCK_E)")
        self.emit("mask_j = offs_j < stop")
        self.emit(f"entry = tl.load(arr{perm} + offs_j, mask=mask_j, other=0).to(tl.int64)")
        saved, self.entry = self.entry, ("entry", "mask_j")
        self.scopes.append({})
        body()
        self.scopes.pop()
        self.entry = saved
        self.indent -= 1

    def scatter(self, n: Node, var: str):
        if self.entry is not None:
            raise ValueError("a scatter inside a scatter")
        self.emit(f"{var} = tl.zeros([1, BH, BD], tl.float32)")

        def body():
            x = self.value(n.args[0])
            self.emit(f"{var} += tl.sum(tl.where(mask_j[:, None, None], {x}, 0.0), "
                      f"axis=0)[None, :, :]")
        self.loop(n.attr("ptr"), n.attr("perm"), body)
        if n.attr("mean"):
            self.emit(f"{var} = {var} / tl.maximum(stop - start, 1).to(tl.float32)")

    def store(self, var: str, shape, row: str, mask: str):
        h, d = shape
        lane = (f"mask_hd & (offs_h[:, None] < {h})" if h == 1 else "mask_hd")
        lane = f"({lane}) & (offs_d[None, :] < {d})" if d == 1 else lane
        self.emit(f"tl.store(out + {row}[:, None, None] * {h * d} + ({self.lanes(shape)})"
                  f"[None, :, :], _to_out({var}, out), mask={mask}[:, None, None] "
                  f"& ({lane})[None, :, :])")

    def body(self) -> str:
        root = self.spec.root
        self.emit(f"H = {self.H}")
        self.emit(f"D = {self.D}")
        self.emit("mask_hd = (offs_h[:, None] < H) & (offs_d[None, :] < D)")
        if self.spec.form != "softmax":
            out = self.value(root)
            self.store(out, root.shape, "own", "mask_own")
            return "\n".join(self.lines)
        ptr, perm = root.attr("ptr"), root.attr("perm")
        self.emit("mx = tl.full([BH, BD], float('-inf'), tl.float32)")
        self.emit("den = tl.zeros([BH, BD], tl.float32)")

        def score():
            s = self.value(root.args[0])
            self.emit(f"s = tl.where(mask_j[:, None, None] & mask_hd[None, :, :], {s}, "
                      f"float('-inf'))")

        def first():
            score()
            self.emit("new = tl.maximum(mx, tl.max(s, axis=0))")
            self.emit("safe = tl.where(new == float('-inf'), 0.0, new)")
            self.emit("den = den * tl.exp(mx - safe) + tl.sum(tl.exp(s - safe[None, :, :]), "
                      "axis=0)")
            self.emit("mx = new")

        def second():
            score()
            self.emit("alpha = tl.exp(s - safe[None, :, :]) / den[None, :, :]")
            self.store("alpha", root.shape, "entry", "mask_j")
        self.loop(ptr, perm, first)
        self.emit("safe = tl.where(mx == float('-inf'), 0.0, mx)")
        self.emit("den = tl.where(den == 0.0, 1.0, den)")
        self.loop(ptr, perm, second)
        return "\n".join(self.lines)
