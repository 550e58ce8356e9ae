"""Triton kernels of the gather/scatter segment GEMM (Hector's GEMM template), specialised by
``tl.constexpr`` flags from a :class:`hector.plan.GemmSpec`.

Both kernels read a *tile map*: ``tiles[p] = (segment, first row, end row)`` of program ``p``,
built on the host (``hector.runtime.gemm.tile_map``), so a 1-D grid covers every segment's
rows with no program left idle and a program never straddles two segments (one weight per
program, loaded straight from ``W[segment]``: the typed weight is never copied per row).

Layouts are passed as strides, so one kernel serves ``W`` as ``[S, K, N]`` or transposed
``[S, N, K]`` (swap the two strides), the ``dx`` pass (the forward kernel on ``dy`` with the
weight strides swapped) and non-contiguous ``dy`` (expanded gradients have stride 0).

``DOT_FP32`` upcasts tiles to fp32 before ``tl.dot``: set only under ``TRITON_INTERPRET=1``
for bfloat16, whose interpreted ``tl.dot`` multiplies raw bit patterns (triton-lang/triton
#11584, "not supported yet").  bf16 x bf16 products are exact in fp32, so the result is the
same as the GPU's bf16 MMA with fp32 accumulation.
"""
import triton
import triton.language as tl


@triton.jit
def _tile_of(tiles, pid):
    """(segment, first row, end row) of program ``pid``, as int64."""
    seg = tl.load(tiles + 3 * pid).to(tl.int64)
    row_begin = tl.load(tiles + 3 * pid + 1).to(tl.int64)
    row_end = tl.load(tiles + 3 * pid + 2).to(tl.int64)
    return seg, row_begin, row_end


@triton.jit
def _rows(index, offs_m, mask_m, HAS_INDEX: tl.constexpr):
    """Physical rows of logical rows ``offs_m``: ``index[offs_m]`` or ``offs_m`` itself."""
    if HAS_INDEX:
        return tl.load(index + offs_m, mask=mask_m, other=0).to(tl.int64)
    else:
        return offs_m


@triton.jit
def segment_mm_kernel(
        tiles, x, gather, w, scatter, out,
        K, N,
        stride_xm, stride_xk, stride_ws, stride_wk, stride_wn, stride_om, stride_on,
        HAS_GATHER: tl.constexpr, HAS_SCATTER: tl.constexpr, DOT_FP32: tl.constexpr,
        INPUT_PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``out[scatter[r]] (+)= x[gather[r]] @ W[s]`` for the ``BLOCK_M`` rows of one tile and
    ``BLOCK_N`` output columns.

    With ``HAS_SCATTER`` the output rows may repeat (within a tile, across tiles and across
    segments), so the fp32 tile is added with atomics into a zeroed fp32 buffer; without it
    each row is written exactly once, by a plain store in the output dtype.
    """
    seg, row_begin, row_end = _tile_of(tiles, tl.program_id(0))
    offs_m = row_begin + tl.arange(0, BLOCK_M)
    mask_m = offs_m < row_end
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    src = _rows(gather, offs_m, mask_m, HAS_GATHER)
    a_ptrs = x + src[:, None] * stride_xm
    w_ptrs = w + seg * stride_ws + offs_n[None, :] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        a = tl.load(a_ptrs + offs_k[None, :] * stride_xk,
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(w_ptrs + offs_k[:, None] * stride_wk,
                    mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if DOT_FP32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    dst = _rows(scatter, offs_m, mask_m, HAS_SCATTER)
    o_ptrs = out + dst[:, None] * stride_om + offs_n[None, :] * stride_on
    mask = mask_m[:, None] & mask_n[None, :]
    if HAS_SCATTER:
        # Relaxed: only the final sums matter, no ordering with other memory is needed.
        tl.atomic_add(o_ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.store(o_ptrs, acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def segment_mm_wgrad_kernel(
        tiles, x, gather, dy, scatter, dw,
        K, N,
        stride_xm, stride_xk, stride_dym, stride_dyn, stride_ws, stride_wk, stride_wn,
        HAS_GATHER: tl.constexpr, HAS_SCATTER: tl.constexpr, ATOMIC: tl.constexpr,
        DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``dW[s][k-tile, n-tile] (+)= sum_r a_r^T dy_r`` over the rows of one tile-map entry (a
    run of rows of segment ``s``), looping over them ``BLOCK_M`` at a time: a segment-grouped
    outer-product GEMM whose reduction axis is the rows.

    ``a_r = x[gather[r]]`` and ``dy_r = dy[scatter[r]]`` (the rows the forward read and
    wrote).  ``ATOMIC`` is set when some segment is split over several programs: partial
    tiles are then summed into a zeroed fp32 buffer; otherwise each tile is stored once.
    Grid: (tile-map entries, K tiles, N tiles).
    """
    seg, row_begin, row_end = _tile_of(tiles, tl.program_id(0))
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    acc = tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.float32)
    for m0 in range(row_begin, row_end, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        mask_m = offs_m < row_end
        src = _rows(gather, offs_m, mask_m, HAS_GATHER)
        dst = _rows(scatter, offs_m, mask_m, HAS_SCATTER)
        # a^T loaded directly as [BLOCK_K, BLOCK_M] (no register transpose).
        a_t = tl.load(x + src[None, :] * stride_xm + offs_k[:, None] * stride_xk,
                      mask=mask_k[:, None] & mask_m[None, :], other=0.0)
        g = tl.load(dy + dst[:, None] * stride_dym + offs_n[None, :] * stride_dyn,
                    mask=mask_m[:, None] & mask_n[None, :], other=0.0)
        if DOT_FP32:
            a_t = a_t.to(tl.float32)
            g = g.to(tl.float32)
        acc = tl.dot(a_t, g, acc, input_precision=INPUT_PRECISION)
    w_ptrs = dw + seg * stride_ws + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    mask = mask_k[:, None] & mask_n[None, :]
    if ATOMIC:
        tl.atomic_add(w_ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.store(w_ptrs, acc.to(dw.dtype.element_ty), mask=mask)
