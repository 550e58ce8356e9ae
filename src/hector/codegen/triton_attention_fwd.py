"""Forward kernels of the fused edge attention (DF-GNN), specialised by ``tl.constexpr`` flags.

One kernel serves both schedules.  A program owns a range of destination rows and, inside
them, a range of edges ``[e_begin, e_end)`` of the CSR-by-destination edge array:

* node-parallel (``EDGE_PARALLEL=False``): one row, all its edges;
* edge-parallel: the edges of one equal-sized chunk and the rows that chunk intersects.  A row
  lying wholly inside the chunk is finished and written directly; a row cut by a chunk boundary
  writes its partial (max, sum, accumulator) to slot 0 (the chunk's first row) or slot 1 (its
  last row) of a partial buffer, and :func:`attention_combine_kernel` merges them.

Tiles are ``[BLOCK_E, BLOCK_H, BLOCK_D]``: a gathered source row holds all heads of a node
contiguously, so heads in the tile make one wide load out of ``H`` narrow ones.  The softmax is
online (running max, rescaled sum and accumulator), so any degree fits in fixed registers and
each edge's exp() is computed exactly once.
"""
import triton
import triton.language as tl


@triton.jit
def _mix32(x):
    # "lowbias32" finaliser; must match hector.backends.torch_attention._mix32 bit for bit.
    x ^= x >> 16
    x = x * 0x7FEB352D
    x ^= x >> 15
    x = x * 0x846CA68B
    x ^= x >> 16
    return x


@triton.jit
def dropout_keep(ids, offs_h, H, seed, threshold):
    """[BLOCK_E, BLOCK_H] keep-mask of canonical edges ``ids`` from (seed, edge id, head):
    counter-based, so the backward pass redraws the forward's mask instead of storing it."""
    x = ids.to(tl.uint32)[:, None] * H + offs_h[None, :].to(tl.uint32)
    x = _mix32(_mix32(x) ^ seed)
    return (x >> 8) >= threshold


@triton.jit
def gather_rows(base, nodes, row_stride, inner, mask):
    """``[BLOCK_E, BLOCK_H, BLOCK_D]`` fp32 tile of node rows ``nodes`` (int64)."""
    return tl.load(base + nodes[:, None, None] * row_stride + inner[None, :, :],
                   mask=mask, other=0.0).to(tl.float32)


@triton.jit
def mask_if(mask, flag):
    """``mask & flag`` for a scalar ``flag`` (written as a select: the interpreter loses the
    bool dtype when broadcasting a scalar bool through ``&``)."""
    return tl.where(flag, mask, False)


@triton.jit
def leaky(pre, slope, HAS_LEAKY: tl.constexpr):
    if HAS_LEAKY:
        return tl.where(pre > 0, pre, pre * slope)
    else:
        return pre


@triton.jit
def program_rows(pid, chunk_rows, E, CHUNK, EDGE_PARALLEL: tl.constexpr):
    """(first row, end row, first edge, end edge) owned by program ``pid``."""
    if EDGE_PARALLEL:
        row_begin = tl.load(chunk_rows + 2 * pid)
        row_end = tl.load(chunk_rows + 2 * pid + 1)
        e_begin = tl.cast(pid, tl.int64) * CHUNK
        e_end = tl.minimum(e_begin + CHUNK, E)
    else:
        row_begin = tl.cast(pid, tl.int64)
        row_end = row_begin + 1
        e_begin = tl.cast(pid, tl.int64) * 0
        e_end = e_begin + E
    return row_begin, row_end, e_begin, e_end


@triton.jit
def attention_fwd_kernel(
        ptr, col, eid, chunk_rows,
        q, k, v, a_src, a_dst, out, lse, m_part, l_part, acc_part,
        scale, slope, seed, drop_threshold, drop_scale,
        E, H, DK, DV, CHUNK,
        HAS_QK: tl.constexpr, HAS_SRC: tl.constexpr, HAS_DST: tl.constexpr,
        HAS_LEAKY: tl.constexpr, HAS_DROPOUT: tl.constexpr, EDGE_PARALLEL: tl.constexpr,
        BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_DK: tl.constexpr,
        BLOCK_DV: tl.constexpr):
    pid = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    inner_k = offs_h[:, None] * DK + offs_dk[None, :]           # [BH, BDK] within a node row
    mask_k = mask_h[:, None] & (offs_dk[None, :] < DK)
    inner_v = offs_h[:, None] * DV + offs_dv[None, :]           # [BH, BDV]
    mask_v = mask_h[:, None] & (offs_dv[None, :] < DV)
    row_begin, row_end, e_begin, e_end = program_rows(pid, chunk_rows, E, CHUNK, EDGE_PARALLEL)

    for row in range(row_begin, row_end):
        start = tl.load(ptr + row)
        stop = tl.load(ptr + row + 1)
        lo = tl.maximum(start, e_begin)
        hi = tl.minimum(stop, e_end)
        row64 = tl.cast(row, tl.int64)
        if HAS_QK:
            q_row = tl.load(q + row64 * H * DK + inner_k, mask=mask_k, other=0.0).to(tl.float32)
        if HAS_DST:
            s_dst = tl.load(a_dst + row64 * H + offs_h, mask=mask_h, other=0.0).to(tl.float32)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
        for e0 in range(lo, hi, BLOCK_E):
            offs_e = e0 + tl.arange(0, BLOCK_E)
            mask_e = offs_e < hi
            u = tl.load(col + offs_e, mask=mask_e, other=0).to(tl.int64)
            s = tl.zeros([BLOCK_E, BLOCK_H], tl.float32)
            if HAS_QK:
                k_t = gather_rows(k, u, H * DK, inner_k, mask_e[:, None, None] & mask_k[None])
                s += scale * tl.sum(k_t * q_row[None, :, :], axis=2)
            if HAS_SRC:
                s += tl.load(a_src + u[:, None] * H + offs_h[None, :],
                             mask=mask_e[:, None] & mask_h[None, :], other=0.0).to(tl.float32)
            if HAS_DST:
                s += s_dst[None, :]
            s = leaky(s, slope, HAS_LEAKY)
            s = tl.where(mask_e[:, None], s, float("-inf"))
            # Every tile holds >= 1 real edge (e0 < hi), so m_new is finite and exp() below
            # never sees (-inf) - (-inf).
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            p = tl.exp(s - m_new[None, :])
            corr = tl.exp(m_i - m_new)
            l_i = l_i * corr + tl.sum(p, axis=0)
            if HAS_DROPOUT:
                # The denominator takes every edge; dropout only thins the aggregation.
                ids = tl.load(eid + offs_e, mask=mask_e, other=0)
                p = tl.where(dropout_keep(ids, offs_h, H, seed, drop_threshold), p * drop_scale, 0.0)
            v_t = gather_rows(v, u, H * DV, inner_v, mask_e[:, None, None] & mask_v[None])
            acc = acc * corr[:, None] + tl.sum(p[:, :, None] * v_t, axis=0)
            m_i = m_new
        has = l_i > 0   # False only for a row without edges: its output is exactly 0
        inv = tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)
        full = (lo == start) & (hi == stop)
        tl.store(out + row64 * H * DV + inner_v, (acc * inv[:, None]).to(out.dtype.element_ty),
                 mask=mask_if(mask_v, full))
        tl.store(lse + row64 * H + offs_h,
                 tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), 0.0), mask=mask_if(mask_h, full))
        if EDGE_PARALLEL:
            slot = tl.cast(pid, tl.int64) * 2 + tl.cast(row != row_begin, tl.int64)
            cut = (lo != start) | (hi != stop)
            tl.store(m_part + slot * H + offs_h, m_i, mask=mask_if(mask_h, cut))
            tl.store(l_part + slot * H + offs_h, l_i, mask=mask_if(mask_h, cut))
            tl.store(acc_part + slot * H * DV + inner_v, acc, mask=mask_if(mask_v, cut))


@triton.jit
def split_row_chunks(b, ptr, chunk_rows, CHUNK):
    """For chunk boundary ``b`` (edge ``b * CHUNK``): the row that contains that edge, and the
    chunk range holding its partials when this is the *first* boundary cutting the row (an
    empty range otherwise, so each split row is combined by exactly one program)."""
    row = tl.load(chunk_rows + 2 * b)
    start = tl.load(ptr + row)
    stop = tl.load(ptr + row + 1)
    edge = tl.cast(b, tl.int64) * CHUNK
    first_cut = (start < edge) & (start >= edge - CHUNK)
    c_begin = tl.cast(b, tl.int64) - 1
    c_end = tl.where(first_cut, (stop - 1) // CHUNK + 1, c_begin)
    return row, first_cut, c_begin, c_end


@triton.jit
def partial_slot(c, chunk_rows, row):
    # Slot 0 holds the chunk's first row, slot 1 its last (see attention_fwd_kernel).
    return c * 2 + (tl.load(chunk_rows + 2 * c) != row).to(tl.int64)


@triton.jit
def attention_combine_kernel(ptr, chunk_rows, m_part, l_part, acc_part, out, lse,
                             H, DV, CHUNK, BLOCK_H: tl.constexpr, BLOCK_DV: tl.constexpr):
    """FlashDecoding-style merge of the partial softmax states of rows cut by chunk
    boundaries; one program per boundary (and block of heads)."""
    b = tl.program_id(0) + 1
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_dv = tl.arange(0, BLOCK_DV)
    inner_v = offs_h[:, None] * DV + offs_dv[None, :]
    mask_v = mask_h[:, None] & (offs_dv[None, :] < DV)
    row, first_cut, c_begin, c_end = split_row_chunks(b, ptr, chunk_rows, CHUNK)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    for c in range(c_begin, c_end):
        slot = partial_slot(c, chunk_rows, row)
        m_c = tl.load(m_part + slot * H + offs_h, mask=mask_h, other=0.0)
        l_c = tl.load(l_part + slot * H + offs_h, mask=mask_h, other=0.0)
        acc_c = tl.load(acc_part + slot * H * DV + inner_v, mask=mask_v, other=0.0)
        m_new = tl.maximum(m_i, m_c)
        old = tl.exp(m_i - m_new)
        new = tl.exp(m_c - m_new)
        l_i = l_i * old + l_c * new
        acc = acc * old[:, None] + acc_c * new[:, None]
        m_i = m_new
    row64 = tl.cast(row, tl.int64)
    safe_l = tl.where(l_i > 0, l_i, 1.0)   # a split row has edges; this only guards padding
    tl.store(out + row64 * H * DV + inner_v, (acc / safe_l[:, None]).to(out.dtype.element_ty),
             mask=mask_if(mask_v, first_cut))
    tl.store(lse + row64 * H + offs_h, m_i + tl.log(safe_l), mask=mask_if(mask_h, first_cut))
