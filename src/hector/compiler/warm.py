"""Warm layer calls replayed as CUDA graphs.

A hector layer called eagerly on CUDA spends most of a small graph's step on the host: every
call re-enters Python for its checks, plans, dispatch and each kernel's launch set-up, for a
fraction of a millisecond of GPU work.  Yet an eager training loop calls a layer on the same
graph with inputs of the same shapes step after step.  Such a call is decided once: after
:data:`CALLS_BEFORE_CAPTURE` identical eager calls, the layer's forward (and, when it records
gradients, its backward) is captured in CUDA graphs, and every later call with the same
signature copies its inputs into the graph's input buffers and replays it: a handful of host
calls per direction, whatever the number of kernels.

A call's *signature* is what the captured launches depend on: the layer's parameters (same
tensors, same storage), its training flag, whether grad is enabled, and per argument: a float
tensor's dtype, shape, strides and ``requires_grad`` (its values are copied in on every
call), an integer tensor's identity and version (edge indices: the graph built from them is
captured by address, so another edge_index is another signature), a ``hector.Graph``'s
identity, any other value itself.

What a replay guarantees, so that it is the same function as the eager call:

* outputs and gradients are fresh tensors (copied out of the graph's memory), safe to keep;
* a second forward replay of one signature while the first one's backward is still pending
  (gradient accumulation over two forwards, a layer applied twice) runs eagerly instead, so
  the pending backward still reads its own forward's values;
* a backward runs once per forward, as eager hector's does (``retain_graph`` needs
  ``hector.retain_saved()``, which turns replays off);
* dropout draws a fresh mask on every replay (torch's CUDA generator is graph-safe);
* a failed capture is reported once (a warning) and that signature runs eagerly from then on;
  what the failure left behind is undone first (:func:`_recover`: the thread's stream, the
  random generator's capture mode), so the program goes on as if nothing was tried.

Replays are off where they cannot or need not apply: on the CPU, while ``torch.compile``
traces, inside a caller's own CUDA-graph capture (the caller captures hector's kernels
directly), under a dispatch mode or functorch transform, under saved-tensor hooks
(activation checkpointing, ``torch.autograd.graph.save_on_cpu``), in debug mode
(``HECTOR_DEBUG=1``, whose checks read the device), inside
:func:`warm_graphs(False) <warm_graphs>`, on graphs of
more than :data:`MAX_EDGES` edges (their steps are GPU-bound already, and a captured step
keeps its intermediates), and with ``HECTOR_WARM_GRAPHS=0``.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
import weakref
from collections import OrderedDict
from typing import Callable, Optional

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.modules import module as _module

from .. import checks as C
from ..device import tf32_allowed
from ..graph import Graph
from ..kernels.eager import _PLAIN, _untraced
from .execute import _RETAIN

#: Identical eager calls before a signature is captured (the first call plans and compiles;
#: the second shows the loop repeats).
CALLS_BEFORE_CAPTURE = 2
#: Larger graphs run eagerly: their steps are GPU-bound, and a captured step holds its
#: intermediates in the graph's memory for as long as the layer lives.
MAX_EDGES = int(os.environ.get("HECTOR_WARM_GRAPH_MAX_EDGES", 1 << 21))
#: Signatures remembered per layer (a mini-batch loop makes a new graph per batch: those
#: counts are dropped oldest first, and a captured signature beyond this many is freed).
MAX_SIGNATURES = 8

_local = threading.local()
_epoch = [0]      # bumped whenever any module registers a parameter, buffer or submodule
#: Bumped when a failed capture's random state was replaced (:func:`_recover`): a replay
#: captured before is no longer valid (``_Captured.valid``) and is captured again.
_rng_generation = [0]


def _bump(*_args):
    _epoch[0] += 1


for _register in (_module.register_module_parameter_registration_hook,
                  _module.register_module_buffer_registration_hook,
                  _module.register_module_module_registration_hook):
    _register(_bump)


@contextlib.contextmanager
def warm_graphs(enabled: bool):
    """Turn replays of warm layer calls on or off inside the block (this thread)."""
    before = getattr(_local, "enabled", True)
    _local.enabled = bool(enabled)
    try:
        yield
    finally:
        _local.enabled = before


def enabled() -> bool:
    return (getattr(_local, "enabled", True)
            and os.environ.get("HECTOR_WARM_GRAPHS", "1") not in ("", "0"))


def graphed(forward: Callable) -> Callable:
    """Decorate a layer's ``forward``: warm calls replay CUDA graphs (module docstring)."""
    @functools.wraps(forward)
    def wrapper(module, *args, **kwargs):
        return warm_call(module, forward, args, kwargs)
    return wrapper


# -- signatures ---------------------------------------------------------------------------
class _Unfit(Exception):
    """An argument no replay can stand for (a CPU tensor, an unknown object)."""


#: The device whose tensors a replay takes (a CPU proxy of the warm path sets "cpu").
DEVICE = "cuda"
_SCALARS = (bool, int, float, str, type(None))


def _flatten(obj, leaves: list, refs: list, edges: list):
    """The signature of ``obj`` (a hashable tuple) while appending its float tensors to
    ``leaves``, and the objects it names by identity to ``refs`` (checked on a hit)."""
    kind = type(obj)
    if kind in _PLAIN:      # (plain tensors first: a warm call's signature is mostly them)
        if obj.device.type != DEVICE:
            raise _Unfit
        if obj.is_floating_point():
            leaves.append(obj)
            return ("t", obj.dtype, obj.shape, obj.stride(), obj.requires_grad)
        refs.append(obj)
        edges.append(obj.shape[1] if obj.dim() == 2 else 0)    # ([2, E]: an edge_index)
        return ("i", id(obj), obj._version)
    if isinstance(obj, (tuple, list)):      # (named tuples and subclasses too)
        return (kind, tuple([_flatten(o, leaves, refs, edges) for o in obj]))
    if isinstance(obj, dict):
        return (dict, tuple([(k, _flatten(v, leaves, refs, edges)) for k, v in obj.items()]))
    if isinstance(obj, Graph):
        if obj.device.type != DEVICE:
            raise _Unfit
        refs.append(obj)
        edges.append(obj.num_edges)
        return ("g", id(obj))
    if isinstance(obj, _SCALARS):
        return obj
    raise _Unfit      # (a tensor subclass, an unknown object)


def _rebuild(obj, it):
    """``obj`` with its float tensors replaced, in ``_flatten``'s order, by ``next(it)``."""
    if isinstance(obj, torch.Tensor):
        return next(it) if obj.is_floating_point() else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(_rebuild(o, it) for o in obj)
    if isinstance(obj, dict):
        return {k: _rebuild(v, it) for k, v in obj.items()}
    return obj


def _outputs(out):
    """(tensors, rebuild) of a layer's output: a tensor, or a dict / tuple of tensors."""
    if isinstance(out, torch.Tensor):
        return [out], lambda ts: ts[0]
    if isinstance(out, dict) and all(isinstance(v, torch.Tensor) for v in out.values()):
        keys = list(out)
        return list(out.values()), lambda ts: dict(zip(keys, ts))
    if isinstance(out, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in out):
        kind = type(out)
        return list(out), lambda ts: kind(ts)
    raise _Unfit


# -- handing out a graph's tensors ------------------------------------------------------
#: Tensors up to this many elements are handed out of a graph's memory through one shared
#: buffer per dtype (written by the graph itself, copied out with one launch); larger ones
#: are cloned alone: the extra in-graph copy of a large tensor would cost the GPU more than
#: the launch it saves the host (a launch's few microseconds move megabytes).
PACK_MAX_NUMEL = 1 << 18


class _Packed:
    """Tensors in a graph's memory (outputs, gradients; ``None`` allowed), handed out fresh
    after each replay (the graph's own memory is overwritten by the next one) with one copy
    per dtype for the small ones.  Built inside the capture, so the graph fills the shared
    buffers itself."""

    def __init__(self, tensors, share: bool = True):
        self.tensors = list(tensors)
        groups: dict = {}
        for i, t in enumerate(self.tensors):
            if share and t is not None and t.numel() <= PACK_MAX_NUMEL:
                groups.setdefault(t.dtype, []).append(i)
        groups = [at for at in groups.values() if len(at) > 1]
        self.alone = [i for i, t in enumerate(self.tensors) if t is not None
                      and not any(i in at for at in groups)]
        self.groups = [(at, [self.tensors[i] for i in at],
                        _flatten_dense_tensors([self.tensors[i] for i in at])) for at in groups]

    def fresh(self) -> list:
        out = [None] * len(self.tensors)
        for i in self.alone:
            out[i] = self.tensors[i].clone()
        for at, like, flat in self.groups:
            for i, t in zip(at, _unflatten_dense_tensors(flat.clone(), like)):
                out[i] = t
        return out


@torch.no_grad()
def _copy_all(dst: list, src: list) -> None:
    """``dst[i].copy_(src[i])`` for all i, as one foreach call (one launch where the tensors
    allow, one C++ loop otherwise).  Outside autograd: a copy recorded into a capture's input
    slot would hang the caller's graph on that slot, alive for as long as the capture, and
    with it the gradient accumulators of the leaves behind it, made on the caller's stream (a
    later capture that reaches one fails: its stream differs)."""
    if len(dst) == 1:
        dst[0].copy_(src[0])
    elif dst:
        torch._foreach_copy_(dst, src)


# -- one captured signature -----------------------------------------------------------------
class _Captured:
    """A layer call captured for one signature: the forward graph, and with gradients the
    backward graph, sharing one memory pool."""

    def __init__(self, module, forward, args, kwargs, leaves, refs, params):
        self.refs = _weak(refs)
        self.generation = _rng_generation[0]
        self.params = params
        self.ptrs = [p.data_ptr() for p in params]
        self.inputs = [t.detach().clone() for t in leaves]
        for s, t in zip(self.inputs, leaves):
            s.requires_grad_(t.requires_grad)
        # What the backward differentiates, fixed by the signature (it holds every
        # requires_grad flag): the inputs that need a gradient, then the parameters.
        self.grad_inputs = [i for i, s in enumerate(self.inputs) if s.requires_grad]
        self.grad_params = [p for p in params if p.requires_grad]
        self.wants = ([self.inputs[i] for i in self.grad_inputs] + self.grad_params
                      if torch.is_grad_enabled() else [])
        self.slots = [s.detach() for s in self.inputs]   # (written in place each call)
        self.sources: list = [None] * len(self.inputs)    # (what each slot last copied)
        self.disjoint_at: Optional[list] = None   # (leaf addresses last found disjoint)
        args, kwargs = _rebuild((args, kwargs), iter(self.inputs))
        with warm_graphs(False):    # (a warm layer inside this one records its kernels here)
            self._capture(module, forward, args, kwargs)

    def _capture(self, module, forward, args, kwargs):
        stream = torch.cuda.current_stream()
        try:
            self._record(module, forward, args, kwargs)
        except RuntimeError:
            _recover(stream)
            raise

    def _record(self, module, forward, args, kwargs):
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):     # (per-stream lazy state: library handles)
            self._backward(forward(module, *args, **kwargs))
        torch.cuda.current_stream().wait_stream(side)
        self.fwd = torch.cuda.CUDAGraph()
        # (thread_local: another thread's work, a loader's prefetch, is not the capture's)
        with torch.cuda.graph(self.fwd, pool=pool, capture_error_mode="thread_local"):
            out = forward(module, *args, **kwargs)
            outs, self.rebuild = _outputs(out)
            # (outputs an autograd.Function returns stay tensors of their own: views of one
            # buffer made inside it could not be modified in place, as a layer's eager
            # outputs can; inference outputs carry no autograd and share the buffer)
            self.out_pack = _Packed((o.detach() for o in outs), share=not self.wants)
        self.bwd = None
        self.pending: Optional[weakref.ref] = None
        if self.wants:
            self.is_diff = [o.requires_grad for o in outs]
            diff = [o for o in outs if o.requires_grad]
            self.gouts = [torch.empty_like(o) for o in diff]
            self.bwd = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.bwd, pool=pool, capture_error_mode="thread_local"):
                self.grad_pack = _Packed(torch.autograd.grad(diff, self.wants, self.gouts,
                                                             allow_unused=True))
        # (only the outputs' memory is kept, in out_pack: their autograd graph, made on the
        # capture's stream, would keep the parameters' gradient accumulators of that stream
        # alive for every replay)

    def _backward(self, out):
        if not self.wants:
            return
        outs, _ = _outputs(out)
        diff = [o for o in outs if o.requires_grad]
        torch.autograd.grad(diff, self.wants, [torch.ones_like(o) for o in diff],
                            allow_unused=True)

    def valid(self, refs) -> bool:
        """The objects named by identity are still those, the parameters where they were,
        the random state the one captured against."""
        return (self.generation == _rng_generation[0] and _same(self.refs, refs)
                and [p.data_ptr() for p in self.params] == self.ptrs)

    def busy(self) -> bool:
        """A forward replay's backward is still pending (its values are in the pool)."""
        return self.pending is not None and self.pending() is not None

    def run(self, leaves):
        dst, src = [], []
        for i, t in enumerate(leaves):
            # (a first layer's input is the same unchanged tensor every step: no copy)
            last = self.sources[i]
            if last is None or last[0]() is not t or last[1] != t._version:
                dst.append(self.slots[i])
                src.append(t)
                self.sources[i] = (weakref.ref(t), t._version)
        _copy_all(dst, src)
        if self.bwd is None:
            self.fwd.replay()
            return self.rebuild(self.out_pack.fresh())
        outs = _Replay.apply(self, *[leaves[i] for i in self.grad_inputs], *self.grad_params)
        return self.rebuild(list(outs))


def _recover(stream) -> None:
    """Undo what a capture that failed part-way leaves behind.  torch's capture context
    raises from its end before it restores the thread's current stream, and the device's
    default random generator, put in capture mode when the capture began, leaves it only at
    a capture's successful end: every later random op outside a capture (a dropout) would
    fail.  The thread gets its stream back; the generator gets a fresh state with the same
    seed and offset; and since replays captured before draw from the old state, which would
    now repeat the new one's numbers, each is captured again (:data:`_rng_generation`)."""
    torch.cuda.set_stream(stream)
    gen = torch.cuda.default_generators[stream.device.index]
    gen.graphsafe_set_state(gen.clone_state())
    _rng_generation[0] += 1


class _Token:
    """Lives on one replay's autograd node: while it does, that replay's backward may run."""


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cap: _Captured, *wanted):
        cap.fwd.replay()
        ctx.cap, ctx.token = cap, _Token()
        cap.pending = weakref.ref(ctx.token)
        outs = tuple(cap.out_pack.fresh())
        ctx.mark_non_differentiable(*[o for o, d in zip(outs, cap.is_diff) if not d])
        return outs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *gouts):
        cap = ctx.cap
        if ctx.token is None or cap.pending is None or cap.pending() is not ctx.token:
            raise RuntimeError(
                "a hector layer's backward ran twice through one forward (its replayed "
                "forward's values were used by the first backward): run the forward inside "
                "`with hector.retain_saved():` to back-propagate more than once")
        dst, src = [], []
        for s, g in zip(cap.gouts, (g for g, d in zip(gouts, cap.is_diff) if d)):
            if g is None:
                s.zero_()
            else:
                dst.append(s)
                src.append(g)
        _copy_all(dst, src)
        cap.bwd.replay()
        cap.pending, ctx.token = None, None
        return (None, *cap.grad_pack.fresh())


# -- the per-layer table ------------------------------------------------------------------
class _Table:
    """A layer's signatures: eager-call counts, captures, and those that failed."""

    def __init__(self, params: list, stats: Optional[dict] = None):
        self.seen: "OrderedDict" = OrderedDict()
        self.epoch = _epoch[0]
        self.params = params
        self.stats = stats if stats is not None else dict(eager=0, captured=0, replayed=0,
                                                          failed=0)


FAILED = object()


class _Count:
    """Eager calls of one signature so far, and the objects they named by identity."""

    def __init__(self, calls: int, refs: list):
        self.calls = calls
        self.refs = _weak(refs)


def _weak(refs) -> list:
    """Weak references to the objects a signature names by identity."""
    return [weakref.ref(r) for r in refs]


def _same(weak: list, refs) -> bool:
    """The objects ``weak`` refers to are still alive and are ``refs``, one by one."""
    return all(r() is o for r, o in zip(weak, refs))


def _table(module) -> _Table:
    """The layer's table; started over when its parameters are other tensors than those its
    captures read (looked at only after some module registered a parameter, buffer or
    submodule: ``_epoch``)."""
    table = module.__dict__.get("_hector_warm")
    if table is None:
        table = module.__dict__["_hector_warm"] = _Table(list(module.parameters()))
    elif table.epoch != _epoch[0]:
        params = list(module.parameters())
        if len(params) != len(table.params) or any(
                p is not q for p, q in zip(params, table.params)):
            table = module.__dict__["_hector_warm"] = _Table(params, table.stats)
        table.epoch = _epoch[0]
    return table


def _settings(module) -> tuple:
    """The layer's plain attributes (hyper-parameters such as ``dropout``, the training
    flag): a capture is only valid for the values it was made with."""
    return tuple([(k, v) for k, v in module.__dict__.items()
                  if type(v) in _SCALAR_TYPES or (type(v) not in _CONTAINERS
                                                  and isinstance(v, _SCALARS))])


#: Exact types of plain attributes, and of the containers every module holds (its hooks and
#: parameter tables): both are told apart without an ``isinstance`` per attribute.
_SCALAR_TYPES = frozenset(_SCALARS)
_CONTAINERS = frozenset((dict, OrderedDict, set))


def _precision() -> tuple:
    """What decides how torch's own ops in a layer compute (a capture keeps its choice)."""
    return (tf32_allowed(), torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cuda"))


def _eligible() -> bool:
    return (enabled() and torch.cuda.is_available()     # (_untraced: not compiling either)
            and not torch.cuda.is_current_stream_capturing() and _untraced()
            and not C.debug_enabled() and not _retained() and not _saved_hooks())


_TOP_HOOKS = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


def _saved_hooks() -> bool:
    """Saved-tensor hooks are active (activation checkpointing, ``save_on_cpu``): they
    decide where a forward's saved values live, which a replay keeps in its graph's memory."""
    if _TOP_HOOKS is None:
        return False
    try:
        return _TOP_HOOKS(False) is not None
    except TypeError:          # (an older signature without ignore_is_tracing)
        return _TOP_HOOKS() is not None


def _retained() -> bool:
    return getattr(_RETAIN, "on", False)


def overlapping(tensors) -> bool:
    """Whether two of ``tensors`` share memory: a replay copies each into a buffer of its
    own, so inputs that alias would no longer alias.  Distinct views of one storage whose
    elements do not overlap (the per-type pieces of one split feature tensor, as HGT's
    ``x_dict`` often is) are separate inputs."""
    spans = {}
    for t in tensors:
        start = t.data_ptr()
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else -1
        spans.setdefault(t.untyped_storage().data_ptr(), []).append(
            (start, start + (last + 1) * t.element_size()))
    for group in spans.values():
        group.sort()
        if any(b[0] < a[1] for a, b in zip(group, group[1:])):
            return True
    return False


def _disjoint(entry, leaves: list) -> bool:
    """No two of ``leaves`` share memory (:func:`overlapping`).  For a captured signature,
    which fixes every leaf's extent, decided once per set of addresses."""
    if not isinstance(entry, _Captured):
        return not overlapping(leaves)
    ptrs = [t.data_ptr() for t in leaves]
    if ptrs != entry.disjoint_at:
        if overlapping(leaves):
            return False
        entry.disjoint_at = ptrs
    return True


def warm_call(module, forward: Callable, args: tuple, kwargs: dict):
    """``forward(module, *args, **kwargs)``, replayed from CUDA graphs once warm."""
    if not _eligible():
        return forward(module, *args, **kwargs)
    leaves, refs, edges = [], [], []
    try:
        sig = _flatten((args, kwargs), leaves, refs, edges)
    except _Unfit:
        return forward(module, *args, **kwargs)
    if sum(edges) > MAX_EDGES:
        return forward(module, *args, **kwargs)
    table = _table(module)
    key = (sig, _settings(module), torch.is_grad_enabled(), _precision(),
           tuple(p.requires_grad for p in table.params))
    entry = table.seen.get(key)
    if len(leaves) > 1 and not _disjoint(entry, leaves):
        return forward(module, *args, **kwargs)   # (aliased inputs: copies would not be)
    if isinstance(entry, _Captured):
        if entry.valid(refs):
            if not entry.busy():
                table.stats["replayed"] += 1
                return entry.run(leaves)
            table.stats["eager"] += 1
            return forward(module, *args, **kwargs)
        entry = None       # another object at a freed one's address, or moved parameters
    if entry is FAILED:
        table.stats["eager"] += 1
        return forward(module, *args, **kwargs)
    # (a count goes on only for the same live objects: a freed graph's address comes back
    # for the next one, and a loop that builds a graph per step never repeats a call)
    count = entry.calls + 1 if isinstance(entry, _Count) and _same(entry.refs, refs) else 1
    if count <= CALLS_BEFORE_CAPTURE:
        _remember(table, key, _Count(count, refs))
        table.stats["eager"] += 1
        return forward(module, *args, **kwargs)
    try:
        cap = _Captured(module, forward, args, kwargs, leaves, refs, table.params)
    except _Unfit:
        _remember(table, key, FAILED)
        return forward(module, *args, **kwargs)
    except RuntimeError as exc:     # (a launch the capture refused: run this one eagerly)
        torch.cuda.synchronize()
        warnings.warn(f"hector: {type(module).__name__}'s warm calls could not be captured "
                      f"in a CUDA graph and run eagerly ({str(exc)[:200]})", RuntimeWarning)
        _remember(table, key, FAILED)
        table.stats["failed"] += 1
        return forward(module, *args, **kwargs)
    _remember(table, key, cap)
    table.stats["captured"] += 1
    table.stats["replayed"] += 1
    return cap.run(leaves)


def _remember(table: _Table, key, value) -> None:
    table.seen[key] = value
    table.seen.move_to_end(key)
    while len(table.seen) > MAX_SIGNATURES:
        table.seen.popitem(last=False)


def warm_stats(module) -> dict:
    """Counts of a layer's calls since its parameters last changed: ``eager``, ``captured``,
    ``replayed``, ``failed`` (for tests and diagnostics)."""
    table = module.__dict__.get("_hector_warm")
    return dict(table.stats) if table is not None else dict(eager=0, captured=0, replayed=0,
                                                            failed=0)
