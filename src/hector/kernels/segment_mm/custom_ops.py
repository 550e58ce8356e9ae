"""The segment GEMM's entry points on the Triton path: the ``torch.library`` custom operators
(``hector::segment_mm`` and its backward, ``hector::segment_mm_extra``,
``hector::segment_mm_wgrad`` / ``_wgrad_sums`` / ``_wgrad_csr``, ``hector::segment_mm_csr``,
``hector::segment_mm_csr_scatter``) with their fake implementations and registered autograd,
the ``autograd.Function`` of a pinned schedule, :func:`segment_sums` (a bias gradient) and
:func:`segment_mm_triton`, which the public op calls.  The ops are registered when this module
is imported (the public op in :mod:`.op` and the compiler's ``steps_triton.gemm`` import it);
the kernels they run are launched by :mod:`.launch`, separate so that the launch code stays
free of op registration.

The launches are looked up through :mod:`.launch` at call time (``_launch.launch_gemm``), so
that a patch of ``launch.launch_gemm`` sees every launch, these ops' included.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from ...device import interpreting
from ..eager import call
from . import launch as _launch
from .bounds import Bounds, as_bounds, layout, num_segments, op_args, total_rows
from .launch import ScheduleChoice, _backward, _forward, out_width, pick_schedule
from .reference import csr_rows_torch, csr_rows_transposed_torch
from .spec import GemmSchedule, GemmSpec, default_schedule


class SegmentMMFunction(torch.autograd.Function):
    """A call with a pinned schedule (tests, tuning scripts).  Saved for backward: the inputs
    themselves (references, no copies) -- neither the gathered rows ``a_r`` nor anything per
    row of the weight."""

    @staticmethod
    def forward(ctx, spec: GemmSpec, choice: ScheduleChoice, bounds: Tuple[int, ...],
                num_out_rows: int, x, weight, gather, scatter, bias=None, addend=None):
        out, sched = _forward(spec, choice, bounds, num_out_rows, x, weight, gather, scatter,
                              bias, addend)
        ctx.addend_dtype = addend.dtype if addend is not None else None
        ctx.spec, ctx.choice, ctx.sched, ctx.bounds = spec, choice, sched, bounds
        ctx.save_for_backward(x, weight, gather, scatter)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        x, weight, gather, scatter = ctx.saved_tensors
        dx, dw = _backward(ctx.spec, ctx.choice, ctx.sched, ctx.bounds, dout, x, weight,
                           gather, scatter, *ctx.needs_input_grad[4:6])
        db = (segment_sums(dout, ctx.bounds, scatter) if ctx.needs_input_grad[8] else None)
        da = dout.to(ctx.addend_dtype) if ctx.needs_input_grad[9] else None
        return None, None, None, None, dx, dw, None, None, db, da


# -- the custom operators (torch.library) ---------------------------------------------------
# The unpinned call is an *opaque* custom op: torch.compile and CUDA-graph capture see one
# node with a fake (shape-only) implementation and never trace into the launch code (schedule
# choice, autotuning, tile maps all read host values).  Static choices travel as ints/bools;
# the segment bounds as ``int[]`` (they are Python ints already: op.py reads seg_ptr once),
# or, for bounds kept on the device (``bounds.DeviceBounds``), ``[capacity]`` and the
# ``seg_ptr`` tensor (the ops that take one: segment_mm, its backward and extra, the weight
# gradients).

def _spec_of(x, weight, gather, scatter, transpose_weight: bool, unique: Tuple[bool, bool],
             has_bias: bool = False, prologue: str = "", has_csr: bool = False,
             has_addend: bool = False, extra_cols: int = 0) -> GemmSpec:
    n = out_width(weight, transpose_weight)
    return GemmSpec.of(x, gather, scatter, transpose_weight, n, *unique, has_bias=has_bias,
                       prologue=prologue, has_csr=has_csr, has_addend=has_addend,
                       extra_cols=extra_cols)


@torch.library.custom_op("hector::segment_mm", mutates_args=())
def segment_mm_op(x: torch.Tensor, weight: torch.Tensor, gather: Optional[torch.Tensor],
                  scatter: Optional[torch.Tensor], bounds: List[int], num_out_rows: int,
                  transpose_weight: bool, gather_unique: bool = False,
                  scatter_unique: bool = False, bias: Optional[torch.Tensor] = None,
                  prologue: str = "", addend: Optional[torch.Tensor] = None,
                  seg_ptr: Optional[torch.Tensor] = None) -> torch.Tensor:
    spec = _spec_of(x, weight, gather, scatter, transpose_weight, (gather_unique, scatter_unique),
                    bias is not None, prologue, has_addend=addend is not None)
    return _forward(spec, None, layout(bounds, seg_ptr), num_out_rows, x, weight, gather,
                    scatter, bias, addend)[0]


@segment_mm_op.register_fake
def _(x, weight, gather, scatter, bounds, num_out_rows, transpose_weight, gather_unique=False,
      scatter_unique=False, bias=None, prologue="", addend=None, seg_ptr=None):
    n = out_width(weight, transpose_weight)
    rows = num_out_rows if scatter is not None else bounds[-1]
    return x.new_empty(rows, n)


@torch.library.custom_op("hector::segment_mm_backward", mutates_args=())
def segment_mm_backward_op(dout: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                           gather: Optional[torch.Tensor], scatter: Optional[torch.Tensor],
                           bounds: List[int], transpose_weight: bool, need_x: bool,
                           need_w: bool, gather_unique: bool = False,
                           scatter_unique: bool = False, prologue: str = "",
                           seg_ptr: Optional[torch.Tensor] = None
                           ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(dx, dW); a gradient not asked for is an empty tensor (a schema output cannot be None)."""
    spec = _spec_of(x, weight, gather, scatter, transpose_weight, (gather_unique, scatter_unique),
                    prologue=prologue)
    bounds = layout(bounds, seg_ptr)
    # The forward's schedule: the autotuner's memo returns the same pick for the same key.
    sched = pick_schedule(spec, None, bounds, x.device, lambda s: _launch.launch_gemm(
        spec, s, bounds, x, weight, gather, scatter,
        dout.shape[0] if scatter is not None else total_rows(bounds)))
    dx, dw = _backward(spec, None, sched, bounds, dout, x, weight, gather, scatter, need_x,
                       need_w)
    return (dx if dx is not None else x.new_empty(0),
            dw if dw is not None else weight.new_empty(0))


@segment_mm_backward_op.register_fake
def _(dout, x, weight, gather, scatter, bounds, transpose_weight, need_x, need_w,
      gather_unique=False, scatter_unique=False, prologue="", seg_ptr=None):
    return (torch.empty_like(x) if need_x else x.new_empty(0),
            torch.empty_like(weight) if need_w else weight.new_empty(0))


def _setup_context(ctx, inputs, output):
    x, weight, gather, scatter, bounds, _, transpose_weight, *rest = inputs
    seg_ptr = rest[5] if len(rest) > 5 else None
    ctx.save_for_backward(x, weight, gather, scatter, seg_ptr)
    ctx.bounds, ctx.transpose_weight, ctx.unique = list(bounds), transpose_weight, rest[:2]
    ctx.prologue = rest[3] if len(rest) > 3 else ""
    addend = rest[4] if len(rest) > 4 else None
    ctx.addend_dtype = addend.dtype if addend is not None else None


def _autograd_backward(ctx, dout):
    x, weight, gather, scatter, seg_ptr = ctx.saved_tensors
    need_x, need_w = ctx.needs_input_grad[:2]
    dx = dw = None
    if need_x or need_w:
        dx, dw = call(segment_mm_backward_op, dout, x, weight, gather, scatter, ctx.bounds,
                      ctx.transpose_weight, need_x, need_w, *ctx.unique, ctx.prologue, seg_ptr)
    need_b = len(ctx.needs_input_grad) > 9 and ctx.needs_input_grad[9]
    need_a = len(ctx.needs_input_grad) > 11 and ctx.needs_input_grad[11]
    # (one gradient per op input: x, weight, seven that have none, the bias, the prologue,
    # the addend: each output row's addend row gets that row's gradient; the bounds' seg_ptr)
    grads = ((dx if need_x else None, dw if need_w else None) + (None,) * 7
             + (segment_sums(dout, layout(ctx.bounds, seg_ptr), scatter) if need_b else None,
                None, dout.to(ctx.addend_dtype) if need_a else None))
    return grads + (None,) * (len(ctx.needs_input_grad) - len(grads))


segment_mm_op.register_autograd(_autograd_backward, setup_context=_setup_context)


@torch.library.custom_op("hector::segment_mm_extra", mutates_args=())
def segment_mm_extra_op(x: torch.Tensor, weight: torch.Tensor, gather: Optional[torch.Tensor],
                        bounds: List[int], extra_weight: torch.Tensor,
                        gather_unique: bool = False, seg_ptr: Optional[torch.Tensor] = None,
                        transpose_weight: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(y, y @ V)``: ``y`` the segment GEMM ``x[gather[r]] @ W[s]`` (``W[s]^T`` when
    ``transpose_weight``) stored row by row and ``V`` = ``extra_weight`` ``[N, E]`` applied
    by its epilogue to each fp32 row of ``y`` (``GemmSpec.extra_cols``)."""
    spec = _spec_of(x, weight, gather, None, transpose_weight, (gather_unique, False),
                    extra_cols=extra_weight.shape[1])
    bounds = layout(bounds, seg_ptr)

    def run(sched):
        return _launch.launch_gemm(spec, sched, bounds, x, weight, gather, None,
                                   total_rows(bounds), extra_weight=extra_weight)
    return run(pick_schedule(spec, None, bounds, x.device, run))


@segment_mm_extra_op.register_fake
def _(x, weight, gather, bounds, extra_weight, gather_unique=False, seg_ptr=None,
      transpose_weight=False):
    return (x.new_empty(bounds[-1], out_width(weight, transpose_weight)),
            x.new_empty(bounds[-1], extra_weight.shape[1]))


def _extra_setup_context(ctx, inputs, output):
    x, weight, gather, bounds, extra_weight, gather_unique, *rest = inputs
    ctx.save_for_backward(x, weight, gather, extra_weight, output[0],
                          rest[0] if rest else None)
    ctx.bounds, ctx.gather_unique = list(bounds), gather_unique
    ctx.transpose_weight = bool(rest[1]) if len(rest) > 1 else False


def _extra_backward(ctx, dy, dmore):
    """``y``'s gradient takes ``dmore @ V^T`` too (in fp32 at least); ``dV = y^T dmore``;
    then the segment GEMM's own backward."""
    x, weight, gather, extra_weight, y, seg_ptr = ctx.saved_tensors
    need_x, need_w, _, _, need_v = ctx.needs_input_grad[:5]
    work = torch.promote_types(y.dtype, torch.float32)
    if dy is None:
        dy = torch.zeros_like(y)
    dv = None
    if dmore is not None:
        dm = dmore.to(work)
        dy = (dy.to(work) + dm @ extra_weight.to(work).t()).to(y.dtype)
        dv = (y.to(work).t() @ dm).to(extra_weight.dtype) if need_v else None
    dx = dw = None
    if need_x or need_w:
        dx, dw = call(segment_mm_backward_op, dy, x, weight, gather, None, ctx.bounds,
                      ctx.transpose_weight, need_x, need_w, ctx.gather_unique, False, "",
                      seg_ptr)
    grads = (dx if need_x else None, dw if need_w else None, None, None, dv, None)
    return grads + (None,) * (len(ctx.needs_input_grad) - len(grads))


segment_mm_extra_op.register_autograd(_extra_backward, setup_context=_extra_setup_context)


@torch.library.custom_op("hector::segment_mm_wgrad", mutates_args=())
def segment_mm_wgrad_op(x: torch.Tensor, dy: torch.Tensor, gather: Optional[torch.Tensor],
                        scatter: Optional[torch.Tensor], bounds: List[int],
                        prologue: str = "", seg_ptr: Optional[torch.Tensor] = None,
                        transpose: bool = False) -> torch.Tensor:
    """``dW [S, K, N]``, ``dW[s] = sum_{r in s} f(x_{g(r)})^T dy_{c(r)}`` (the compiler's
    weight-gradient steps; ``f`` the forward's ``prologue``, or none), tiled by the heuristic
    schedule; with ``transpose``, ``[S, N, K]``: the same sums stored transposed by the
    kernel (the gradient of a weight stored ``[N, K]``)."""
    return _wgrad_heuristic(x, dy, gather, scatter, layout(bounds, seg_ptr), sums=False,
                            prologue=prologue, transpose=transpose)


def _wgrad_heuristic(x, dy, gather, scatter, bounds: Bounds, sums: bool, prologue: str = "",
                     transpose: bool = False):
    spec = GemmSpec.of(x, gather, scatter, transpose, dy.shape[1], prologue=prologue)
    sched = default_schedule(spec, interpreting=interpreting())
    like = _wgrad_fake(x, dy, bounds, "meta", transpose)
    return _launch.launch_wgrad(spec, sched, bounds, x, gather, dy, scatter, like, sums=sums)


def _wgrad_fake(x, dy, bounds: Bounds, device=None, transpose: bool = False):
    k, n = x.shape[1], dy.shape[1]
    return torch.empty((num_segments(bounds),) + ((n, k) if transpose else (k, n)),
                       dtype=x.dtype, device=device or x.device)


segment_mm_wgrad_op.register_fake(
    lambda x, dy, gather, scatter, bounds, prologue="", seg_ptr=None, transpose=False:
    _wgrad_fake(x, dy, layout(bounds, seg_ptr), transpose=transpose))


@torch.library.custom_op("hector::segment_mm_wgrad_sums", mutates_args=())
def segment_mm_wgrad_sums_op(x: torch.Tensor, dy: torch.Tensor, gather: Optional[torch.Tensor],
                             scatter: Optional[torch.Tensor], bounds: List[int],
                             prologue: str = "", seg_ptr: Optional[torch.Tensor] = None,
                             transpose: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(dW, db)``: ``segment_mm_wgrad``'s ``dW`` (``transpose`` as there) and, from the
    same read of ``dy``, the per-segment row sums ``db [S, N]`` (a typed linear's weight and
    bias gradients in one launch)."""
    return _wgrad_heuristic(x, dy, gather, scatter, layout(bounds, seg_ptr), sums=True,
                            prologue=prologue, transpose=transpose)


@segment_mm_wgrad_sums_op.register_fake
def _(x, dy, gather, scatter, bounds, prologue="", seg_ptr=None, transpose=False):
    bounds = layout(bounds, seg_ptr)
    return (_wgrad_fake(x, dy, bounds, transpose=transpose),
            torch.empty((num_segments(bounds), dy.shape[1]), dtype=x.dtype, device=x.device))


@torch.library.custom_op("hector::segment_mm_csr", mutates_args=())
def segment_mm_csr_op(x: torch.Tensor, weight: torch.Tensor, csr_ptr: torch.Tensor,
                      csr_col: torch.Tensor, csr_val: torch.Tensor,
                      gather: Optional[torch.Tensor], scatter: Optional[torch.Tensor],
                      bounds: List[int], num_out_rows: int, transpose_weight: bool,
                      gather_unique: bool = False, scatter_unique: bool = False,
                      bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The segment GEMM whose input rows are CSR sums of ``x``'s rows (``GemmSpec.has_csr``):
    ``a_r = sum_e csr_val[e] x[csr_col[e]]`` over CSR row ``gather[r]`` (or ``r``), then
    ``a_r W_s [+ b_s]`` as :func:`segment_mm_op`."""
    spec = _spec_of(x, weight, gather, scatter, transpose_weight, (gather_unique, scatter_unique),
                    bias is not None, has_csr=True)
    bounds_t, csr = tuple(bounds), (csr_ptr, csr_col, csr_val)

    def run(sched):
        return _launch.launch_gemm(spec, sched, bounds_t, x, weight, gather, scatter,
                                   num_out_rows, bias, csr)
    return run(pick_schedule(spec, None, bounds_t, x.device, run))


@segment_mm_csr_op.register_fake
def _(x, weight, csr_ptr, csr_col, csr_val, gather, scatter, bounds, num_out_rows,
      transpose_weight, gather_unique=False, scatter_unique=False, bias=None):
    n = out_width(weight, transpose_weight)
    return x.new_empty(num_out_rows if scatter is not None else bounds[-1], n)


def _csr_setup_context(ctx, inputs, output):
    x, weight, ptr, col, val, gather, scatter, bounds, _, transpose, *unique = inputs
    ctx.save_for_backward(x, weight, ptr, col, val, gather, scatter)
    ctx.bounds, ctx.transpose_weight, ctx.unique = list(bounds), transpose, unique[:2]


def _csr_backward(ctx, dout):
    """Through the summed rows ``a`` (rebuilt with torch ops: the compiler differentiates its
    plans itself and never records this op, so this path serves direct callers): ``(da, dW)``
    by the plain GEMM's backward on ``a``, then ``dx = CSR^T da``."""
    x, weight, ptr, col, val, gather, scatter = ctx.saved_tensors
    need_x, need_w = ctx.needs_input_grad[:2]
    dx = dw = None
    if need_x or need_w:
        a = csr_rows_torch(x, ptr, col, val)
        da, dw = call(segment_mm_backward_op, dout, a, weight, gather, scatter, ctx.bounds,
                      ctx.transpose_weight, need_x, need_w, *ctx.unique)
        if need_x:
            dx = csr_rows_transposed_torch(da, ptr, col, val, x.shape[0])
    need_b = ctx.needs_input_grad[12]
    return ((dx if need_x else None, dw if need_w else None) + (None,) * 10
            + (segment_sums(dout, ctx.bounds, scatter) if need_b else None,))


segment_mm_csr_op.register_autograd(_csr_backward, setup_context=_csr_setup_context)


@torch.library.custom_op("hector::segment_mm_wgrad_csr", mutates_args=())
def segment_mm_wgrad_csr_op(x: torch.Tensor, dy: torch.Tensor, csr_ptr: torch.Tensor,
                            csr_col: torch.Tensor, csr_val: torch.Tensor,
                            gather: Optional[torch.Tensor], scatter: Optional[torch.Tensor],
                            bounds: List[int]) -> torch.Tensor:
    """``dW [S, K, N]``, ``dW[s] = sum_{r in s} a_r^T dy_{c(r)}`` with ``a_r`` CSR row
    ``gather[r]`` (or ``r``) of ``x`` summed (``sum_e val[e] x[col[e]]``, rounded once to
    x's dtype): the weight gradient of a CSR-prologue GEMM, which rebuilds the summed rows
    as it loads them instead of reading them saved."""
    spec = GemmSpec.of(x, gather, scatter, False, dy.shape[1])
    sched = default_schedule(spec, interpreting=interpreting())
    like = _wgrad_fake(x, dy, bounds, "meta")
    return _launch.launch_wgrad(spec, sched, tuple(bounds), x, gather, dy, scatter, like,
                                csr=(csr_ptr, csr_col, csr_val))


segment_mm_wgrad_csr_op.register_fake(
    lambda x, dy, csr_ptr, csr_col, csr_val, gather, scatter, bounds:
    _wgrad_fake(x, dy, bounds))


@torch.library.custom_op("hector::segment_mm_csr_scatter", mutates_args=())
def segment_mm_csr_scatter_op(x: torch.Tensor, weight: torch.Tensor, csr_ptr: torch.Tensor,
                              csr_col: torch.Tensor, csr_val: torch.Tensor,
                              gather: Optional[torch.Tensor], rows: torch.Tensor,
                              bounds: List[int], num_out_rows: int, transpose_weight: bool,
                              gather_unique: bool = False) -> torch.Tensor:
    """The segment GEMM whose output rows are added through a CSR (``GemmSpec.has_csr_out``):
    ``y_r = x[gather[r]] W_s``, then ``out[col[e]] += val[e] y_r`` for the entries ``e`` of
    CSR row ``rows[r]``; ``out`` has ``num_out_rows`` rows (the CSR's columns)."""
    spec = GemmSpec.of(x, gather, rows, transpose_weight, out_width(weight, transpose_weight),
                       gather_unique, has_csr_out=True)
    bounds_t, csr = tuple(bounds), (csr_ptr, csr_col, csr_val)

    def run(sched):
        return _launch.launch_gemm(spec, sched, bounds_t, x, weight, gather, rows,
                                   num_out_rows, csr=csr)
    return run(pick_schedule(spec, None, bounds_t, x.device, run))


@segment_mm_csr_scatter_op.register_fake
def _(x, weight, csr_ptr, csr_col, csr_val, gather, rows, bounds, num_out_rows,
      transpose_weight, gather_unique=False):
    return x.new_empty(num_out_rows, out_width(weight, transpose_weight))


def _csr_scatter_setup_context(ctx, inputs, output):
    x, weight, ptr, col, val, gather, rows, bounds, _, transpose, *unique = inputs
    ctx.save_for_backward(x, weight, ptr, col, val, gather, rows)
    ctx.bounds, ctx.transpose_weight = list(bounds), transpose
    ctx.gather_unique = bool(unique[0]) if unique else False


def _csr_scatter_backward(ctx, dout):
    """Through the CSR first (``dy_i = sum_e val[e] dout[col[e]]`` per CSR row, torch ops:
    the compiler differentiates its plans itself, so this serves direct callers), then the
    plain GEMM's backward reading ``dy`` through ``rows``."""
    x, weight, ptr, col, val, gather, rows = ctx.saved_tensors
    need_x, need_w = ctx.needs_input_grad[:2]
    dx = dw = None
    if need_x or need_w:
        dy = csr_rows_torch(dout.to(x.dtype), ptr, col, val)
        dx, dw = call(segment_mm_backward_op, dy, x, weight, gather, rows, ctx.bounds,
                      ctx.transpose_weight, need_x, need_w, ctx.gather_unique, False)
    return (dx if need_x else None, dw if need_w else None) + (None,) * 9


segment_mm_csr_scatter_op.register_autograd(_csr_scatter_backward,
                                            setup_context=_csr_scatter_setup_context)


def segment_sums(dy: torch.Tensor, bounds: Union[Sequence[int], Bounds],
                 index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[S, N]``: per segment, the sum of the ``dy`` rows its logical rows read
    (``dy[index[r]]``, or ``dy[r]``) -- a bias gradient.  The weight-gradient kernel with x a
    column of ones read at stride 0 (nothing allocated for it): one launch reading ``dy`` once
    over the whole GPU (torch's one-hot product took 0.33 ms where the read takes 0.12 on
    1.9M rows, and ``index_add`` into a few rows serialises on atomics)."""
    bounds = as_bounds(bounds)
    ones = dy.new_ones(1, 1).expand(total_rows(bounds), 1)
    host, seg_ptr = op_args(bounds)
    return call(segment_mm_wgrad_op, ones, dy.contiguous(), None, index, host, "",
                seg_ptr).squeeze(1)


def segment_mm_triton(x: torch.Tensor, weight: torch.Tensor,
                      bounds: Union[Sequence[int], Bounds],
                      gather: Optional[torch.Tensor] = None,
                      scatter: Optional[torch.Tensor] = None,
                      num_out_rows: Optional[int] = None, transpose_weight: bool = False,
                      schedule: ScheduleChoice = None, gather_unique: bool = False,
                      scatter_unique: bool = False,
                      bias: Optional[torch.Tensor] = None, prologue: str = "",
                      addend: Optional[torch.Tensor] = None,
                      extra_weight: Optional[torch.Tensor] = None):
    """The Triton path of :func:`hector.kernels.segment_mm.op.segment_mm` (inputs already validated;
    ``bounds`` is ``seg_ptr`` as Python ints, or a :class:`.bounds.DeviceBounds`).  A pinned
    schedule runs the ``autograd.Function``; otherwise the ``hector::segment_mm`` custom op."""
    bounds = as_bounds(bounds)
    host, seg_ptr = op_args(bounds)
    n = out_width(weight, transpose_weight)
    gather = gather.contiguous() if gather is not None else None
    scatter = scatter.contiguous() if scatter is not None else None
    rows = num_out_rows if scatter is not None else total_rows(bounds)
    if extra_weight is not None:     # (the op checked: no scatter, bias, addend, prologue)
        if isinstance(schedule, GemmSchedule):
            raise ValueError("segment_mm: extra_weight runs on the heuristic or autotuned "
                             "schedule; a pinned GemmSchedule is not taken with it")
        return call(segment_mm_extra_op, x, weight, gather, host, extra_weight,
                    gather_unique, seg_ptr, transpose_weight)
    if isinstance(schedule, GemmSchedule):
        spec = GemmSpec.of(x, gather, scatter, transpose_weight, n, gather_unique, scatter_unique,
                           has_bias=bias is not None, prologue=prologue,
                           has_addend=addend is not None)
        return SegmentMMFunction.apply(spec, schedule, bounds, rows, x, weight, gather, scatter,
                                       bias, addend)
    return call(segment_mm_op, x, weight, gather, scatter, host, rows, transpose_weight,
                gather_unique, scatter_unique, bias, prologue, addend, seg_ptr)
