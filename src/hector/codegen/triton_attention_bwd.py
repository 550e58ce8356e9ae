"""Backward kernels of the fused edge attention.

With ``o_v = sum_u alpha_uv z_uv m_u`` (``z`` = dropout mask / (1 - p), 1 without dropout) and
``dO_v`` the incoming gradient::

    g_uv     = z_uv <dO_v, m_u>                 d loss / d alpha_uv
    delta_v  = sum_u alpha_uv g_uv = <dO_v, o_v>
    ds_uv    = alpha_uv (g_uv - delta_v)       then times leaky_relu'(pre-activation score)
    dq_v = scale sum_u ds_uv k_u,  da_dst_v = sum_u ds_uv                 (destination side)
    dm_u = sum_v alpha_uv z_uv dO_v,  dk_u = scale sum_v ds_uv q_v,  da_src_u = sum_v ds_uv

``alpha_uv = exp(s_uv - lse_v)`` is recomputed from the forward's per-row log-sum-exp.

Source-side gradients traverse CSR-by-source, so each is a plain row reduction (no atomics).
We *recompute* ds per out-edge there instead of materialising an [E, H] ds buffer: the program
for source ``u`` already holds ``k_u``, ``m_u`` and ``a_src[u]`` in registers, and the per-edge
gathers the recompute needs (``q_v`` and ``dO_v``) are exactly the ones ``dk_u`` and ``dm_u``
need anyway; the rest is [H] scalars (``a_dst``, ``lse``, ``delta``).  So recomputing costs a
few FLOPs per edge and saves writing and re-reading 4*E*H bytes plus the buffer itself.

Both sides use the two schedules of the forward (one row per program, or equal edge chunks
with cut rows written to partial slots); gradients are sums, so cut rows are combined by
:func:`combine_sum_kernel` without any rescaling.
"""
import triton
import triton.language as tl

from .triton_attention_fwd import (dropout_keep, gather_rows, leaky, mask_if, partial_slot,
                                   program_rows, split_row_chunks)


@triton.jit
def _store_grad(dst, part, pid, row, row_begin, full, inner, mask, W, value,
                EDGE_PARALLEL: tl.constexpr):
    """Write one row's gradient slice: directly when the row is whole in this program, to the
    partial slot when a chunk boundary cut it."""
    tl.store(dst + tl.cast(row, tl.int64) * W + inner, value.to(dst.dtype.element_ty), mask=mask_if(mask, full))
    if EDGE_PARALLEL:
        slot = tl.cast(pid, tl.int64) * 2 + tl.cast(row != row_begin, tl.int64)
        tl.store(part + slot * W + inner, value, mask=mask_if(mask, full == 0))


@triton.jit
def attention_bwd_dst_kernel(
        ptr, col, eid, chunk_rows,
        q, k, v, a_src, a_dst, dout, lse, delta, dq, da_dst, dq_part, dd_part,
        scale, slope, seed, drop_threshold, drop_scale,
        E, H, DK, DV, CHUNK,
        HAS_QK: tl.constexpr, HAS_SRC: tl.constexpr, HAS_DST: tl.constexpr,
        HAS_LEAKY: tl.constexpr, HAS_DROPOUT: tl.constexpr, NEED_DQ: tl.constexpr,
        NEED_DDST: tl.constexpr, EDGE_PARALLEL: tl.constexpr,
        BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_DK: tl.constexpr,
        BLOCK_DV: tl.constexpr):
    """Destination side (rows of CSR-by-destination): dq and d a_dst."""
    pid = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    inner_k = offs_h[:, None] * DK + offs_dk[None, :]
    mask_k = mask_h[:, None] & (offs_dk[None, :] < DK)
    inner_v = offs_h[:, None] * DV + offs_dv[None, :]
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
        do_row = tl.load(dout + row64 * H * DV + inner_v, mask=mask_v, other=0.0).to(tl.float32)
        lse_row = tl.load(lse + row64 * H + offs_h, mask=mask_h, other=0.0)
        delta_row = tl.load(delta + row64 * H + offs_h, mask=mask_h, other=0.0)
        dq_acc = tl.zeros([BLOCK_H, BLOCK_DK], tl.float32)
        dd_acc = tl.zeros([BLOCK_H], tl.float32)
        for e0 in range(lo, hi, BLOCK_E):
            offs_e = e0 + tl.arange(0, BLOCK_E)
            mask_e = offs_e < hi
            u = tl.load(col + offs_e, mask=mask_e, other=0).to(tl.int64)
            pre = tl.zeros([BLOCK_E, BLOCK_H], tl.float32)
            if HAS_QK:
                k_t = gather_rows(k, u, H * DK, inner_k, mask_e[:, None, None] & mask_k[None])
                pre += scale * tl.sum(k_t * q_row[None, :, :], axis=2)
            if HAS_SRC:
                pre += tl.load(a_src + u[:, None] * H + offs_h[None, :],
                               mask=mask_e[:, None] & mask_h[None, :], other=0.0).to(tl.float32)
            if HAS_DST:
                pre += s_dst[None, :]
            alpha = tl.exp(leaky(pre, slope, HAS_LEAKY) - lse_row[None, :])
            alpha = tl.where(mask_e[:, None], alpha, 0.0)
            v_t = gather_rows(v, u, H * DV, inner_v, mask_e[:, None, None] & mask_v[None])
            g = tl.sum(v_t * do_row[None, :, :], axis=2)
            if HAS_DROPOUT:
                ids = tl.load(eid + offs_e, mask=mask_e, other=0)
                g = tl.where(dropout_keep(ids, offs_h, H, seed, drop_threshold), g * drop_scale, 0.0)
            ds = alpha * (g - delta_row[None, :])
            if HAS_LEAKY:
                ds = tl.where(pre > 0, ds, ds * slope)
            if NEED_DQ:
                dq_acc += tl.sum(ds[:, :, None] * k_t, axis=0)
            if NEED_DDST:
                dd_acc += tl.sum(ds, axis=0)
        full = (lo == start) & (hi == stop)
        if NEED_DQ:
            _store_grad(dq, dq_part, pid, row, row_begin, full, inner_k, mask_k, H * DK,
                        dq_acc * scale, EDGE_PARALLEL)
        if NEED_DDST:
            _store_grad(da_dst, dd_part, pid, row, row_begin, full, offs_h, mask_h, H, dd_acc,
                        EDGE_PARALLEL)


@triton.jit
def attention_bwd_src_kernel(
        ptr, col, eid, chunk_rows,
        q, k, v, a_src, a_dst, dout, lse, delta, dk, dv, da_src, dk_part, dv_part, ds_part,
        scale, slope, seed, drop_threshold, drop_scale,
        E, H, DK, DV, CHUNK,
        HAS_QK: tl.constexpr, HAS_SRC: tl.constexpr, HAS_DST: tl.constexpr,
        HAS_LEAKY: tl.constexpr, HAS_DROPOUT: tl.constexpr, NEED_DK: tl.constexpr,
        NEED_DV: tl.constexpr, NEED_DSRC: tl.constexpr, EDGE_PARALLEL: tl.constexpr,
        BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_DK: tl.constexpr,
        BLOCK_DV: tl.constexpr):
    """Source side (rows of CSR-by-source; ``col`` holds destinations): dk, dv, d a_src."""
    pid = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    inner_k = offs_h[:, None] * DK + offs_dk[None, :]
    mask_k = mask_h[:, None] & (offs_dk[None, :] < DK)
    inner_v = offs_h[:, None] * DV + offs_dv[None, :]
    mask_v = mask_h[:, None] & (offs_dv[None, :] < DV)
    row_begin, row_end, e_begin, e_end = program_rows(pid, chunk_rows, E, CHUNK, EDGE_PARALLEL)

    for row in range(row_begin, row_end):
        start = tl.load(ptr + row)
        stop = tl.load(ptr + row + 1)
        lo = tl.maximum(start, e_begin)
        hi = tl.minimum(stop, e_end)
        row64 = tl.cast(row, tl.int64)
        if HAS_QK:
            k_row = tl.load(k + row64 * H * DK + inner_k, mask=mask_k, other=0.0).to(tl.float32)
        if HAS_SRC:
            s_src = tl.load(a_src + row64 * H + offs_h, mask=mask_h, other=0.0).to(tl.float32)
        v_row = tl.load(v + row64 * H * DV + inner_v, mask=mask_v, other=0.0).to(tl.float32)
        dk_acc = tl.zeros([BLOCK_H, BLOCK_DK], tl.float32)
        dv_acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
        dsrc_acc = tl.zeros([BLOCK_H], tl.float32)
        for e0 in range(lo, hi, BLOCK_E):
            offs_e = e0 + tl.arange(0, BLOCK_E)
            mask_e = offs_e < hi
            mask_eh = mask_e[:, None] & mask_h[None, :]
            w = tl.load(col + offs_e, mask=mask_e, other=0).to(tl.int64)
            pre = tl.zeros([BLOCK_E, BLOCK_H], tl.float32)
            if HAS_QK:
                q_t = gather_rows(q, w, H * DK, inner_k, mask_e[:, None, None] & mask_k[None])
                pre += scale * tl.sum(q_t * k_row[None, :, :], axis=2)
            if HAS_SRC:
                pre += s_src[None, :]
            if HAS_DST:
                pre += tl.load(a_dst + w[:, None] * H + offs_h[None, :], mask=mask_eh,
                               other=0.0).to(tl.float32)
            lse_t = tl.load(lse + w[:, None] * H + offs_h[None, :], mask=mask_eh, other=0.0)
            delta_t = tl.load(delta + w[:, None] * H + offs_h[None, :], mask=mask_eh, other=0.0)
            alpha = tl.exp(leaky(pre, slope, HAS_LEAKY) - lse_t)
            alpha = tl.where(mask_e[:, None], alpha, 0.0)
            do_t = gather_rows(dout, w, H * DV, inner_v, mask_e[:, None, None] & mask_v[None])
            g = tl.sum(do_t * v_row[None, :, :], axis=2)
            if HAS_DROPOUT:
                ids = tl.load(eid + offs_e, mask=mask_e, other=0)
                z = tl.where(dropout_keep(ids, offs_h, H, seed, drop_threshold), drop_scale, 0.0)
                g = g * z
                weight = alpha * z
            else:
                weight = alpha
            if NEED_DV:
                dv_acc += tl.sum(weight[:, :, None] * do_t, axis=0)
            ds = alpha * (g - delta_t)
            if HAS_LEAKY:
                ds = tl.where(pre > 0, ds, ds * slope)
            if NEED_DK:
                dk_acc += tl.sum(ds[:, :, None] * q_t, axis=0)
            if NEED_DSRC:
                dsrc_acc += tl.sum(ds, axis=0)
        full = (lo == start) & (hi == stop)
        if NEED_DK:
            _store_grad(dk, dk_part, pid, row, row_begin, full, inner_k, mask_k, H * DK,
                        dk_acc * scale, EDGE_PARALLEL)
        if NEED_DV:
            _store_grad(dv, dv_part, pid, row, row_begin, full, inner_v, mask_v, H * DV, dv_acc,
                        EDGE_PARALLEL)
        if NEED_DSRC:
            _store_grad(da_src, ds_part, pid, row, row_begin, full, offs_h, mask_h, H, dsrc_acc,
                        EDGE_PARALLEL)


@triton.jit
def combine_sum_kernel(ptr, chunk_rows, part, out, W, CHUNK, BLOCK_W: tl.constexpr):
    """Sum the partial gradients [chunks, 2, W] of rows cut by chunk boundaries into
    ``out`` [rows, W]; one program per boundary and block of W."""
    b = tl.program_id(0) + 1
    offs_w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    mask_w = offs_w < W
    row, first_cut, c_begin, c_end = split_row_chunks(b, ptr, chunk_rows, CHUNK)
    acc = tl.zeros([BLOCK_W], tl.float32)
    for c in range(c_begin, c_end):
        slot = partial_slot(c, chunk_rows, row)
        acc += tl.load(part + slot * W + offs_w, mask=mask_w, other=0.0)
    tl.store(out + tl.cast(row, tl.int64) * W + offs_w, acc.to(out.dtype.element_ty),
             mask=mask_if(mask_w, first_cut))


@triton.jit
def row_dot_kernel(a, b, out, R, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """``out[r] = <a[r], b[r]>`` in fp32 over rows of length D (delta = <dO_v, o_v> per head)."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = offs_r < R
    acc = tl.zeros([BLOCK_R], tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask = mask_r[:, None] & (offs_d[None, :] < D)
        idx = offs_r.to(tl.int64)[:, None] * D + offs_d[None, :]
        x = tl.load(a + idx, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(b + idx, mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(x * y, axis=1)
    tl.store(out + offs_r, acc, mask=mask_r)
