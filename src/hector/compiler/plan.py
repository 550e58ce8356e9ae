"""The plan: an ordered list of kernel steps of the two templates, what the compiler's
lowering (``lower``) produces and the executor (``execute``) runs.

* ``gemm``: a typed linear as a segment GEMM (:class:`~hector.kernels.segment_mm.spec.GemmSpec`
  plus the :class:`RowSegments` saying which rows form which weight's segment and how they are
  gathered/scattered);
* ``traversal``: a node/edge traversal (:class:`TraversalSpec`: iteration space, the fused
  statements, the reductions);
* ``attention``: the fused score + edge softmax + aggregation traversal
  (:class:`~hector.kernels.attention.spec.AttentionSpec` of the op call the runtime makes, plus
  the :class:`AttentionRows` saying which graph that call traverses; run by
  ``hector.kernels.attention.op.edge_attention``);
* ``weight``: a weight-only computation (weight products, basis combinations): tiny, once per
  call, never per row;
* ``select``: one role's gradient out of a fused attention backward step (which computes
  them all in one launch pair), or one output of a ``cosine`` step; no kernel;
* ``cosine``: AGNN's score inputs (q, k and each row's norm) in one kernel, or their
  backward (``hector::cosine_qk``, ``hector::cosine_qk_backward``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

from .ir import Value

TEMPLATES = ("gemm", "traversal", "attention", "weight", "select", "cosine")


@dataclass(frozen=True)
class RowSegments:
    """How a typed linear's rows meet its weight slices.

    ``rows``: the row kind; ``segments``: what cuts them into slices ('relation' -> the
    kind's ``rel_ptr``; 'node_type' -> ``node_type_ptr`` with ``node_perm`` as gather and
    scatter when types are not contiguous id ranges; None -> one segment); ``per_head``: the
    weight is ``[H, K, N]`` per slice, so rows are laid out head-major and each (head, slice)
    is its own segment.
    """
    rows: str
    segments: Optional[str]
    per_head: bool
    transpose_weight: bool
    gather: Optional[Tuple[str, str]] = None   # (source row kind, endpoint) folded into the GEMM
    #: the CSR prologue (``fuse``): (input index, movements, coefficient) of the one-source
    #: linear traversal whose output rows the GEMM sums as it loads them
    csr: Optional[Tuple[int, Tuple[tuple, ...], float]] = None
    #: the scatter epilogue (``fuse``): (row kind summed into, endpoint): each output row is
    #: added into its node row with atomics
    scatter: Optional[Tuple[str, str]] = None
    #: the CSR scatter epilogue (``fuse``): (movements, coefficient) of the one-source
    #: gather-then-scatter chain from the GEMM's rows to the node rows it adds them into
    csr_out: Optional[Tuple[Tuple[tuple, ...], float]] = None
    #: the CSR prologue's or epilogue's rows are cut into pieces of at most
    #: ``lower_gemm.CSR_PIECE`` entries (their sums meet linearly afterwards)
    pieces: bool = False


@dataclass(frozen=True)
class AttentionRows:
    """Which graph a fused attention step's op call traverses, decided by lowering from the
    row kinds of its operands (the op takes per-node terms; see ``steps_triton.attention``).

    ``graph``: 'graph' (the graph itself: every term per node), 'derived' (sources are rows
    of ``source`` kind, destinations the nodes); ``source``: 'node', 'compact_src' or
    'edge'; ``dst_edge``: the destination term is per (dst, relation) row (RGAT's), read
    per edge through the edge's compact row; ``score_on_edges``: the destination side
    depends on the relation otherwise (with q.k), so the whole score is one per-edge source
    term (no q.k, no destination term in the launched spec).  ``strategy``: the schedule the
    op call runs ('auto': dynamic fusion's choice on the graph, 'node' or 'edge')."""
    graph: str
    source: str
    score_on_edges: bool = False
    dst_edge: bool = False
    strategy: str = "auto"


@dataclass(frozen=True)
class LinearTraversal:
    """A traversal whose statements are data movements and additions only:
    ``out = sum_s c_s M_s in[s] + sum_i c_i in[i] + in[bias]``, each ``M_s`` the product of
    its movements (innermost first), run by the ``traversal_csr`` kernel on ``c_s M_s``'s
    weighted CSR (composed once per graph), one launch per source, the addends and bias
    fused into the first.  A movement is ``("gather", one, many, end, norm)`` or
    ``("scatter", one, many, end, reduce)``."""
    sources: Tuple[Tuple[int, Tuple[tuple, ...], float], ...]
    addends: Tuple[Tuple[int, float], ...] = ()
    bias: Optional[int] = None

    def describe(self) -> str:
        terms = [f"{_coef(c, k == 0)}M{k} in{i}" for k, (i, _, c) in enumerate(self.sources)]
        terms += [f"{_coef(c, False)}in{i}" for i, c in self.addends]
        if self.bias is not None:
            terms.append(f"+ in{self.bias} (bias)")
        maps = "; ".join(f"M{k} = " + " . ".join(_movement(m) for m in reversed(ms))
                         for k, (_, ms, _) in enumerate(self.sources))
        return f"kernel traversal_csr: out = {' '.join(terms)}; {maps}"


def _coef(c: float, first: bool) -> str:
    sign = ("-" if c < 0 else "") if first else ("- " if c < 0 else "+ ")
    return sign + ("" if abs(c) == 1 else f"{abs(c):g} ")


def _movement(m: tuple) -> str:
    op, one, many, end, how = m
    frm, to = (one, many) if op == "gather" else (many, one)
    return f"{op}[{frm}->{to} by {end}{', ' + how if how else ''}]"


@dataclass(frozen=True)
class EdgewiseLowering:
    """A traversal run by the ``edgewise`` kernel: ``program`` (an
    :class:`~hector.kernels.edgewise.spec.EdgewiseSpec`) evaluated for every row of kind
    ``rows``.  ``inputs``: what each program input is, the step's input index (an int) or
    graph data (``("counts", one, many, end)``); ``arrays``: the graph's index arrays the
    program reads, by key (``("move", one, many, end)``, ``("relation", kind)``,
    ``("node_type",)``, ``("csr_ptr" | "csr_perm", one, many, end)``: the ``many`` rows
    grouped by their ``one`` row)."""
    program: object
    inputs: Tuple[object, ...]
    arrays: Tuple[tuple, ...]
    rows: str

    def describe(self) -> str:
        p = self.program
        what = {"map": f"one lane per {self.rows} row",
                "reduce": f"one program per {self.rows} row, reducing over its CSR entries "
                          "(no atomics)",
                "softmax": "one program per destination (CSR by dst), softmax written per "
                           "edge"}[p.form]
        reads = ", ".join(f"in{i}<-" + (f"arg{x}" if isinstance(x, int) else "/".join(x))
                          for i, x in enumerate(self.inputs))
        arrays = ", ".join(f"arr{j}=" + "/".join(k) for j, k in enumerate(self.arrays))
        return (f"kernel edgewise ({p.form}: {what}); inputs {reads}"
                + (f"; access arrays {arrays}" if arrays else ""))


@dataclass(frozen=True)
class TraversalSpec:
    """A traversal kernel's semantics: ``space`` is what one program iterates ('edge' rows,
    'node' rows via CSR by destination, compact rows), ``statements`` the fused operator
    chain (one line each, in the order they run), ``reductions`` the scatters it ends with.
    ``linear``: the kernel form when the statements are movements and additions (the Triton
    backend runs it on ``traversal_csr``); else ``declined`` says why the step runs as torch
    ops."""
    space: str
    statements: Tuple[str, ...]
    reductions: Tuple[str, ...]
    schedule: str   # 'edge-parallel' (one lane per row), 'node-parallel' (one program per
                    # CSR row), 'row-parallel', or 'view' (a reshape of its input: no kernel)
    linear: Optional[LinearTraversal] = None
    declined: str = ""
    softmax: Optional[Tuple[int, Optional[float]]] = None   # (input, leaky slope): edge_softmax
    edgewise: Optional[EdgewiseLowering] = None   # any other supported statement list

    @property
    def kernel(self) -> Optional[str]:
        """The Triton kernel the step runs on the Triton backend (None: torch ops)."""
        return ("traversal_csr" if self.linear else "edge_softmax" if self.softmax
                else "edgewise" if self.edgewise else None)


@dataclass(frozen=True)
class Step:
    """One kernel of the plan: ``output = body(inputs)``.  ``body`` is an IR expression whose
    ``arg`` leaves stand for ``inputs`` (so a step is self-contained and hashable)."""
    name: str
    template: str
    body: Value
    inputs: Tuple[Value, ...]
    output: Value
    spec: object = None     # GemmSpec + RowSegments / TraversalSpec / AttentionSpec + AttentionRows / None
    note: str = ""
    extra: Optional[Value] = None   # a second output the step writes (an attention's lse)

    def __post_init__(self):
        if self.template not in TEMPLATES:
            raise ValueError(f"Step.template must be one of {TEMPLATES}, got {self.template!r}")


@dataclass(frozen=True)
class Plan:
    """Steps in execution order; ``outputs`` are the IR values the plan returns, ``leaves``
    the inputs, weights and saved values it reads."""
    steps: Tuple[Step, ...]
    outputs: Tuple[Value, ...]
    leaves: Tuple[Value, ...]
    #: Per step, the values no later step reads and the plan does not return: the runner
    #: drops them after that step, so a plan's peak memory is its largest live set, not the
    #: sum of every intermediate (HGT's backward on mag: 33 steps, ten node-sized and several
    #: compact-sized temporaries).  Computed here, not on first use: torch.compile traces the
    #: runner and cannot write a memo onto a frozen dataclass.
    last_uses: Tuple[Tuple[Value, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "last_uses", self.releases())

    def releases(self, keep: Tuple[Value, ...] = ()) -> Tuple[Tuple[Value, ...], ...]:
        """Per step, the values to drop after it: those no later step reads, except the
        plan's outputs and ``keep`` (a forward's values saved for its backward: the compiler
        computes that list once per backward stage, not per call)."""
        last = {}
        for i, step in enumerate(self.steps):
            for v in (*step.inputs, step.output, step.extra):
                if v is not None:
                    last[v] = i          # a value nothing reads goes right after its step
        drops = [[] for _ in self.steps]
        kept = set(self.outputs).union(keep)
        for v, i in last.items():
            if v not in kept:
                drops[i].append(v)
        return tuple(tuple(d) for d in drops)

    def pruned(self, outputs: Tuple[Value, ...]) -> "Plan":
        """The plan of ``outputs`` (some of this plan's) alone: the steps they need, in this
        plan's order, and the leaves those read.  What a backward runs when some of its
        layer's inputs need no gradient (a first layer's features): their gradients' steps,
        and the index structures and launches those steps would cost, are left out."""
        if not set(outputs) <= set(self.outputs):
            raise ValueError("pruned: every output must be one of the plan's")
        need, keep = set(outputs), []
        for step in reversed(self.steps):
            if step.output in need or (step.extra is not None and step.extra in need):
                keep.append(step)
                need.update(step.inputs)
        return Plan(tuple(reversed(keep)), tuple(outputs),
                    tuple(v for v in self.leaves if v in need))

    def describe(self) -> str:
        lines = []
        for i, s in enumerate(self.steps):
            spec = s.spec
            if isinstance(spec, tuple):
                spec = " + ".join(type(p).__name__ + _short(p) for p in spec)
            elif spec is not None:
                spec = type(spec).__name__ + _short(spec)
            lines.append(f"[{i}] {s.template:9s} {s.name}: {spec or ''}")
            if s.note:
                lines.append(f"      {s.note}")
            if isinstance(s.spec, TraversalSpec):
                lines.extend(f"      | {st}" for st in s.spec.statements)
                lines.append("      " + _traversal_kernel(s.spec))
        return "\n".join(lines)


def _traversal_kernel(spec: TraversalSpec) -> str:
    if spec.linear:
        return spec.linear.describe()
    if spec.edgewise:
        return spec.edgewise.describe()
    if spec.schedule == "view":
        return "no kernel: a view of its input's rows"
    if spec.softmax:
        i, slope = spec.softmax
        act = f"leaky_relu(in{i}, {slope:g})" if slope is not None else f"in{i}"
        return f"kernel edge_softmax: softmax of {act} over each destination's edges (CSR by dst)"
    return f"torch ops (no traversal kernel: {spec.declined})"


def _short(spec) -> str:
    fields = getattr(spec, "__dataclass_fields__", {})
    parts = [f"{k}={getattr(spec, k)!s}" for k in fields
             if k not in ("statements", "reductions", "dtype", "linear", "declined", "softmax",
                          "edgewise")]
    return "(" + ", ".join(parts) + ")"
