"""The fused edge attention's entry points on the Triton path: the ``torch.library`` custom
operators (``hector::edge_attention``, ``hector::edge_attention_backward``,
``hector::edge_attention_backward_into``) with their fake implementations and registered
autograd, the int handles that name a graph and a caller's (spec, plan) to them, the
``autograd.Function`` of a pinned schedule, and :func:`edge_attention_triton` /
:func:`edge_attention_grads_triton`, which the public op and the compiler call.  The ops are
registered when this module is imported (the public op in :mod:`.op` and the compiler import
it); the kernels they run are launched by :mod:`.launch`.

Saved for backward: the inputs themselves (references, no copies), the output ``o`` and one
fp32 log-sum-exp per (row, head) -- never the [E, H] attention weights.  The backward
recomputes ``alpha = exp(s - lse)`` on the fly (FlashAttention style); the row max is folded
into ``lse``, so it is not stored separately.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..eager import call
from ..handles import HandleTable, register_untraced
from ..reduce import column_sum
from .launch import (_check_joint, attention_backward, attention_forward, joint_of, rows_dense,
                     seed_tensor, term_rows)
from .plan import AttentionPlan, _memo_plan, make_plan, side_rows
from .spec import AttentionSpec, Schedule, shared_heads


class EdgeAttentionFunction(torch.autograd.Function):
    """A call with a pinned schedule (tests, tuning scripts); the rest runs the
    ``hector::edge_attention`` custom op (below)."""

    @staticmethod
    def forward(ctx, graph, spec: AttentionSpec, plan: AttentionPlan, params: tuple,
                v, q, k, a_src, a_dst, bias=None, k_norm=None):
        out, lse = attention_forward(graph, spec, plan, params, v, q, k, a_src, a_dst, bias,
                                     k_norm=k_norm)
        ctx.graph, ctx.spec, ctx.plan, ctx.params = graph, spec, plan, params
        ctx.save_for_backward(v, q, k, a_src, a_dst, out, lse, bias, k_norm)
        return out

    @staticmethod
    def backward(ctx, dout):
        *saved, bias, k_norm = ctx.saved_tensors
        dout = dout.contiguous()
        grads = attention_backward(ctx.graph, ctx.spec, ctx.plan, ctx.params,
                                   tuple(ctx.needs_input_grad[4:9]), dout, *saved, bias=bias,
                                   k_norm=k_norm)
        dbias = bias_grad(dout, bias) if ctx.needs_input_grad[9] else None
        return (None, None, None, None, *grads, dbias, None)


# -- the custom operators (torch.library) ---------------------------------------------------
# Opaque custom ops rather than ``triton_op``: inductor tracing into the attention template was
# seen to re-type its running max ``m_i`` from fp32 to fp64, and the launch code around the
# kernels (strategy choice, chunk tables, autotuning) reads host values that must stay out of
# a traced graph anyway.  torch.compile and CUDA-graph capture see one node per direction with
# a shape-only fake implementation.  Ops take no Python objects: the graph travels as an int
# handle (``graph_handle``), the spec is rebuilt from the tensors, the plan is memoised per
# (graph, spec, strategy) inside the op.  The dropout seed travels as a one-element device
# tensor (``seed_tensor``; the int ``seed`` is only used when it is None): the kernels read it
# from memory, so a captured graph that redraws it on the device (``op.draw_seed``) drops a
# fresh mask on every replay.

#: Graph handles for the ops (weak: a freed mini-batch graph's entry goes with it).
_GRAPHS = HandleTable("_attention_op_handle", "graph")


def graph_handle(graph) -> int:
    """A process-unique int naming ``graph`` for the custom ops (memoised on the graph)."""
    return _GRAPHS.handle(graph)


def _graph(handle: int):
    return _GRAPHS.get(handle)


class _Launch:
    """(spec, plan) of one launch handle, an object the table can hold weakly."""
    __slots__ = ("spec", "plan", "_launch_handle", "__weakref__")

    def __init__(self, spec: AttentionSpec, plan: AttentionPlan):
        self.spec, self.plan = spec, plan
        self._launch_handle = None


#: launch handle -> (spec, plan) a caller decided (the compiler's attention steps).  Weak: the
#: plan holds its entry, and the plan lives as long as whoever chose it keeps it (the
#: compiler: memoised on the graph's index), so a mini-batch's entries go with its graph.
_LAUNCHES = HandleTable("_launch_handle", "launch")


def _entry(spec: AttentionSpec, plan: AttentionPlan) -> _Launch:
    """The (spec, plan) entry memoised on ``plan`` (a copy of the plan, or another spec, gets
    its own): frozen dataclass, so a memo only.  Specs compare by value: a caller that
    rebuilds an equal spec per call keeps its entry, and so its handle (traced code guards
    on the handle: a new one per call would recompile every call)."""
    entry = getattr(plan, "_launch_entry", None)
    if entry is None or entry.plan is not plan or entry.spec != spec:
        entry = _Launch(spec, plan)
        object.__setattr__(plan, "_launch_entry", entry)
    return entry


def _entry_handle(spec: AttentionSpec, plan: AttentionPlan) -> int:
    return _LAUNCHES.handle(_entry(spec, plan))


def prepare_handles(graph, spec: Optional[AttentionSpec] = None,
                    plan: Optional[AttentionPlan] = None) -> None:
    """Under ``torch.compile``: the handles of ``graph`` and of (``spec``, ``plan``) made
    outside the trace where new, by a statement before the op call that reads them
    (:meth:`HandleTable.prepare` says why); eagerly nothing."""
    if torch.compiler.is_compiling():
        _GRAPHS.prepare(graph)
        if plan is not None and getattr(plan, "_launch_entry", None) is None:
            register_untraced(_entry_handle, spec, plan)


def launch_handle(graph, spec: AttentionSpec, plan: AttentionPlan) -> int:
    """A process-unique int naming the caller's (spec, plan) for the custom op, memoised on
    the plan object (a copy gets its own), so the op launches exactly those objects."""
    if torch.compiler.is_compiling():
        # (dynamo cannot build the entry; prepare_handles made it outside the trace, or:)
        if getattr(plan, "_launch_entry", None) is None:
            register_untraced(_entry_handle, spec, plan)
        return _LAUNCHES.handle(plan._launch_entry)
    return _entry_handle(spec, plan)


def _op_setup(handle, v, q, a_src, a_dst, negative_slope, dropout, strategy, launch=0,
              k=None, k_norm=None):
    """(graph, spec, plan) of one op call: the caller's (``launch`` > 0), or derived from the
    tensors with the plan memoised per (graph, spec, strategy)."""
    graph = _graph(handle)
    if launch:
        entry = _LAUNCHES.get(launch)
        return graph, entry.spec, entry.plan
    spec = AttentionSpec.of(v, q, a_src, a_dst, negative_slope, has_dropout=dropout > 0, k=k,
                            k_norm=k_norm)
    return graph, spec, _memo_plan(graph, spec, strategy)


@torch.library.custom_op("hector::edge_attention", mutates_args=())
def edge_attention_op(graph: int, v: torch.Tensor, q: Optional[torch.Tensor],
                      k: Optional[torch.Tensor], a_src: Optional[torch.Tensor],
                      a_dst: Optional[torch.Tensor], scale: float,
                      negative_slope: Optional[float], dropout: float, seed: int,
                      strategy: str, launch: int, seed_tensor: Optional[torch.Tensor] = None,
                      bias: Optional[torch.Tensor] = None,
                      dst_index: Optional[torch.Tensor] = None,
                      k_norm: Optional[torch.Tensor] = None
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out ``[N, H, Dv]``, lse ``[N, H]`` fp32, kept for the backward); ``bias`` ``[H, Dv]``:
    added to every output row by the kernels' epilogue; ``dst_index``: see
    :func:`attention_forward` (only with a caller's spec, ``launch``); ``k_norm``: k's rows
    are v's divided by it (``AttentionSpec.normed_k``)."""
    g, spec, plan = _op_setup(graph, v, q, a_src, a_dst, negative_slope, dropout, strategy,
                              launch, k, k_norm)
    return attention_forward(g, spec, plan, (scale, negative_slope, dropout,
                                             _seed_of(seed, seed_tensor)), v, q, k, a_src, a_dst,
                             bias, dst_index, k_norm)


def _seed_of(seed: int, seed_tensor: Optional[torch.Tensor]):
    return seed_tensor if seed_tensor is not None else seed


@edge_attention_op.register_fake
def _(graph, v, q, k, a_src, a_dst, scale, negative_slope, dropout, seed, strategy, launch,
      seed_tensor=None, bias=None, dst_index=None, k_norm=None):
    n = side_rows(_graph(graph), "dst")
    return (v.new_empty((n,) + tuple(v.shape[1:])),
            v.new_empty((n, v.shape[1]), dtype=torch.float32))


@torch.library.custom_op("hector::edge_attention_backward", mutates_args=())
def edge_attention_backward_op(
        graph: int, dout: torch.Tensor, v: torch.Tensor, q: Optional[torch.Tensor],
        k: Optional[torch.Tensor], a_src: Optional[torch.Tensor], a_dst: Optional[torch.Tensor],
        out: torch.Tensor, lse: torch.Tensor, scale: float, negative_slope: Optional[float],
        dropout: float, seed: int, strategy: str, launch: int,
        needs: List[bool], seed_tensor: Optional[torch.Tensor] = None,
        dlse: Optional[torch.Tensor] = None,
        bias: Optional[torch.Tensor] = None,
        dst_index: Optional[torch.Tensor] = None, joint_kv: bool = False,
        k_norm: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """[dv, dq, dk, d a_src, d a_dst]; a gradient not asked for is an empty tensor (a
    schema output cannot be None).  ``dlse``: the log-sum-exp output's gradient, if any;
    ``bias``, ``dst_index``: see :func:`attention_backward` (the bias's own
    gradient is a column sum of ``dout``, taken by the autograd formula).

    ``joint_kv`` (both the k and the v gradient asked for): ``[empty, dq, dkv, d a_src,
    d a_dst]`` with ``dkv`` ``[n_src, H*DK + H*DV]``, dk's columns first: the gradient of a
    GEMM that computed K and V into one buffer, written by the kernels in place (no
    concatenation).  One tensor in dk's slot and an empty one in dv's, since a custom op's
    outputs must not alias each other."""
    g, spec, plan = _op_setup(graph, v, q, a_src, a_dst, negative_slope, dropout, strategy,
                              launch, k, k_norm)
    # Positional: the compiler's tests spy on attention_backward with (graph, spec, plan, *rest).
    grads = list(attention_backward(g, spec, plan, (scale, negative_slope, dropout,
                                                    _seed_of(seed, seed_tensor)),
                                    tuple(needs), dout, v, q, k, a_src, a_dst, out, lse,
                                    None if dlse is None else dlse.float(), bias, dst_index,
                                    joint_kv, False, k_norm))
    if joint_kv:
        grads[0], grads[2] = None, joint_of(grads[2], grads[0])
    return [gr if gr is not None else v.new_empty(0) for gr in grads]


@torch.library.custom_op("hector::edge_attention_backward_into", mutates_args=("v", "k"))
def edge_attention_backward_into_op(
        graph: int, dout: torch.Tensor, v: torch.Tensor, q: Optional[torch.Tensor],
        k: Optional[torch.Tensor], a_src: Optional[torch.Tensor], a_dst: Optional[torch.Tensor],
        out: torch.Tensor, lse: torch.Tensor, scale: float, negative_slope: Optional[float],
        launch: int, needs: List[bool], bias: Optional[torch.Tensor] = None,
        dst_index: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """``hector::edge_attention_backward`` (no dropout) that writes dv over ``v`` and dk
    over ``k`` (each where ``needs`` asks for it; both given, in the op's order [v, q, k,
    a_src, a_dst]) and returns ``[dq, d a_src, d a_dst]`` (empty where not asked for): a
    backward that reads the forward's k and v for the last time needs no second buffer of
    their size (HGT and RGAT on wikikg2: 6.2 and 3.1 GiB).  A custom op's outputs may not
    alias its inputs, so the two gradients are the mutated inputs themselves."""
    g, spec, plan = _op_setup(graph, v, q, a_src, a_dst, negative_slope, 0.0, "auto", launch)
    grads = attention_backward(g, spec, plan, (scale, negative_slope, 0.0, 0), tuple(needs),
                               dout, v, q, k, a_src, a_dst, out, lse, None, bias, dst_index,
                               False, True)
    return [gr if gr is not None else v.new_empty(0) for gr in (grads[1], grads[3], grads[4])]


@edge_attention_backward_into_op.register_fake
def _(graph, dout, v, q, k, a_src, a_dst, out, lse, scale, negative_slope, launch, needs,
      bias=None, dst_index=None):
    # (no _check_into here: a fake tensor has no data pointers; the real op checks)
    n_src, n = v.shape[0], side_rows(_graph(graph), "dst")
    rows = (n, n_src, a_dst.shape[0] if a_dst is not None else n)
    return [v.new_empty((r,) + tuple(t.shape[1:]), dtype=t.dtype)
            if need and t is not None else v.new_empty(0)
            for t, need, r in zip((q, a_src, a_dst), (needs[1], needs[3], needs[4]), rows)]


@edge_attention_backward_op.register_fake
def _(graph, dout, v, q, k, a_src, a_dst, out, lse, scale, negative_slope, dropout, seed,
      strategy, launch, needs, seed_tensor=None, dlse=None, bias=None, dst_index=None,
      joint_kv=False, k_norm=None):
    # Gradients have their side's rows (v's for the sources); a_dst's has its own rows (a
    # per-edge destination term's are (dst, relation) rows).
    _check_joint(joint_kv, needs[2], needs[0])
    n_src, n = v.shape[0], side_rows(_graph(graph), "dst")
    rows = [n_src, n, n_src, n_src, a_dst.shape[0] if a_dst is not None else n]
    grads = [v.new_empty((r,) + tuple(t.shape[1:]), dtype=t.dtype)
             if need and t is not None else v.new_empty(0)
             for t, need, r in zip((v, q, k, a_src, a_dst), needs, rows)]
    if joint_kv:
        width = k.shape[1] * k.shape[2] + v.shape[1] * v.shape[2]
        grads[0], grads[2] = v.new_empty(0), v.new_empty((n_src, width), dtype=k.dtype)
    return grads


def _setup_context(ctx, inputs, output):
    graph, v, q, k, a_src, a_dst, *rest = inputs
    # rest: scale, slope, dropout, seed, strategy, launch, then the optional seed_tensor,
    # bias, dst_index and k_norm.
    scalars = rest[:6]
    seed_t, bias, dst_index, k_norm = (list(rest[6:10]) + [None] * 4)[:4]
    ctx.graph, ctx.scalars = graph, scalars
    # The seed tensor is saved too: the backward redraws the forward's mask from it.
    ctx.save_for_backward(v, q, k, a_src, a_dst, *output, seed_t, bias, dst_index, k_norm)


def _autograd_backward(ctx, dout, dlse):
    needs = list(ctx.needs_input_grad[1:6])
    *saved, seed_t, bias, dst_index, k_norm = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(saved[-2])
    grads = call(edge_attention_backward_op, ctx.graph, dout, *saved, *ctx.scalars, needs,
                 seed_t, dlse, bias=bias, dst_index=dst_index, k_norm=k_norm)
    need_bias = len(ctx.needs_input_grad) > 13 and ctx.needs_input_grad[13]
    # (k_norm carries no gradient: the caller's k does, which the norm only describes)
    return (None, *[g if need else None for g, need in zip(grads, needs)],
            None, None, None, None, None, None, None,
            bias_grad(dout, bias) if need_bias else None, None, None)


def bias_grad(dout: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The epilogue bias's gradient: for a per-column ``[H, Dv]`` bias ``dout`` summed over
    its rows, as a GEMV against a ones vector (a column reduction ran far below bandwidth on
    the H200); for a row-wise ``[rows, H, Dv]`` addend ``dout`` itself."""
    if bias.dim() == 3:
        return dout.to(bias.dtype)
    # (bias.numel(), not -1: a graph without nodes has 0 rows, where -1 is ambiguous)
    return column_sum(dout.reshape(dout.shape[0], bias.numel())).reshape(bias.shape).to(
        bias.dtype)


edge_attention_op.register_autograd(_autograd_backward, setup_context=_setup_context)


def edge_attention_grads_triton(graph, spec: AttentionSpec, plan: AttentionPlan, needs,
                                dout, v, q, k, a_src, a_dst, out, lse, scale: float,
                                negative_slope: Optional[float],
                                dst_index: Optional[torch.Tensor] = None,
                                joint_kv: bool = False,
                                bias: Optional[torch.Tensor] = None,
                                into_kv: bool = False, dropout: float = 0.0,
                                seed: Optional[torch.Tensor] = None,
                                k_norm: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """The fused backward as the ``hector::edge_attention_backward`` op, called directly by
    the compiler's backward plan (whose IR autodiff differentiated the attention as one
    operator): ``[dv, dq, dk, d a_src, d a_dst]`` for ``needs`` (same order), an empty tensor
    where not asked for.  ``out``, ``lse``: the forward's (``return_lse`` below).
    ``dropout``, ``seed``: the forward's (its seed tensor: the same mask is drawn again).
    ``dst_index``: see :func:`attention_backward`.  ``k``, ``v``: any row stride (column
    slices of one K|V GEMM output are not copied: :func:`rows_dense`).  ``joint_kv``: dk and
    dv as one ``[n_src, H*DK + H*DV]`` tensor in dk's slot, an empty one in dv's (see the
    op).  ``bias``: the forward's epilogue bias ``[H, Dv]`` (``out`` includes it); its own
    gradient is the caller's.

    ``into_kv``: dv and dk written over ``v`` and ``k`` themselves, which the caller reads
    for the last time here (``hector::edge_attention_backward_into``; they must need no
    copy and not overlap); the same return value, the gradients being those tensors (with
    ``joint_kv``, :func:`joint_of` them: the buffer they are column slices of).

    ``k_norm``: the forward's (``spec.normed_k``: k's rows are v's divided by it)."""
    _check_joint(joint_kv, needs[2], needs[0])
    if dropout > 0 and into_kv:
        raise ValueError("into_kv: the in-place backward takes no dropout")
    if k_norm is not None and into_kv:
        raise ValueError("into_kv: the in-place backward takes no k_norm")
    prepare_handles(graph, spec, plan)
    # (k and v go in as they are when written over: the op refuses what it would copy)
    tensors = [t if into_kv and name in ("k", "v") else _operand(t, name)
               for t, name in zip((v, q, k, a_src, a_dst), _OPERANDS)]
    if into_kv:
        dq, da_src, da_dst = call(edge_attention_backward_into_op, graph_handle(graph),
                                  dout.contiguous(), *tensors, out.contiguous(),
                                  lse.contiguous(), float(scale), negative_slope,
                                  launch_handle(graph, spec, plan), list(needs),
                                  bias=bias,
                                  dst_index=dst_index)
        dv, dk = (t if need else v.new_empty(0)
                  for t, need in ((tensors[0], needs[0]), (tensors[2], needs[2])))
        if joint_kv:
            dv, dk = v.new_empty(0), joint_of(dk, dv)
        return [dv, dq, dk, da_src, da_dst]
    return call(edge_attention_backward_op, graph_handle(graph), dout.contiguous(), *tensors,
                out.contiguous(), lse.contiguous(), float(scale), negative_slope,
                float(dropout), 0, "auto", launch_handle(graph, spec, plan), list(needs),
                seed_tensor=seed_tensor(seed, v.device) if dropout > 0 else None,
                dst_index=dst_index, joint_kv=joint_kv, bias=bias, k_norm=k_norm)


_OPERANDS = ("v", "q", "k", "a_src", "a_dst")


def _operand(t: Optional[torch.Tensor], name: str, shared: bool = False) -> Optional[torch.Tensor]:
    """An input as the kernels take it: q, k and v with any row stride (no copy of a slice
    of a joint Q|K|V buffer), the score terms too (:func:`term_rows`); k and v as they are
    when ``shared`` (one row read by every head: ``spec.shared_heads``)."""
    if t is None:
        return None
    if shared and name in ("k", "v"):
        return t
    return rows_dense(t) if name in ("q", "k", "v") else term_rows(t)


def edge_attention_triton(graph, v, q=None, k=None, a_src=None, a_dst=None, scale=1.0,
                          negative_slope=None, dropout=0.0, seed=None, strategy="auto",
                          schedule: Optional[Schedule] = None, *,
                          spec: Optional[AttentionSpec] = None,
                          plan: Optional[AttentionPlan] = None, return_lse: bool = False,
                          bias: Optional[torch.Tensor] = None,
                          dst_index: Optional[torch.Tensor] = None,
                          k_norm: Optional[torch.Tensor] = None):
    """The Triton path of :func:`hector.kernels.attention.op.edge_attention` (inputs already
    validated): the ``hector::edge_attention`` custom op, or with a pinned ``schedule`` the
    ``autograd.Function``.  ``spec`` / ``plan``: decided by the caller (the compiler) and
    launched as given (the op receives them by handle); otherwise derived from the tensors
    and planned here (inside the op, memoised per graph).  ``return_lse``: (out, the
    per-destination log-sum-exp ``[N, H]`` fp32) for a caller that runs the backward itself
    (not with a pinned ``schedule``).  ``bias``: ``[H, Dv]`` or row-wise ``[rows, H, Dv]``,
    added by the epilogue (read as the launch code normalises it: :func:`.launch.rows_dense`).
    ``dst_index``: each canonical edge's row of ``a_dst`` (a per-edge destination term; the
    caller's ``spec`` says ``dst_edge``).  ``k``, ``v``: any row stride (:func:`rows_dense`:
    column slices of one K|V GEMM output are read in place).  ``k_norm``: ``[N]`` fp32, k's
    rows as v's divided by it (:attr:`AttentionSpec.normed_k`: v is gathered once per edge)."""
    shared = shared_heads(v, k)      # (what AttentionSpec.of finds for these tensors)
    tensors = [_operand(t, name, shared) for t, name in zip((v, q, k, a_src, a_dst), _OPERANDS)]
    if schedule is None:
        if spec is None and (plan is not None or dst_index is not None):
            spec = AttentionSpec.of(v, q, a_src, a_dst, negative_slope, has_dropout=dropout > 0,
                                    dst_index=dst_index, k=k, k_norm=k_norm)
        # A caller's spec without a plan gets the memoised plan: one handle per (graph, spec),
        # not a new plan and handle every call.
        if spec is not None and plan is None:
            plan = _memo_plan(graph, spec, strategy)
        prepare_handles(graph, spec, plan)
        seed_t = seed_tensor(seed, v.device) if dropout > 0 else None
        out = call(edge_attention_op, graph_handle(graph), *tensors, float(scale),
                   negative_slope, float(dropout), 0, strategy,
                   0 if plan is None else launch_handle(graph, spec, plan), seed_t, bias,
                   dst_index, k_norm)
        return out if return_lse else out[0]
    if return_lse or dst_index is not None:
        raise ValueError("return_lse and dst_index need the custom op's path (no pinned "
                         "schedule)")
    if spec is None:
        spec = AttentionSpec.of(v, q, a_src, a_dst, negative_slope, has_dropout=dropout > 0,
                                k=k, k_norm=k_norm)
    if plan is None:
        plan = make_plan(graph, spec, strategy, schedule)
    return EdgeAttentionFunction.apply(graph, spec, plan, (scale, negative_slope, dropout, seed),
                                       *tensors, bias, k_norm)
