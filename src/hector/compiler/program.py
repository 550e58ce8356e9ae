"""``hector.compile``: a DSL function -> a ``torch.nn.Module``.

The function is traced once into IR.  Two caches, both bounded (LRU):

* *entries*, per (row counts, dtype): the ``plan_cache_size`` most recently used (default
  ``PLAN_CACHE_SIZE``, or ``$HECTOR_PLAN_CACHE_SIZE``).  An entry is small: the statistics
  and references to the stages below.
* *stages* (the graph-independent work: passes, lowering, kernel specs), the
  ``STAGE_CACHE_SIZE`` most recently used.  A graph shape met for the first time is first
  put to the cost-model questions of the kept stages (a few integer comparisons); only when
  no stage answers like it does :func:`~hector.compiler.pipeline.compile_forward` run.  So
  mini-batch training, a new shape every batch, compiles once per distinct set of cost-model
  outcomes (usually once), not once per batch.

The backward (:func:`~hector.compiler.pipeline.compile_backward`: IR autodiff, its passes and
lowering) is built lazily, by the first forward that needs gradients, kept on the forward
stage and shared the same way: inference never builds it.  With ``HECTOR_DEBUG=1`` every
reused stage is checked against a fresh compilation.
"""
from __future__ import annotations

import math
import os
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from .. import checks as C
from ..device import BACKENDS, resolve_backend
from ..graph import Graph
from ..kernels.attention.op import STRATEGIES, draw_seed
from .dsl import Traced, trace
from .execute import execute
from .ir import NODE, Op, Value, seed as seed_leaf, toposort
from .passes.common import GraphStats
from .pipeline import (CompiledPlan, ForwardStage, check_same_plan, compile_backward,
                       compile_forward)
from .steps_torch import GraphIndex
from .warm import graphed

AUTODIFF = ("ir", "torch")
PLAN_CACHE_SIZE = 64
STAGE_CACHE_SIZE = 8


def _default_cache_size() -> int:
    value = os.environ.get("HECTOR_PLAN_CACHE_SIZE", str(PLAN_CACHE_SIZE))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"HECTOR_PLAN_CACHE_SIZE must be an int >= 1, got {value!r}")
    return int(value)


class Program:
    """A traced layer plus its per-graph compiled plans (no parameters: ``hector.nn`` layers
    keep PyG's parameters and pass them in)."""

    def __init__(self, fn: Callable, *, reorder=True, compact: bool = True,
                 fuse: bool = True, backend: str = "auto", autodiff: str = "ir",
                 num_relations: int = 1, num_node_types: int = 1,
                 plan_cache_size: Optional[int] = None, training: bool = False,
                 strategy: str = "auto", **dims):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if autodiff not in AUTODIFF:
            raise ValueError(f"autodiff must be one of {AUTODIFF}, got {autodiff!r}")
        if reorder not in (True, False, "always"):
            raise TypeError(f"reorder must be a bool or 'always', got {reorder!r}")
        for name in ("compact", "fuse"):
            if not isinstance(locals()[name], bool):
                raise TypeError(f"{name} must be a bool, got {locals()[name]!r}")
        C.check_count(num_relations, "num_relations")
        C.check_count(num_node_types, "num_node_types")
        self.fn, self.dims = fn, dict(dims)
        self.options = dict(reorder=reorder, compact=compact, fuse=fuse, strategy=strategy)
        self.backend, self.autodiff = backend, autodiff
        self.num_relations, self.num_node_types = num_relations, num_node_types
        self.traced: Traced = trace(fn, num_relations=num_relations,
                                    num_node_types=num_node_types, training=training, **dims)
        #: A layer with dropout is another program in a training call (its dropouts in the
        #: IR, a seed drawn per call): traced and compiled beside this one, caches its own.
        self.training_program: Optional["Program"] = None
        if self.traced.dropout and not training:
            self.training_program = Program(
                fn, reorder=reorder, compact=compact, fuse=fuse, backend=backend,
                autodiff=autodiff, num_relations=num_relations, num_node_types=num_node_types,
                plan_cache_size=plan_cache_size, training=True, strategy=strategy, **dims)
        self._seeded = any(v.op == Op.SEED for v in toposort(self.traced.outputs))
        # Only per-node-type weights can be re-sliced per relation (reorder's typed fold):
        # other programs never ask a graph for its relations' source types (one host read
        # of the edges for a new graph without names: every mini-batch block).
        self._typed = any(v.op == Op.PARAM and v.per == "node_type"
                          for v in toposort(self.traced.outputs))
        if plan_cache_size is None:
            plan_cache_size = _default_cache_size()
        if C.check_count(plan_cache_size, "plan_cache_size") < 1:
            raise ValueError(f"plan_cache_size must be >= 1, got {plan_cache_size}")
        self.plan_cache_size = plan_cache_size
        self._cache: "OrderedDict[tuple, CompiledPlan]" = OrderedDict()   # LRU order
        #: A string that changes whenever a call plans (``_plan_outside_tracing``).  Dynamo
        #: cannot guard the cache read below (its key is an object the trace builds), so a
        #: frame traced on a miss would keep the planning call, and its eager run of the
        #: plans, on every later call; the token is guarded by value, so once a plan is made
        #: the frame is traced again, on a hit, whole.
        self._plans_token = "0"
        self._stages: "OrderedDict[int, Tuple[tuple, ForwardStage]]" = OrderedDict()  # LRU

    # -- compilation ----------------------------------------------------------------------
    def compiled_for(self, graph, dtype: torch.dtype = torch.float32,
                     backward: bool = True) -> CompiledPlan:
        """The compiled entry for ``graph``'s shape and ``dtype``; with ``backward`` (and
        ``autodiff='ir'``) its backward plan is lowered too, once."""
        stats = self.stats(graph)
        key = (stats, dtype)
        cp = self._cache.get(key)
        if cp is None:
            cp = self._cache[key] = self._entry(stats, dtype)
            while len(self._cache) > self.plan_cache_size:
                self._cache.popitem(last=False)       # the least recently used shape
        else:
            self._cache.move_to_end(key)
        return compile_backward(cp) if backward else cp

    def compile_exact(self, graph, dtype: torch.dtype = torch.float32,
                      backward: bool = True) -> CompiledPlan:
        """The pipeline run on ``graph``'s own statistics, outside both caches: what
        ``explain`` prints, whose decisions then cite this graph's row counts (a shared
        stage's cite the graph that built it; its plans are the same)."""
        cp = self._compile(self.stats(graph), dtype)
        return compile_backward(cp) if backward else cp

    def stats(self, graph) -> GraphStats:
        """``graph``'s statistics as this program's passes read them."""
        return GraphStats.of(graph, self._typed)

    def _compile(self, stats: GraphStats, dtype: torch.dtype) -> CompiledPlan:
        return compile_forward(self.traced.outputs, stats, dtype, **self.options,
                               differentiable=self.autodiff == "ir")

    def _entry(self, stats: GraphStats, dtype: torch.dtype) -> CompiledPlan:
        """A new shape's entry: on a kept stage whose questions it answers alike, else on a
        newly compiled one (kept, the least recently used dropped)."""
        # Relation and node-type counts size the per-slice weights the plans read, and typed
        # sources allow re-slicing them (reorder's typed-into-relation): a stage is shared
        # only between graphs that agree on those, whatever the questions say.
        family = (dtype, stats.num_relations, stats.num_node_types, stats.typed_sources)
        sid = next((sid for sid, (fam, stage) in reversed(self._stages.items())
                    if fam == family and stage.fits(stats)), None)
        if sid is not None:
            self._stages.move_to_end(sid)
            stage = self._stages[sid][1]
            if C.debug_enabled():
                check_same_plan(stage.forward_plan, self._compile(stats, dtype).forward_plan,
                                stats)
            return CompiledPlan(stats, stage)
        cp = self._compile(stats, dtype)
        self._stages[id(cp.forward)] = (family, cp.forward)
        while len(self._stages) > STAGE_CACHE_SIZE:
            self._stages.popitem(last=False)
        return cp

    # -- running --------------------------------------------------------------------------
    def check_graph(self, graph) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a hector.Graph, got {type(graph).__name__}")
        for name, decl in self.traced.weights.items():
            per = decl.value.per
            if per == "relation" and graph.num_relations != self.num_relations:
                raise ValueError(f"graph has num_relations={graph.num_relations} but weight "
                                 f"{name!r} was declared for {self.num_relations}")
            if per == "node_type" and graph.num_node_types != self.num_node_types:
                raise ValueError(f"graph has num_node_types={graph.num_node_types} but weight "
                                 f"{name!r} was declared for {self.num_node_types}")

    def leaves(self, graph, inputs: Dict[str, torch.Tensor],
               weights: Dict[str, torch.Tensor]) -> Dict[Value, torch.Tensor]:
        """Check every input and weight against its declaration; the leaf map the plans read."""
        out = {}
        unknown = set(inputs) - set(self.traced.inputs)
        if unknown:
            raise ValueError(f"unknown input(s) {sorted(unknown)}; the layer declares "
                             f"{sorted(self.traced.inputs)}")
        for name, v in self.traced.inputs.items():
            if name not in inputs:
                raise ValueError(f"missing input {name!r} (shape [num_nodes, {v.dim}])")
            x = C.check_features(inputs[name], name, graph.num_nodes, "graph.num_nodes",
                                 graph.device, num_cols=v.dim)
            out[v] = x.reshape(x.shape[0], 1, v.dim)
        for name, decl in self.traced.weights.items():
            if name not in weights:
                raise ValueError(f"missing weight {name!r} of shape {decl.full_shape}")
            w = C.check_tensor(weights[name], name)
            if tuple(w.shape) != decl.full_shape:
                raise ValueError(f"weight {name!r} must have shape {decl.full_shape}, got "
                                 f"{tuple(w.shape)}")
            if w.device != graph.device:
                raise ValueError(f"weight {name!r} is on {w.device} but the graph is on "
                                 f"{graph.device}; move one of them with .to(device)")
            out[decl.value] = w
        if self._seeded:          # drawn on the device: a captured call draws anew each replay
            out[seed_leaf()] = draw_seed(graph.device)
        return out

    def __call__(self, graph, inputs: Dict[str, torch.Tensor],
                 weights: Dict[str, torch.Tensor], training: bool = False) -> List[torch.Tensor]:
        """The layer's outputs on ``graph``; ``training``: a training call (dropouts drop)."""
        if training and self.training_program is not None:
            return self.training_program(graph, inputs, weights)
        self.check_graph(graph)
        leaves = self.leaves(graph, inputs, weights)
        dtype = next(iter(self.leaves_dtype(leaves)))
        # Half inputs: the Triton kernels keep features, messages and weights in the input
        # dtype (storage) and accumulate in fp32; the torch backend computes in fp32.
        half = dtype in (torch.float16, torch.bfloat16)
        backend = resolve_backend(self.backend, graph.device, dtype)
        work = torch.float32 if half and backend == "torch" else dtype
        leaves = {v: t if v.op == Op.SEED else t.to(work) for v, t in leaves.items()}
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in leaves.values())
        backward = needs_grad and self.autodiff == "ir"
        key = (self.stats(graph), work)
        cp = self._cache.get(key)
        if self._plans_token and (cp is None or (backward and cp.differentiable
                                                 and cp.backward_plan is None)):
            cp = _plan_outside_tracing(self, graph, work, backward, leaves, backend,
                                       torch.compiler.is_compiling())
        elif not torch.compiler.is_compiling():
            self._cache.move_to_end(key)        # LRU order (dynamo need not trace it)
        outs = execute(cp, GraphIndex.of(graph), leaves, backend, self.autodiff)
        return [o.flatten(1).to(dtype) for o in outs]

    @staticmethod
    def leaves_dtype(leaves):
        dtypes = {t.dtype for v, t in leaves.items() if v.op == Op.INPUT}
        if len(dtypes) > 1:
            raise TypeError(f"node inputs have different dtypes {sorted(map(str, dtypes))}")
        return dtypes or {torch.float32}


@torch.compiler.disable
def _plan_outside_tracing(program: Program, graph, dtype: torch.dtype, backward: bool,
                          leaves: Dict[Value, torch.Tensor], backend: str,
                          tracing: bool) -> CompiledPlan:
    """A cache miss: run the pass pipeline and lowering eagerly.  Under ``torch.compile`` this
    is one graph break on the first call of a graph shape (the planner builds new IR objects
    that dynamo cannot put in a graph); later calls hit the cache and trace whole.

    When ``tracing``, the plans also run once here, forward and backward, on copies of the
    inputs: that fills the graph's lazy index memos (moves, segment layouts, derived graphs),
    which must not be first written inside the traced autograd.Function."""
    cp = program.compiled_for(graph, dtype, backward=backward)
    program._plans_token = str(int(program._plans_token) + 1)
    if tracing:
        with torch.enable_grad():
            copies = {v: t.detach().clone().requires_grad_(backward and t.requires_grad)
                      for v, t in leaves.items()}
            outs = [o for o in execute(cp, GraphIndex.of(graph), copies, backend,
                                       program.autodiff) if o.requires_grad]
            if outs:
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return cp


class CompiledModule(nn.Module):
    """What ``hector.compile`` returns: the DSL's weights as parameters, ``forward(graph,
    **inputs)`` returning the layer's output (a tuple when it has several)."""

    def __init__(self, program: Program):
        super().__init__()
        self.program = program
        for name, decl in program.traced.weights.items():
            self.register_parameter(name, nn.Parameter(torch.empty(decl.full_shape)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name, decl in self.program.traced.weights.items():
            p = getattr(self, name)
            if decl.init == "zeros":
                nn.init.zeros_(p)
            elif decl.init == "ones":
                nn.init.ones_(p)
            else:   # glorot over the slice's last two axes, as PyG does
                fan = p.shape[-2] + p.shape[-1] if p.dim() >= 2 else 2 * p.shape[-1]
                bound = math.sqrt(6.0 / fan)
                nn.init.uniform_(p, -bound, bound)

    @graphed        # (warm calls on CUDA replay CUDA graphs, as hector.nn's layers do)
    def forward(self, graph, **inputs):
        weights = {n: getattr(self, n) for n in self.program.traced.weights}
        outs = self.program(graph, inputs, weights, training=self.training)
        return outs[0] if len(outs) == 1 else tuple(outs)


def node_type_bounds(graph: Graph) -> List[int]:
    """``graph.node_type_ptr`` as Python ints (first row of each node type, then the node
    count): read from the device once per graph, as the compiler's own index of it is."""
    return GraphIndex.of(graph).host_bounds(NODE)


def compile(fn: Callable, *, reorder=True, compact: bool = True, fuse: bool = True,
            backend: str = "auto", autodiff: str = "ir", strategy: str = "auto",
            **dims) -> CompiledModule:
    """Compile DSL function ``fn(m, **dims)`` into a module.

    Args:
        reorder, compact, fuse: switch the optimisation passes (``reorder="always"``: also
            move keys and values across an attention where the cost model declines).
        backend: 'auto' (Triton on CUDA or under ``TRITON_INTERPRET=1``, else torch),
            'torch' or 'triton'.
        autodiff: 'ir' (backward plan from the IR-level autodiff) or 'torch'.
        strategy: the fused attentions' schedule: 'auto' (chosen per graph from its degree
            statistics), 'node' or 'edge'.
        dims: the function's dimensions, plus ``num_relations`` / ``num_node_types`` sizing
            per-relation / per-node-type weights.
    """
    return CompiledModule(Program(fn, reorder=reorder, compact=compact, fuse=fuse,
                                  backend=backend, autodiff=autodiff, strategy=strategy,
                                  **dims))
