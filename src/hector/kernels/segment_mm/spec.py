"""Frozen specs of the gather/scatter segment GEMM (Hector's GEMM template): *what* is computed
(:class:`GemmSpec`) kept apart from *how* it is tiled (:class:`GemmSchedule`), so the compiler
can key kernels on the spec and tests or a tuner can pin a schedule (TVM/Halide style)."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from typing import Optional, Tuple

import torch

from ...device import tf32_allowed
from ..activations import gelu_grad
from ..sizes import next_pow2

#: fp32 dot modes accepted by ``tl.dot(input_precision=...)`` in Triton 3.6 (the H200 box) and
#: 3.9 (CI) alike: "ieee" on the FMA units (matches torch's fp32 matmul to 1e-5); "tf32x3" on
#: the tensor cores, each fp32 operand split into a TF32 high part and a TF32 remainder and
#: three products summed (CUTLASS's 3xTF32: fp32's accuracy); "tf32" one product (10-bit
#: mantissas, about 1e-3).
INPUT_PRECISIONS = ("ieee", "tf32", "tf32x3")

#: Environment switch of the fp32 mode when torch's TF32 switch is off (see :func:`fp32_dot`).
FP32_DOT_ENV = "HECTOR_FP32_DOT"


def fp32_dot() -> str:
    """How the segment GEMMs multiply fp32 tiles.

    TF32 allowed by torch (``hector.device.tf32_allowed``: ``allow_tf32``,
    ``set_float32_matmul_precision("high")`` or ``fp32_precision = "tf32"``): "tf32", as
    torch's own matmuls.
    Otherwise ``HECTOR_FP32_DOT``: "ieee" when unset (the FMA units, as cuBLAS's fp32), or
    "tf32x3".  3xTF32 is not the default because it measured no faster on these skinny GEMMs
    (K = N = 64 over 2-3M rows), with the same error (H200 timings: docs/perf-notes.md,
    "Segment GEMM", 2026-11-24)."""
    if tf32_allowed():
        return "tf32"
    mode = os.environ.get(FP32_DOT_ENV, "ieee")
    if mode not in ("ieee", "tf32x3"):
        raise ValueError(f"{FP32_DOT_ENV} must be 'ieee' or 'tf32x3' (torch's allow_tf32 "
                         f"switch selects 'tf32'), got {mode!r}")
    return mode


#: Elementwise functions a GEMM may apply to its input tile as it loads it (``prologue``;
#: their Triton spelling is the templates' ``prologue_fn`` macro): torch's function and its
#: derivative (the op-level backward's ``dx``).  ``f(0)`` need not be 0: padded columns meet
#: zero weight rows, padded rows are masked on store.
PROLOGUES = {
    "gelu": (torch.nn.functional.gelu, gelu_grad),
    "relu": (torch.relu, lambda x: (x > 0).to(x.dtype)),
    "sigmoid": (torch.sigmoid, lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x))),
    "tanh": (torch.tanh, lambda x: 1 - torch.tanh(x) ** 2),
}

#: Widest output or reduction the kernels multiply without ``tl.dot`` (fp32 only; see
#: :attr:`GemmSpec.narrow`).  The broadcast product wins only where a tl.dot tile padded to
#: 16 would do 16x the multiply-adds on the FMA units: one fp32 column (H200 timings:
#: docs/perf-notes.md, "Segment GEMM", narrow products of 2026-11-25).
NARROW = 1
#: Elements of a narrow kernel's [BLOCK_M, BLOCK_K, BLOCK_N] product tile (registers): tall
#: tiles on 8 warps for a narrow output, 128 rows on 4 for a narrow reduction, the fastest
#: measured on the H200 (docs/perf-notes.md, "Compiled relational layers", 2026-11-24).
_NARROW_TILE = 8192


def is_narrow(K: int, N: int, dtype: torch.dtype) -> bool:
    """Whether a ``K -> N`` product of ``dtype`` runs on the narrow (broadcast) kernel
    (:attr:`GemmSpec.narrow`; callers that have no spec yet ask here)."""
    return min(K, N) <= NARROW and dtype == torch.float32


@dataclass(frozen=True)
class GemmSpec:
    """Semantics of one segment GEMM over ``M`` logical rows cut into ``S`` segments::

        a_r   = x[gather[r]]                 [has_gather]     else x[r]
        a_r   = sum_e val[e] x[col[e]]       [has_csr: over the entries e of CSR row
                                              gather[r] (or r); rounded once to x's dtype]
        a_r   = f(a_r)                       [prologue f, elementwise, as the tile is loaded]
        y_r   = a_r @ W_s   (W_s^T when transpose_weight; s = segment of r; fp32 accumulation)
              + b_s                          [has_bias: the kernel's epilogue]
              + addend[row]                  [has_addend: the output row's addend, read by
                                              the epilogue (a row stored once, not summed)]
        out[scatter[r]] += y_r               [has_scatter: accumulate into zeroed rows]
        out[scatter[r]] = y_r                [has_scatter, scatter_unique: a permutation]
        out[r] = y_r                         [otherwise: overwrite, one row per logical row]
        out[col[e]] += val[e] y_r            [has_csr_out: over the entries e of CSR row
                                              scatter[r] (a CSR scatter epilogue; the
                                              transpose of the CSR prologue)]
        more[r] = y_r @ V                    [extra_cols = E > 0: a second [M, E] output,
                                              each fp32 row y_r (before its rounding)
                                              times a shared [N, E] weight V, by the
                                              epilogue]

    ``K`` is the reduction size (row width of ``x``) and ``N`` the output width, whatever the
    weight's layout: ``[S, K, N]``, or ``[S, N, K]`` when ``transpose_weight``.
    ``gather_unique`` / ``scatter_unique``: the index is a permutation of the ``M`` rows (a
    node-type GEMM's ``node_perm``, a per-head GEMM's head-major order), so rows written
    through it are stored once: no zeroed fp32 buffer, no atomics (``dx`` writes through the
    forward's gather, hence both).
    """
    has_gather: bool
    has_scatter: bool
    transpose_weight: bool
    dtype: torch.dtype
    K: int
    N: int
    input_precision: str = "ieee"
    gather_unique: bool = False
    scatter_unique: bool = False
    has_bias: bool = False
    prologue: Optional[str] = None
    has_csr: bool = False
    has_addend: bool = False
    has_csr_out: bool = False
    extra_cols: int = 0

    def __post_init__(self):
        if self.input_precision not in INPUT_PRECISIONS:
            raise ValueError(f"GemmSpec.input_precision must be one of {INPUT_PRECISIONS}, "
                             f"got {self.input_precision!r}")
        if self.prologue is not None and self.prologue not in PROLOGUES:
            raise ValueError(f"GemmSpec.prologue must be None or one of {sorted(PROLOGUES)}, "
                             f"got {self.prologue!r}")
        if self.has_csr and self.prologue is not None:
            raise ValueError("GemmSpec: a CSR prologue (has_csr) takes no elementwise prologue")
        if self.has_csr_out and (self.has_csr or self.has_bias or self.has_addend
                                 or not self.has_scatter):
            raise ValueError("GemmSpec: a CSR scatter epilogue (has_csr_out) reads its CSR rows "
                             "through the scatter index and takes no CSR prologue, bias or "
                             "addend")
        if self.has_addend and self.accumulate:
            raise ValueError("GemmSpec: an addend needs each output row stored once (no "
                             "scatter, or a permutation): summed rows would add it repeatedly")
        if not 0 <= self.extra_cols <= 128:
            raise ValueError(f"GemmSpec.extra_cols must be in [0, 128], got {self.extra_cols}")
        if self.extra_cols and (self.has_scatter or self.has_bias or self.has_addend
                                or self.has_csr or self.narrow):
            raise ValueError("GemmSpec: extra columns (y @ V in the epilogue) need rows stored "
                             "in order, no bias, addend or CSR prologue and a tl.dot product "
                             f"(min(K, N) > {NARROW} or a half type)")

    @property
    def narrow(self) -> bool:
        """An fp32 output or reduction at most :data:`NARROW` wide (RGAT's one-head score
        projection, its dx, bias sums): the kernels multiply by broadcasting instead of
        ``tl.dot`` (which pads each side to 16), and its tiles may be that narrow.  Wider
        narrow sides (RGAT's per-head scores, N = heads) and half types run padded tl.dot
        tiles, which measured 3-10x faster there (:data:`NARROW`)."""
        return is_narrow(self.K, self.N, self.dtype)

    @property
    def accumulate(self) -> bool:
        """Rows may be hit several times (a scatter that is not a permutation): the output is
        zeroed and summed into."""
        return (self.has_scatter and not self.scatter_unique) or self.has_csr_out

    def grad_input_spec(self) -> "GemmSpec":
        """The same template computing ``dx``: ``da_r = dy_{scatter[r]} @ W_s^T`` written to
        ``dx[gather[r]]`` -- gather and scatter swap roles, the weight is read transposed and
        the reduction runs over ``N``.  With a CSR prologue that is the gradient of the
        summed rows ``a`` (one row per CSR row); the caller spreads it over ``x``'s rows."""
        return replace(self, has_gather=self.has_scatter, has_scatter=self.has_gather,
                       gather_unique=self.scatter_unique, scatter_unique=self.gather_unique,
                       transpose_weight=not self.transpose_weight, K=self.N, N=self.K,
                       has_bias=False, prologue=None, has_csr=False, has_addend=False,
                       has_csr_out=False, extra_cols=0)

    @staticmethod
    def of(x: torch.Tensor, gather: Optional[torch.Tensor], scatter: Optional[torch.Tensor],
           transpose_weight: bool, N: int, gather_unique: bool = False,
           scatter_unique: bool = False, has_bias: bool = False,
           prologue: Optional[str] = None, has_csr: bool = False,
           has_addend: bool = False, has_csr_out: bool = False,
           extra_cols: int = 0) -> "GemmSpec":
        # fp32: see fp32_dot.  Half types ignore the setting (their products are exact).
        return GemmSpec(has_gather=gather is not None, has_scatter=scatter is not None,
                        transpose_weight=bool(transpose_weight), dtype=x.dtype,
                        K=int(x.shape[1]), N=int(N),
                        input_precision=fp32_dot() if x.dtype == torch.float32 else "ieee",
                        gather_unique=gather is not None and bool(gather_unique),
                        scatter_unique=scatter is not None and bool(scatter_unique),
                        has_bias=bool(has_bias), prologue=prologue or None,
                        has_csr=bool(has_csr), has_addend=bool(has_addend),
                        has_csr_out=bool(has_csr_out), extra_cols=int(extra_cols))


@dataclass(frozen=True)
class GemmSchedule:
    """Tiling of the segment GEMM.

    A forward/``dx`` program owns ``block_m`` rows of one segment and ``block_n`` output
    columns, looping over the reduction in ``block_k`` steps.  The weight-gradient kernel
    computes one ``[block_k, block_n]`` tile of ``dW_s`` over a run of ``wgrad_rows`` rows of
    segment ``s`` (0: chosen at run time so that the grid fills the GPU; a segment longer than
    that is split over several programs whose partial tiles are summed with atomics).  Its
    ``dW`` tile has its own sides ``wgrad_block_k x wgrad_block_n``, reduction step
    ``wgrad_block_m`` and warps (0: the forward's):
    every extra tile along K or N re-reads all rows of ``x`` or ``dy``, so the weight
    gradient wants the whole (padded) ``K x N`` per program, unlike the forward.
    """
    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 3
    wgrad_rows: int = 0
    wgrad_block_k: int = 0
    wgrad_block_n: int = 0
    wgrad_warps: int = 0
    wgrad_block_m: int = 0

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k", "wgrad_block_k", "wgrad_block_n",
                     "wgrad_block_m"):
            value = getattr(self, name)
            if name.startswith("wgrad") and value == 0:
                continue
            # tl.dot needs every tile side >= 16: the row steps always, the other sides
            # unless the spec is narrow (its kernels multiply by broadcasting; checked
            # against the spec by ``check_fits``).
            low = 16 if name in ("block_m", "wgrad_block_m") else 1
            if value < low or value & (value - 1):
                raise ValueError(f"GemmSchedule.{name} must be a power of two >= {low}, "
                                 f"got {value}")
        for name in ("num_warps", "wgrad_warps"):
            value = getattr(self, name)
            if (value < 1 and name == "num_warps") or value & (value - 1) or value < 0:
                raise ValueError(f"GemmSchedule.{name} must be a power of two, got {value}")
        if self.num_stages < 1:
            raise ValueError(f"GemmSchedule.num_stages must be >= 1, got {self.num_stages}")
        step = self.wgrad_block_m or self.block_m
        if self.wgrad_rows < 0 or self.wgrad_rows % step:
            raise ValueError(f"GemmSchedule.wgrad_rows must be a multiple of the weight "
                             f"gradient's block_m={step} (or 0 for automatic), got "
                             f"{self.wgrad_rows}")

    def check_fits(self, spec: "GemmSpec") -> None:
        """Tiles narrower than 16 only for a narrow spec (the others multiply with tl.dot); a
        CSR prologue's reduction tile spans the whole ``K``."""
        if spec.extra_cols and self.block_n < spec.N:
            raise ValueError(f"GemmSchedule: block_n={self.block_n} must be >= N={spec.N} with "
                             "extra columns (the epilogue multiplies whole output rows)")
        if spec.has_csr and self.block_k < spec.K:
            raise ValueError(f"GemmSchedule: block_k={self.block_k} must be >= K={spec.K} "
                             "with a CSR prologue (its summed rows are formed whole)")
        w = self.wgrad_meta
        if not spec.narrow and min(self.block_n, self.block_k, w["BLOCK_N"], w["BLOCK_K"]) < 16:
            raise ValueError(f"GemmSchedule: block_n={self.block_n}, block_k={self.block_k} "
                             f"(weight gradient {w['BLOCK_N']}, {w['BLOCK_K']}) must be >= 16 "
                             f"for K={spec.K}, N={spec.N} (tiles narrower than 16 need "
                             f"fp32 and min(K, N) <= {NARROW})")

    @property
    def meta(self) -> dict:
        """Tile sizes and launch options as a kernel launch takes them."""
        return dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_K=self.block_k,
                    num_warps=self.num_warps, num_stages=self.num_stages)

    @property
    def wgrad_meta(self) -> dict:
        """Launch options of the weight-gradient kernel (reduction step ``block_m``)."""
        return dict(BLOCK_M=self.wgrad_block_m or self.block_m,
                    BLOCK_N=self.wgrad_block_n or self.block_n,
                    BLOCK_K=self.wgrad_block_k or self.block_k,
                    num_warps=self.wgrad_warps or self.num_warps, num_stages=self.num_stages)


def _side(n: int, cap: int) -> int:
    return min(max(next_pow2(n), 16), cap)


def padded_width(n: int) -> int:
    """Columns the forward kernel computes for an output of ``n`` (tl.dot tiles of at least
    16, at most 64 wide, as fp32 runs them): what a GEMM's multiply-adds scale with, for a
    compiler weighing one GEMM of several outputs against one per output."""
    side = _side(n, 64)
    return -(-n // side) * side


def default_schedule(spec: GemmSpec, interpreting: bool = False) -> GemmSchedule:
    """Heuristic tiles, from H200 measurements (M=2M gathered rows, K=N=128, S=4).

    The segment GEMM is a gather-bound skinny GEMM (K, N of 16..256, millions of rows): the
    output width fits one tile up to 128 so each gathered row of ``x`` is read once, and 64
    rows per tile keep enough programs in flight.  fp32 with "ieee" runs on the FMA units
    (compute-bound, ~38 TFLOP/s like cuBLAS), where 64x64x32 tiles keep register pressure
    down.  The weight gradient takes the whole 128x128 ``dW`` tile in half precision and
    64x128 in fp32, the fastest measured (docs/perf-notes.md, "Segment GEMM").  Under
    the interpreter the smallest tiles are fastest (numpy work grows with the padded tile)."""
    if spec.narrow:      # a narrow output: tall tiles on 8 warps; a narrow reduction: 128, 4
        tall = spec.N <= NARROW
        return _csr_tiles(spec, _narrow_schedule(spec, 16 if interpreting else 256 if tall
                                                 else 128, interpreting, 8 if tall else 4))
    if interpreting:
        return _csr_tiles(spec, GemmSchedule(block_m=16, block_n=_side(spec.N, 32),
                                             block_k=_side(spec.K, 32), num_warps=1,
                                             num_stages=1))
    fma = spec.dtype == torch.float32 and spec.input_precision == "ieee"
    wide = spec.dtype == torch.float32        # fp32 tiles: twice the bytes per stage
    block_n = _side(spec.N, 64 if fma else 128)
    block_k = _side(spec.K, 32 if fma or wide else 64)
    if spec.has_csr:
        # Each column tile walks the rows' CSR entries again: the whole output width (up to
        # 128) in one program; the reduction is whole (``_csr_tiles``).
        block_n = _side(spec.N, 128)
    num_warps = 8 if block_n * 64 >= 8192 else 4
    wk, wn = _side(spec.K, 64 if fma else 128), _side(spec.N, 128)
    # An FMA-bound dW tile of 64 x 64 or less: 4 warps over 32-row steps keep ~32 products
    # per thread (8 warps: 16, and the FMA units wait on loads); a 64 x 128 one stays on 8
    # warps (HGT's on mag: docs/perf-notes.md, "Compiled relational layers", 2026-11-25).
    small = fma and wk * wn <= 4096
    return _csr_tiles(spec, GemmSchedule(
        block_m=64, block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=3,
        wgrad_block_k=wk, wgrad_block_n=wn, wgrad_warps=4 if small or not (fma or wide) else 8,
        wgrad_block_m=32 if small else 0))


def _csr_tiles(spec: GemmSpec, sched: GemmSchedule) -> GemmSchedule:
    """A CSR prologue's schedule: the reduction tile spans all of ``K``; with extra columns
    the output tile spans all of ``N`` (``check_fits``)."""
    if spec.extra_cols and sched.block_n < spec.N:     # (a wider tile: the warps it would get)
        block_n = _side(spec.N, next_pow2(spec.N))     # (N need not be a power of two)
        sched = replace(sched, block_n=block_n, num_warps=max(
            sched.num_warps, 8 if block_n * sched.block_m >= 8192 else 4))
    return replace(sched, block_k=max(next_pow2(spec.K), sched.block_k)) if spec.has_csr \
        else sched


def _narrow_schedule(spec: GemmSpec, block_m: int, interpreting: bool = False,
                     num_warps: int = 4) -> GemmSchedule:
    """Tiles of a narrow product: the narrow side whole, the other as wide as the product
    tile allows (a row of ``x`` read in as few steps as possible).  The weight gradient's
    ``[K, N]`` tile: both sides whole up to 64, and as many rows per step as keep its
    ``[K, N, rows]`` product within the same budget."""
    narrow_n = spec.N <= NARROW
    side = next_pow2(spec.N if narrow_n else spec.K)
    other = min(next_pow2(spec.K if narrow_n else spec.N), max(_NARROW_TILE // (block_m * side), 1))
    block_n, block_k = (side, other) if narrow_n else (other, side)
    wk, wn = min(next_pow2(spec.K), 64), min(next_pow2(spec.N), 64)
    wm = 16 if interpreting else min(max(_NARROW_TILE // (wk * wn), 16), 256)
    return GemmSchedule(block_m=block_m, block_n=block_n, block_k=block_k,
                        num_warps=1 if interpreting else num_warps,
                        num_stages=1 if interpreting else 3,
                        wgrad_block_k=wk, wgrad_block_n=wn, wgrad_block_m=wm,
                        wgrad_warps=1 if interpreting else 4)


#: Alternatives the tuner times after the heuristic (:func:`tune_configs`): a taller row tile,
#: a wider output/reduction tile on more warps, and a short row tile (more programs in flight
#: for few rows).  Every side is a power of two >= 16 and the kernels mask all tile edges, so
#: each config is valid for every shape; sides above the padded K/N are clipped.
GEMM_CONFIGS: Tuple[GemmSchedule, ...] = (
    GemmSchedule(block_m=128, block_n=64, block_k=32, num_warps=4, num_stages=3),
    GemmSchedule(block_m=64, block_n=128, block_k=64, num_warps=8, num_stages=3),
    GemmSchedule(block_m=32, block_n=64, block_k=32, num_warps=2, num_stages=4),
)


#: More configs for a GEMM with an extra product (its output tile spans N, so the tiles above
#: are widened to N, and their warps with them): fewer rows on 4 warps keep the row sums'
#: registers, and were the fastest measured on the H200 (docs/perf-notes.md, "Segment GEMM",
#: the extra product of 2026-11-25).
_EXTRA_CONFIGS: Tuple[GemmSchedule, ...] = (
    GemmSchedule(block_m=32, block_n=128, block_k=32, num_warps=4, num_stages=3),
    GemmSchedule(block_m=64, block_n=128, block_k=32, num_warps=4, num_stages=3),
)


@functools.lru_cache(maxsize=1024)
def tune_configs(spec: GemmSpec, interpreting: bool = False) -> Tuple[GemmSchedule, ...]:
    """The config list of one segment GEMM: the heuristic :func:`default_schedule` first (what
    runs untuned), then :data:`GEMM_CONFIGS` clipped to the padded problem, deduplicated.  The
    list tunes the forward/``dx`` tiles; every entry carries the heuristic's weight-gradient
    tiles, which are not tuned."""
    heuristic = default_schedule(spec, interpreting=interpreting)
    seen = [heuristic]
    if spec.narrow:     # other row tiles and warps
        for block_m, warps in ((256, 8), (128, 4), (64, 4), (128, 8)):
            cfg = _csr_tiles(spec, _narrow_schedule(spec, block_m, interpreting, warps))
            if cfg not in seen:
                seen.append(cfg)
        return tuple(seen)
    for cfg in GEMM_CONFIGS + (_EXTRA_CONFIGS if spec.extra_cols else ()):
        cfg = replace(cfg, block_n=min(cfg.block_n, _side(spec.N, 256)),
                      block_k=min(cfg.block_k, _side(spec.K, 256)),
                      wgrad_block_k=heuristic.wgrad_block_k,
                      wgrad_block_n=heuristic.wgrad_block_n, wgrad_warps=heuristic.wgrad_warps,
                      wgrad_block_m=heuristic.wgrad_block_m)
        cfg = _csr_tiles(spec, cfg)
        if cfg not in seen:
            seen.append(cfg)
    return tuple(seen)


#: Widest output whose rows a GEMM's epilogue multiplies by a second weight (its tile then
#: spans the whole row: ``GemmSpec.extra_cols``).
EXTRA_MAX_N = 128
#: Most extra columns an epilogue forms (one row sum each).  The row sums cost the same in any
#: dtype, while the score GEMM they replace is about 3x cheaper in bf16 than in fp32: so fp32
#: takes up to 8 columns, half types 2 (the H200 timings behind both caps: docs/perf-notes.md,
#: "Segment GEMM", the extra product of 2026-11-25).
EXTRA_MAX_COLS = {torch.float32: 8}
EXTRA_MAX_COLS_HALF = 2


def extra_max_cols(dtype: torch.dtype) -> int:
    """Most extra columns an epilogue forms for a GEMM of ``dtype`` (:data:`EXTRA_MAX_COLS`)."""
    return EXTRA_MAX_COLS.get(dtype, EXTRA_MAX_COLS_HALF)
