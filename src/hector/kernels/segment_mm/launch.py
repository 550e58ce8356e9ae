"""Runtime of the segment GEMM on the Triton path: tile maps, schedule choice (heuristic, pinned
or autotuned), kernel launches and the forward and backward passes built of them.  The custom
ops and the ``autograd.Function`` that call these live in :mod:`.custom_ops`.

Backward:

* ``dx`` is the forward template again (:meth:`GemmSpec.grad_input_spec`): ``dy`` rows read
  through the forward's scatter, ``W_s^T``, rows written through the forward's gather.  When
  the forward gathered, a row of ``x`` may feed many logical rows (a node feeding each of its
  edges), so ``dx`` rows are summed with fp32 **atomics** rather than by sorting: a sort would
  cost an argsort of ``gather`` per call (or a cached CSR-by-source per index), a permuted
  ``[M, K]`` intermediate and a segmented reduction across segment boundaries, while the
  atomics add only contention on rows hit at the same moment -- a node's edges are spread over
  segments and tiles, so collisions are rare.  Their cost is the fp32 read-modify-write
  traffic: on an H200 (M=2M, K=N=128, bf16) a scattered pass takes ~1.0 ms against ~0.45 ms
  for a plain store; in fp32 (FMA-bound) it is hidden.  Summation order is then not deterministic (the
  usual fp32 atomic caveat); callers that need bitwise reproducibility use the torch backend,
  and the compiler can choose CSR-by-source traversal for a gather-heavy backward instead.
* ``dW`` is a segment-grouped outer-product GEMM (kernel ``segment_mm_wgrad``): a tile map of
  long row runs (``wgrad_rows``) so that a few huge segments still fill the GPU; a segment
  split over several runs sums its partial ``[BLOCK_K, BLOCK_N]`` tiles with atomics (a few
  hundred adds per weight element at most), one run per segment stores directly.

Nothing per row of the weight is ever built: each program reads ``W[segment]`` in place.
"""
from __future__ import annotations

import functools
import os
from typing import Callable, Optional, Tuple, Union

import numpy as np
import torch

from ...device import interpreting, num_sms
from .. import autotune
from .. import registry
from ..reduce import column_sum
from ..sizes import cdiv as _cdiv
from .bounds import Bounds, DeviceBounds, device_tile_map, num_segments, total_rows
from .spec import PROLOGUES, GemmSchedule, GemmSpec, tune_configs

#: Weight-gradient programs aimed for per SM: many short row runs keep enough row loads in
#: flight (each waits on its index loads), at the price of more partial tiles summed with
#: atomics.  64 per SM was the fastest measured on the H200, gathered or not, with or without
#: a CSR prologue (docs/perf-notes.md, "Segment GEMM", 2026-11-25).
WGRAD_PROGRAMS_PER_SM = 64


@functools.lru_cache(maxsize=256)
def tile_map(bounds: Tuple[int, ...], block: int, device: torch.device) -> torch.Tensor:
    """``[T, 3]`` (segment, first row, end row) of every program: segment ``s`` gets
    ``ceil(M_s / block)`` consecutive entries and an empty segment none, so a 1-D grid of
    ``T = sum_s ceil(M_s / block)`` programs covers all rows with no idle program.

    Built on the host from ``seg_ptr`` (which the op reads there anyway, for validation) with
    numpy, not torch: the ~20 small ops cost torch's dispatcher ~5 us each (every new
    mini-batch block builds 4-10 of these maps per step: 55-135 aten ops), numpy ~1 us
    (CPU, an 80K-row block: 90 -> 29 us a map; the same for 10M rows); and copied to the
    device once: cached per (segment layout, block, device), since a layer calls it with the
    same relation pointers every step.  Every mini-batch block is a new layout, so on CUDA
    the copy is asynchronous, from pinned memory: a copy from pageable memory waits for the
    stream to drain (a device sync per new layout, 7-9 per batch); torch's pinned-memory
    allocator keeps the staging buffer until it is done.
    """
    ptr = np.asarray(bounds, dtype=np.int64)
    counts = (ptr[1:] - ptr[:-1] + block - 1) // block
    seg = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    first = np.cumsum(counts) - counts                # first entry of each segment
    j = np.arange(seg.size, dtype=np.int64) - first[seg]   # tile number inside its segment
    start = ptr[seg] + j * block
    end = np.minimum(start + block, ptr[seg + 1])
    dtype = np.int32 if bounds[-1] < 2 ** 31 else np.int64
    table = torch.from_numpy(np.stack([seg, start, end], axis=1).astype(dtype))
    # Not while a CUDA graph is being captured: a replay would copy again from the staging
    # buffer, by then reused (there the plain copy runs, as it always did).
    if device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        return table.pin_memory().to(device, non_blocking=True)
    return table.to(device)


def tiles_of(bounds: Bounds, block: int, device: torch.device) -> torch.Tensor:
    """The tile map of host bounds (:func:`tile_map`, cached) or of device bounds
    (:func:`.bounds.device_tile_map`: built on the device, no host read)."""
    if isinstance(bounds, DeviceBounds):
        return device_tile_map(bounds, block)
    return tile_map(bounds, block, device)


def out_width(weight: torch.Tensor, transpose_weight: bool) -> int:
    """``N`` of a weight stored ``[S, K, N]``, or ``[S, N, K]`` if ``transpose_weight``."""
    return weight.shape[1] if transpose_weight else weight.shape[2]


def _weight_strides(w: torch.Tensor, transpose: bool) -> Tuple[int, int, int]:
    """(segment, K, N) strides of a weight stored ``[S, K, N]``, or ``[S, N, K]`` if
    ``transpose``: the kernels then read ``W_s^T`` without a copy."""
    s, a, b = w.stride()
    return (s, b, a) if transpose else (s, a, b)


def gemm_params(spec: GemmSpec, wgrad: bool = False) -> dict:
    """Render parameters of the segment GEMM kernel for ``spec`` (see kernels/registry.py),
    or with ``wgrad`` those the weight-gradient kernel shares (it writes ``dW``, not rows).

    ``dot_fp32`` upcasts tiles before ``tl.dot``, only under ``TRITON_INTERPRET=1`` for
    bfloat16, whose interpreted ``tl.dot`` multiplies raw bit patterns (triton-lang/triton
    #11584); bf16 products are exact in fp32, so results match the GPU's bf16 MMA."""
    shared = dict(has_gather=spec.has_gather, has_scatter=spec.has_scatter,
                  dot_fp32=interpreting() and spec.dtype == torch.bfloat16,
                  input_precision=spec.input_precision, prologue=spec.prologue or "")
    if wgrad:
        return dict(shared, narrow=spec.narrow)
    return dict(shared, accumulate=spec.accumulate, has_bias=spec.has_bias,
                narrow=spec.narrow, has_csr=spec.has_csr, has_addend=spec.has_addend,
                has_csr_out=spec.has_csr_out, extra_cols=spec.extra_cols)


def launch_gemm(spec: GemmSpec, sched: GemmSchedule, bounds: Bounds, x: torch.Tensor,
                weight: torch.Tensor, gather: Optional[torch.Tensor],
                scatter: Optional[torch.Tensor], num_out_rows: int,
                bias: Optional[torch.Tensor] = None,
                csr: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
                addend: Optional[torch.Tensor] = None,
                extra_weight: Optional[torch.Tensor] = None):
    """One forward-template launch; returns ``[M or num_out_rows, N]`` in ``spec.dtype``;
    with ``spec.extra_cols = E`` the pair of it and ``[M, E]``, each fp32 row times
    ``extra_weight`` ``[N, E]`` (the epilogue's extra product).
    ``csr`` (``spec.has_csr``): (ptr, col, val) whose rows the prologue sums; with
    ``spec.has_csr_out`` the CSR whose rows the epilogue adds each output row through
    (``scatter[r]`` its row; ``num_out_rows`` its columns).

    A scatter accumulates in a zeroed fp32 buffer (fp32 atomics; half-precision atomics would
    round at every add) that is rounded once at the end; a permutation (``scatter_unique``)
    stores each row once, every one of the ``num_out_rows == M`` rows.  ``bias`` ``[S, N]``
    (``spec.has_bias``): added to each row of its segment by the epilogue; ``addend``
    ``[rows, N]`` (``spec.has_addend``): its row of each output row, added by the epilogue."""
    sched.check_fits(spec)
    m, n = total_rows(bounds), spec.N
    # Device bounds leave the rows past the batch's unwritten: zero, not garbage.
    fill = torch.zeros if isinstance(bounds, DeviceBounds) else torch.empty
    if spec.accumulate:
        out = torch.zeros(num_out_rows, n, dtype=torch.float32, device=x.device)
    else:
        out = fill(m, n, dtype=spec.dtype, device=x.device)
    more = (fill(m, spec.extra_cols, dtype=spec.dtype, device=x.device)
            if spec.extra_cols else None)
    tiles = tiles_of(bounds, sched.block_m, x.device)
    grid = (tiles.shape[0], _cdiv(n, sched.block_n))
    transpose = spec.transpose_weight
    if _weight_strides(weight, transpose)[2] != 1 and n > 1:
        # W_s read across its rows (the dx pass, transpose_weight=True): the B tile would be
        # column-major, which made fp32 dx 2.9x slower than the forward on an H200.  A
        # [S, K, N]-contiguous copy costs S*K*N elements, nothing next to the M*K rows.
        weight = (weight.transpose(1, 2) if transpose else weight).contiguous()
        transpose = False
    if grid[0] and grid[1]:
        kernel = registry.kernel("segment_mm", **gemm_params(spec))
        kernel[grid](
            tiles, x, gather if gather is not None else tiles, weight,
            bias if bias is not None else tiles, scatter if scatter is not None else tiles,
            out, *(csr if csr is not None else (tiles,) * 3),
            addend if addend is not None else tiles,
            *((extra_weight, more) if more is not None else (tiles, tiles)), spec.K, n,
            x.stride(0), x.stride(1), *_weight_strides(weight, transpose),
            bias.stride(0) if bias is not None else 0, out.stride(0), out.stride(1),
            *(addend.stride() if addend is not None else (0, 0)),
            *(extra_weight.stride() + more.stride() if more is not None else (0,) * 4),
            **sched.meta)
    return out.to(spec.dtype) if more is None else (out, more)


def wgrad_rows(sched: GemmSchedule, m: int, tiles_kn: int, device: torch.device) -> int:
    """Rows per weight-gradient program: long enough to amortise the atomic merge of partial
    tiles, short enough that ``~WGRAD_PROGRAMS_PER_SM`` programs per SM exist even when all
    rows sit in a handful of segments (the forward grid is over rows; this one over
    ``dW`` tiles, of which there are only ``S * tiles_kn``)."""
    if sched.wgrad_rows:
        return sched.wgrad_rows
    runs = max(1, num_sms(device) * WGRAD_PROGRAMS_PER_SM // max(tiles_kn, 1))
    step = sched.wgrad_meta["BLOCK_M"]
    return _cdiv(max(_cdiv(m, runs), 1), step) * step


def launch_wgrad(spec: GemmSpec, sched: GemmSchedule, bounds: Bounds,
                 x: torch.Tensor, gather: Optional[torch.Tensor], dy: torch.Tensor,
                 scatter: Optional[torch.Tensor], weight: torch.Tensor, sums: bool = False,
                 csr: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None):
    """``dW`` in the weight's shape and dtype (zero for empty segments); with ``sums``
    ``(dW, db)``, ``db [S, N]`` the per-segment sums of the dy rows (a bias gradient) from the
    same pass over dy; with ``csr`` (ptr, col, val) the rows ``a_r`` are that CSR's row
    ``gather[r]`` summed over ``x`` (the forward's CSR prologue, ``spec.has_csr``)."""
    rows = dense_wgrad_rows(spec, bounds, x, dy, csr)
    if rows is not None:
        return _wgrad_dense(rows, x, dy, weight, spec.transpose_weight, sums)
    meta = sched.wgrad_meta
    kt, nt = _cdiv(spec.K, meta["BLOCK_K"]), _cdiv(spec.N, meta["BLOCK_N"])
    rows = wgrad_rows(sched, total_rows(bounds), kt * nt, x.device)
    # A segment longer than one run sums its runs' partial tiles with atomics; device
    # bounds may always have one.
    atomic = isinstance(bounds, DeviceBounds) or any(
        hi - lo > rows for lo, hi in zip(bounds[:-1], bounds[1:]))
    acc_dtype = torch.float32 if atomic else weight.dtype
    dw = torch.zeros(weight.shape, device=x.device, dtype=acc_dtype)
    db = torch.zeros((num_segments(bounds), spec.N), device=x.device, dtype=acc_dtype) \
        if sums else dw
    tiles = tiles_of(bounds, rows, x.device)
    if tiles.shape[0] and kt and nt:
        kernel = registry.kernel("segment_mm_wgrad", atomic=atomic, has_sums=sums,
                                 has_csr=csr is not None, **gemm_params(spec, True))
        kernel[(tiles.shape[0], kt, nt)](
            tiles, x, gather if gather is not None else tiles, dy,
            scatter if scatter is not None else tiles, dw, db,
            *(csr if csr is not None else (tiles,) * 3), spec.K, spec.N,
            x.stride(0), x.stride(1), dy.stride(0), dy.stride(1),
            *_weight_strides(dw, spec.transpose_weight), db.stride(0), **meta)
    if sums:
        return dw.to(weight.dtype), db.to(weight.dtype)
    return dw.to(weight.dtype)


#: The most rows a dense weight gradient hands to cuBLAS (``dense_wgrad_rows``).  Measured
#: (docs/perf-notes.md, "Segment GEMM" and "Attention layers"): at 169k rows cuBLAS's
#: product is faster (H200, 169343 x 128 x 128: 0.128 ms against the kernel's 0.196); at
#: 1.94M rows x 64 x 64 (RGCN's root weight on synthetic mag, H100) the kernel's many row runs
#: are faster (the step 0.1 ms slower with cuBLAS); 882k rows (am) was even.  Between the
#: two, a power of two; `scripts/gpu_gemm_check.py --dense-wgrad` tables the crossover.
DENSE_WGRAD_MAX_ROWS = 1 << 19


def dense_wgrad_rows(spec: GemmSpec, bounds: Bounds, x: torch.Tensor, dy: torch.Tensor,
                     csr=None) -> Optional[Tuple[int, int]]:
    """The rows ``(lo, hi)`` when ``dW`` is one plain product ``x[lo:hi]^T dy[lo:hi]`` on a
    GPU (one segment of host bounds, at most ``DENSE_WGRAD_MAX_ROWS`` rows, neither gathered
    nor scattered, no prologue, in IEEE fp32 or a half type), else None.  That product is
    cuBLAS's: on such shapes its GEMM beats the segment kernel's row runs and atomics, and
    a projection over a graph's nodes (GAT's, a relational layer's root weight) is exactly
    this."""
    if (csr is not None or spec.has_gather or spec.has_scatter or spec.prologue is not None
            or spec.input_precision != "ieee" or isinstance(bounds, DeviceBounds)
            or len(bounds) != 2 or x.device.type != "cuda" or interpreting()
            or dy.dtype != x.dtype or bounds[1] - bounds[0] > DENSE_WGRAD_MAX_ROWS):
        return None
    return int(bounds[0]), int(bounds[1])


def _wgrad_dense(rows: Tuple[int, int], x, dy, weight, transpose: bool, sums: bool):
    """``launch_wgrad``'s result for :func:`dense_wgrad_rows`' case, by ``torch.mm``."""
    lo, hi = rows
    a, g = x[lo:hi], dy[lo:hi]
    dw = (torch.mm(g.t(), a) if transpose else torch.mm(a.t(), g)).unsqueeze(0)
    dw = dw.to(weight.dtype)
    if sums:      # (a GEMV, kernels.reduce.column_sum: faster than torch's column reduction)
        return dw, column_sum(g).unsqueeze(0).to(weight.dtype)
    return dw


ScheduleChoice = Union[None, str, GemmSchedule]


def pick_schedule(spec: GemmSpec, choice: ScheduleChoice, bounds: Bounds,
                  device: torch.device, run: Callable[[GemmSchedule], object]) -> GemmSchedule:
    """A pinned schedule, or (``None``; ``"autotune"`` is the same request, kept for callers
    that spell it out) the autotuner's pick from
    :func:`hector.kernels.segment_mm.spec.tune_configs` per
    (rendered kernel, shape bucket of rows, K, N and segment count, device).  Off CUDA, under
    the interpreter or with ``HECTOR_AUTOTUNE=0`` that is the heuristic, untimed."""
    if isinstance(choice, GemmSchedule):
        return choice
    shape = autotune.bucket(total_rows(bounds), spec.K, spec.N, num_segments(bounds))
    # Looked up by this key first: the config list and spec hash cost more host time than
    # the launch itself, on every call of a step that is not captured.
    return autotune.memo(
        ("segment_mm", spec, shape, str(device), autotune.enabled(device), interpreting(),
         os.environ.get("HECTOR_CACHE_DIR")),
        lambda: autotune.choose(
            "segment_mm", registry.spec_hash("segment_mm", **gemm_params(spec)), shape,
            tune_configs(spec, interpreting=interpreting()), run, device))


def _forward(spec: GemmSpec, choice: ScheduleChoice, bounds: Bounds,
             num_out_rows: int, x, weight, gather, scatter, bias=None, addend=None):
    """(output, schedule used): the forward launch, its schedule picked (and tuned) first."""
    def run(sched):
        # Allocates a fresh (zeroed, under scatter) output per call, so autotune trials
        # never add into each other's atomics.
        return launch_gemm(spec, sched, bounds, x, weight, gather, scatter, num_out_rows,
                           bias, addend=addend)
    sched = pick_schedule(spec, choice, bounds, x.device, run)
    return run(sched), sched


def _backward(spec: GemmSpec, choice: ScheduleChoice, sched: GemmSchedule,
              bounds: Bounds, dout, x, weight, gather, scatter,
              need_x: bool, need_w: bool):
    """(dx or None, dW or None).  With a prologue ``f``: ``dW`` from ``f(x)`` (the weight
    gradient kernel applies it as the forward did) and ``dx = (dy W^T) * f'(x)``."""
    dx = dw = None
    dout = dout.contiguous()
    if need_x:
        dspec = spec.grad_input_spec()

        def run(s):
            return launch_gemm(dspec, s, bounds, dout, weight, scatter, gather, x.shape[0])
        dx = run(pick_schedule(dspec, choice, bounds, x.device, run))
        if spec.prologue:
            work = torch.promote_types(x.dtype, torch.float32)
            dx = dx * PROLOGUES[spec.prologue][1](x.to(work)).to(dx.dtype)
    if need_w:
        dw = launch_wgrad(spec, sched, bounds, x, gather, dout, scatter, weight)
    return dx, dw
