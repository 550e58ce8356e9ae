"""Triton launches of the fused edge attention: :func:`attention_forward` and
:func:`attention_backward` (registry kernels rendered for the spec, edge tile and warps
autotuned on CUDA, plus the combine pass of an edge-parallel traversal) and the helpers they
share (row fills, operand strides, the joint dk|dv buffer).  Plans and row tables come from
:mod:`.plan`; the custom operators and autograd glue that call these launches are in
:mod:`.custom_ops`.

The forward returns the output and one fp32 log-sum-exp per (row, head); the backward
recomputes ``alpha = exp(s - lse)`` from it on the fly (FlashAttention style).

k and v may have any row stride (:func:`rows_dense`): a compiler that computes K and V with one
GEMM into a ``[rows, H*DK + H*DV]`` buffer passes its two column slices as they are, and the
backward can write dk and dv into one such joint buffer (``joint_kv``), the gradient of that
GEMM's output, so neither direction copies the slices apart or back together.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence, Tuple

import torch

from .. import autotune
from .. import registry
from ..sizes import next_pow2
from .plan import (AttentionPlan, _rows_of, chunk_rows, empty_rows, idle_rows, merge_counters,
                   side_csr, side_rows)
from .reference import dropout_threshold
from .spec import AttentionSpec, Schedule, tune_configs


def fill_rows(ids: torch.Tensor, value: torch.Tensor, out: torch.Tensor,
              value_stride: int = 0) -> None:
    """``out[ids] = value[ids]`` for ``[rows, W]`` ``out``, one launch: ``value`` one ``[W]``
    row for all (``value_stride`` 0) or rows ``value_stride`` elements apart."""
    if ids.numel():
        width = out.shape[1]
        block_w = min(next_pow2(width), 128)
        registry.kernel("fill_rows")[(-(-ids.numel() // 32),)](
            ids, ids.numel(), value, out, width, value_stride, BLOCK_R=32, BLOCK_W=block_w)


def bias_stride(bias: Optional[torch.Tensor]) -> int:
    """The row stride the kernels read an epilogue ``bias`` with: 0 for a per-column
    ``[H, Dv]`` bias (one row for all), the row stride of a row-wise ``[rows, H, Dv]``
    addend (dense within a row: :func:`rows_dense`)."""
    return bias.stride(0) if bias is not None and bias.dim() == 3 else 0


def _rows_out(skips: bool, shape, **kw) -> torch.Tensor:
    """A row-side output: zeros where the traversal ``skips`` rows (an edge-parallel one over
    a graph with edgeless rows: those stay exactly 0), else uninitialised, since the kernels
    write every row (a fill of each output was 4-5% of a training step on a 169K-node
    graph whose rows all have self loops)."""
    return (torch.zeros if skips else torch.empty)(shape, **kw)


def score_params(spec: AttentionSpec, strategy: str) -> dict:
    """Render parameters of the traversal kernels (kernels/registry.py): which score terms
    exist, leaky relu, dropout, and the schedule kind."""
    return dict(has_qk=spec.has_qk, has_src=spec.has_src, has_dst=spec.has_dst,
                has_leaky=spec.has_leaky, has_dropout=spec.has_dropout,
                edge_parallel=strategy == "edge", dst_edge=spec.dst_edge,
                shared_kv=spec.shared_kv, normed_k=spec.normed_k,
                merge_last=merges_in_traversal(strategy))


def _tiles(sched: Schedule) -> dict:
    """The ``tl.constexpr`` tile sizes and launch options of one traversal launch."""
    return dict(BLOCK_E=sched.block_e, BLOCK_H=sched.block_h, BLOCK_DK=sched.block_dk,
                BLOCK_DV=sched.block_dv, num_warps=sched.num_warps)


def _merge_tiles(sched: Schedule) -> dict:
    """The traversals' tiles and the partial rows they merge per step where they merge their
    cut rows themselves (:func:`merges_in_traversal`)."""
    width = sched.block_h * max(sched.block_dk, sched.block_dv)
    return dict(_tiles(sched), BLOCK_C=combine_chunks(width))


def merges_in_traversal(strategy: str) -> bool:
    """Whether an edge-parallel traversal merges the rows its chunks cut itself (the last of
    a row's chunks to finish merges the row's partials: the forward's softmax states, the
    backward's gradient sums) instead of a combine launch after it: one launch less per
    forward and per gradient of a cut side, each ~2.5-5 us of a small graph's captured step.
    Opt-in with ``HECTOR_MERGE_LAST=1``: tested under Triton's interpreter, which runs
    programs one after another, so the cross-program ordering it relies on (an
    acquire-release counter) is not yet tested or timed on a GPU."""
    return strategy == "edge" and os.environ.get("HECTOR_MERGE_LAST", "0") not in ("", "0")


def _launch_traversal(name: str, params: dict, plan: AttentionPlan, sched: Schedule, grid,
                      args: tuple, shape: tuple, device: torch.device,
                      accumulates: Optional[torch.Tensor] = None,
                      overwrites: Sequence[torch.Tensor] = ()) -> None:
    """Launch traversal kernel ``name``, its edge tile and warps autotuned around ``sched``
    when the plan allows it.  Trials run on the real outputs: stores leave the same values
    whichever run was last, but an output the kernel sums into with atomics
    (``accumulates``: the destination term's gradient per (dst, relation) row) is zeroed
    before every run, or each autotune trial would add its sums again; inputs the kernel
    writes its outputs over (``overwrites``) are copied once before tuning and put back
    before every trial (that copy exists only while a new shape is tuned)."""
    if grid[0] == 0:       # a side with no rows (a derived graph's): nothing to traverse
        if accumulates is not None:
            accumulates.zero_()
        return
    kernel = registry.kernel(name, **params)

    def run(s: Schedule):
        if accumulates is not None:
            accumulates.zero_()
        kernel[grid](*args, **_merge_tiles(s))
    if plan.tune and autotune.enabled(device):
        # Looked up by this key first: the config list and spec hash cost more host time
        # than the launch, on every call of a step that is not captured.
        bucket = autotune.bucket(*shape)

        def pick():
            kept = [t.clone() for t in overwrites]

            def trial(s: Schedule):
                for t, c in zip(overwrites, kept):
                    t.copy_(c)
                run(s)
            chosen = autotune.choose(name, registry.spec_hash(name, **params), bucket,
                                     tune_configs(sched), trial, device)
            for t, c in zip(overwrites, kept):
                t.copy_(c)
            return chosen
        sched = autotune.memo(
            ("attention", name, tuple(sorted(params.items())), sched, bucket, str(device),
             os.environ.get("HECTOR_CACHE_DIR")), pick)
    run(sched)


def _traversal(graph, csr, sched: Schedule, heads: int):
    """(grid, chunk table, number of chunks) of one traversal over the rows of ``csr``."""
    hb = -(-heads // sched.block_h)
    if sched.strategy == "edge":
        rows = chunk_rows(graph, csr, sched.chunk)
        return (rows.shape[0], hb), rows, rows.shape[0]
    return (csr.ptr.numel() - 1, hb), csr.ptr, 0


#: Partial rows a combine program loads per step (chunks of one cut row), at most this many
#: elements in all: a super node's row cut into 74 chunks (github-musae, 128-edge chunks)
#: took the forward's merge 27.7 us of GAT's 167 us inference, one dependent step per chunk.
COMBINE_TILE = 2048


def combine_chunks(row_width: int) -> int:
    """BLOCK_C of the combine kernels for partial rows ``row_width`` elements wide."""
    return max(1, min(16, COMBINE_TILE // max(row_width, 1)))


def _combine_sum(csr, sched, rows, row_ids, nchunks, part, out):
    """Add the partials of rows cut by chunk boundaries into ``out``, whose rows may be wider
    than the partials' (dk or dv as a slice of a joint dk|dv buffer): its row stride is
    passed."""
    if nchunks > 1:
        width = part.shape[-1]
        block_w = min(1024, next_pow2(width))
        registry.kernel("combine_sum")[(nchunks - 1, -(-width // block_w))](
            csr.ptr, rows, row_ids, part, out, width, out.stride(0), sched.chunk,
            BLOCK_W=block_w, BLOCK_C=combine_chunks(block_w))


def rows_dense(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``t`` itself when its last two dims are dense (``stride(-1) == 1`` and ``stride(-2) ==
    shape[-1]``; a dim of size 1 may have any stride), whatever its row stride; else a
    contiguous copy.  The kernels take q's, k's and v's row strides, so column slices of one
    ``[rows, H*DK + H*DV + ...]`` buffer (the projections computed by one GEMM) are read in
    place, without the copy a ``.contiguous()`` would make."""
    if t is None:
        return None
    last_ok = t.shape[-1] == 1 or t.stride(-1) == 1
    heads_ok = t.dim() < 2 or t.shape[-2] == 1 or t.stride(-2) == t.shape[-1]
    return t if last_ok and heads_ok else t.contiguous()


def kv_rows(spec: AttentionSpec, t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """k or v as the kernels read it: one row per node shared by the heads as it is when
    ``spec.shared_kv`` (head stride 0), else :func:`rows_dense`."""
    if t is not None and spec.shared_kv:
        if t.stride(1) != 0:
            raise ValueError(f"the spec says k and v are shared by the heads (head stride 0); "
                             f"got strides {t.stride()}")
        return t
    return rows_dense(t)


def term_rows(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A ``[rows, H]`` score term as the kernels read it: itself when its heads are adjacent
    (any row stride: GAT's two terms are column slices of one ``[N, 2H]`` product), else a
    contiguous copy.  Not :func:`rows_dense`, which for a 2-D tensor also asks for dense
    rows: the compiler's choice to write gradients over k and v (``_into_kv``) relies on
    that (allowing it there added a copy to RGAT's backward)."""
    if t is None or t.shape[-1] == 1 or t.stride(-1) == 1:
        return t
    return t.contiguous()


def _row_stride(t: Optional[torch.Tensor], dense: int) -> int:
    """Row stride (elements) of a kernel operand; ``dense`` where the slot holds a dummy."""
    return t.stride(0) if t is not None else dense


def _check_joint(joint_kv: bool, need_k: bool, need_v: bool) -> None:
    if joint_kv and not (need_k and need_v):
        raise ValueError("joint_kv=True needs both the k and the v gradient (needs[2] and "
                         f"needs[0]); got need_k={need_k}, need_v={need_v}")


def _joint_kv_buffer(skips: bool, n_src: int, heads: int, dim_k: int, dim_v: int, dtype,
                     device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dkv ``[n_src, H*DK + H*DV]``, dk, dv): dk and dv are views of its two column slices,
    so the backward writes the gradient of a joint K|V GEMM output directly (the kernels
    take dk's and dv's row strides).  Zeros where the traversal ``skips`` rows, like
    :func:`_rows_out`."""
    dkv = _rows_out(skips, (n_src, heads * (dim_k + dim_v)), dtype=dtype, device=device)
    dk = dkv[:, :heads * dim_k].unflatten(1, (heads, dim_k))
    dv = dkv[:, heads * dim_k:].unflatten(1, (heads, dim_v))
    return dkv, dk, dv


def _check_into(v: Optional[torch.Tensor], k: Optional[torch.Tensor]) -> None:
    """The k and v that ``into_kv`` writes over: read by the kernels in place (no copy) and
    disjoint (two column ranges of one buffer, or two buffers)."""
    for t, name in ((v, "v"), (k, "k")):
        if t is not None and rows_dense(t) is not t:
            raise ValueError(f"into_kv: {name} must have dense heads and columns (any row "
                             f"stride) to be written in place; got strides {t.stride()}")
    if v is not None and k is not None and overlap(v, k):
        raise ValueError("into_kv: k and v overlap in memory, so their gradients cannot "
                         "both be written over them")


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may share elements (conservative): one storage and intersecting
    spans, unless both are ``[rows, ...]`` tensors of the same rows and row stride, dense
    within a row, whose column ranges do not intersect (k and v as two column slices of one
    K|V GEMM output)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    size = a.element_size()
    spans = [(t.data_ptr(), t.data_ptr() + size * (1 + sum((n - 1) * st for n, st in
                                                           zip(t.shape, t.stride()))))
             for t in (a, b)]
    if spans[0][1] <= spans[1][0] or spans[1][1] <= spans[0][0]:
        return False
    stride = a.stride(0)
    if (b.stride(0) != stride or a.shape[0] != b.shape[0] or b.element_size() != size
            or any(rows_dense(t) is not t or t[0].numel() > stride for t in (a, b))):
        return True
    base = a.untyped_storage().data_ptr()
    ca, cb = ((t.data_ptr() - base) // size for t in (a, b))
    if ca // stride != cb // stride:     # not the same rows
        return True
    lo_a, lo_b = ca % stride, cb % stride
    return not (lo_a + a[0].numel() <= lo_b or lo_b + b[0].numel() <= lo_a)


def joint_of(dk: torch.Tensor, dv: torch.Tensor) -> torch.Tensor:
    """The joint ``[n_src, H*DK + H*DV]`` buffer whose column slices are the dk and dv that
    ``attention_backward(..., joint_kv=True)`` returned (the tensor itself, not a view, when
    dk still knows it as its base)."""
    width = dk.shape[1] * dk.shape[2] + dv.shape[1] * dv.shape[2]
    base = dk._base
    if base is not None and tuple(base.shape) == (dk.shape[0], width) and \
            base.data_ptr() == dk.data_ptr() and base.is_contiguous():
        return base
    # Rebuilt from the views only if they are exactly its two column slices.
    if dk.shape[0] and (dk.stride(0) != width or dv.stride(0) != width or
                        dv.data_ptr() != dk.data_ptr() + dk.shape[1] * dk.shape[2]
                        * dk.element_size()):
        raise RuntimeError("joint_of: dk and dv are not the column slices of one "
                           "[rows, H*DK + H*DV] buffer")
    return dk.as_strided((dk.shape[0], width), (width, 1), dk.storage_offset())


def attention_forward(graph, spec: AttentionSpec, plan: AttentionPlan, params: tuple,
                      v, q, k, a_src, a_dst, bias=None, dst_index=None, k_norm=None):
    """(out, lse): the forward traversal (and the combine pass of an edge-parallel one).
    ``bias`` ``[H, Dv]``, or ``[rows, H, Dv]`` one row per output row, with any row stride
    (or None): added to the output rows by the kernels' epilogue.
    ``dst_index`` (``spec.dst_edge``): each canonical edge's row of ``a_dst``.  ``k``, ``v``:
    any row stride (:func:`rows_dense`), or one row shared by the heads (``spec.shared_kv``).
    ``k_norm`` (``spec.normed_k``): ``[N]`` fp32, k's rows as v's divided by it (k is not
    read)."""
    v, k, q, bias = kv_rows(spec, v), kv_rows(spec, k), rows_dense(q), rows_dense(bias)
    a_src, a_dst = term_rows(a_src), term_rows(a_dst)
    _, heads, dim_v = v.shape
    n = side_rows(graph, "dst")
    sb = bias_stride(bias)
    sched = plan.dst
    full = side_csr(graph, "dst")
    csr, row_ids, n_rows = _rows_of(graph, full, sched, "dst")
    skips = csr is not full                    # edgeless rows left out (edge-parallel)
    out = torch.empty((n, heads, dim_v), dtype=v.dtype, device=v.device)
    if skips:
        # The rows the kernels skip hold the bias alone, or zeros: written there only (for a
        # 1.94M x 64 fp32 output, 1.13M rows skipped, on the H200: a full-height zero fill
        # took 0.1 ms, a broadcast copy of the bias 0.29 ms, an index_put 0.27).
        fill_rows(idle_rows(graph, full, empty_rows(graph, "dst")),
                  out.new_zeros(heads * dim_v) if bias is None else bias,
                  out.view(n, heads * dim_v), sb)
    lse = _rows_out(skips, (n, heads), dtype=torch.float32, device=v.device)
    grid, rows, nchunks = _traversal(graph, csr, sched, heads)
    if sched.strategy == "edge":
        m_part = torch.empty(nchunks, 2, heads, dtype=torch.float32, device=v.device)
        l_part = torch.empty_like(m_part)
        acc_part = torch.empty(nchunks, 2, heads, dim_v, dtype=torch.float32, device=v.device)
    else:
        m_part = l_part = acc_part = lse
    merge = merges_in_traversal(sched.strategy)
    counts = merge_counters(graph, csr, sched.chunk, grid[1]) if merge else lse
    if n > 0:
        has_bias = bias is not None
        args = (csr.ptr, csr.col, csr.eid, rows, row_ids, _or(q, v), _or(k, v), v,
                _or(a_src, lse), _or(a_dst, lse), _or(dst_index, lse), _or(k_norm, lse),
                _or(bias, lse), out,
                lse, m_part, l_part,
                acc_part, counts, *_scalars(params, lse), graph.num_edges, heads, spec.dim_qk,
                dim_v,
                _row_stride(q, heads * spec.dim_qk), _or(k, v).stride(0), v.stride(0),
                _row_stride(a_src, heads), _row_stride(a_dst, heads), sb, sched.chunk)
        _launch_traversal("attention_fwd", dict(score_params(spec, sched.strategy),
                                                has_bias=has_bias),
                          plan, sched, grid, args, _shape(n_rows, graph.num_edges, spec),
                          v.device)
        if nchunks > 1 and not merge:
            registry.kernel("attention_combine", has_bias=has_bias)[(nchunks - 1, grid[1])](
                csr.ptr, rows, row_ids, m_part, l_part, acc_part, _or(bias, lse), out, lse,
                heads, dim_v, sb, sched.chunk, BLOCK_H=sched.block_h, BLOCK_DV=sched.block_dv,
                BLOCK_C=combine_chunks(sched.block_h * sched.block_dv))
    return out, lse


def attention_backward(graph, spec: AttentionSpec, plan: AttentionPlan, params: tuple,
                       needs: tuple, dout, v, q, k, a_src, a_dst, out, lse, dlse=None,
                       bias=None, dst_index=None, joint_kv: bool = False,
                       into_kv: bool = False, k_norm=None):
    """(dv, dq, dk, d a_src, d a_dst), None where ``needs`` (same order) is False.
    ``dlse``: the gradient of the log-sum-exp output, if it has one.  Since ``d lse_v / d
    s_e = alpha_e``, it joins ``ds_e = alpha_e (<dout_v, v_u> - delta_v)`` as ``delta_v -
    dlse_v``: the kernels run unchanged.  ``dst_index`` (``spec.dst_edge``): each canonical
    edge's row of ``a_dst``, whose gradient then has ``a_dst``'s rows (summed with atomics).
    Other gradients have their side's rows (:func:`side_rows`: a derived graph's sources or
    destinations).  ``bias``: the forward's epilogue bias, which ``out`` includes
    (subtracted where delta reads ``out``).  ``k``, ``v``: any row stride (:func:`rows_dense`).

    ``joint_kv`` (needs both the k and the v gradient): dk and dv are written into one
    ``[n_src, H*DK + H*DV]`` buffer (dk's columns first) and returned as views of it
    (:func:`joint_of` gives it back): the gradient of a GEMM that computed K and V together
    into such a buffer, with no concatenation afterwards.

    ``into_kv``: dk and dv are written over k's and v's own rows (the caller's last read of
    them; see :func:`edge_attention_grads_triton`), which must then need no copy
    (:func:`rows_dense`) and not overlap: the source-side kernel reads a row's k and v only
    in the program that writes its gradients, after the destination side read them per edge.
    Returned as those same tensors (with ``joint_kv``, column views of one buffer).

    ``k_norm`` (``spec.normed_k``): k's rows are v's divided by it; the destination side
    forms k from v's gathered rows (the source side reads its own rows of k)."""
    need_v, need_q, need_k, need_src, need_dst = needs
    _check_joint(joint_kv, need_k, need_v)
    if spec.shared_kv and (joint_kv or into_kv):
        raise ValueError("joint_kv / into_kv need k and v with a row per head; these are "
                         "shared by the heads (spec.shared_kv)")
    if into_kv:
        _check_into(v if need_v else None, k if need_k else None)
    v, k, q, bias = kv_rows(spec, v), kv_rows(spec, k), rows_dense(q), rows_dense(bias)
    a_src, a_dst = term_rows(a_src), term_rows(a_dst)
    n_src, heads, dim_v = v.shape              # (side_rows(graph, "src"))
    n = side_rows(graph, "dst")
    dim_k = spec.dim_qk
    dout = dout.contiguous()
    if graph.num_nodes == 0 or not any((need_v, need_q, need_k, need_src, need_dst)):
        empty = [torch.empty_like(t) if need else None for t, need in
                 ((v, need_v), (q, need_q), (k, need_k), (a_src, need_src), (a_dst, need_dst))]
        if into_kv:      # no edges: zero gradients, in the consumed rows
            empty[0], empty[2] = (t.zero_() if need else None
                                  for t, need in ((v, need_v), (k, need_k)))
        elif joint_kv:
            _, empty[2], empty[0] = _joint_kv_buffer(False, n_src, heads, dim_k, dim_v,
                                                     k.dtype, v.device)
        return tuple(empty)
    dq = dk = dv = da_src = da_dst = None
    delta = torch.empty(n, heads, dtype=torch.float32, device=v.device)
    rows_total = n * heads
    registry.kernel("row_dot", has_bias=bias is not None)[(-(-rows_total // 16),)](
        dout, out, _or(bias, delta), delta, rows_total, dim_v, heads, bias_stride(bias),
        BLOCK_R=16,
        BLOCK_D=min(next_pow2(dim_v), 128))
    if dlse is not None:
        delta -= dlse
    fp32 = dict(dtype=torch.float32, device=v.device)

    if need_q or need_dst:
        # Rows are destinations: q, a_dst, dout, lse, delta are read (and dq, d a_dst
        # written) per row; k, v, a_src per edge through the column ids.
        sched = plan.dst
        full = side_csr(graph, "dst")
        csr, row_ids, n_rows = _rows_of(graph, full, sched, "dst")
        skips = csr is not full
        tensors = (_or(q, v), _or(k, v), v, _or(a_src, lse), _or(a_dst, lse),
                   _or(dst_index, lse), _or(k_norm, lse), dout, lse, delta)
        dq = _rows_out(skips, (n, heads, dim_k), dtype=q.dtype, device=v.device) if need_q else None
        per_edge = need_dst and spec.dst_edge     # summed per edge into a_dst's rows
        if per_edge:     # zeroed by the launch (before every autotune trial too)
            da_dst = torch.empty(a_dst.shape[0], heads, **fp32)
        elif need_dst:
            da_dst = _rows_out(skips, (n, heads), dtype=a_dst.dtype, device=v.device)
        grid, rows, nchunks = _traversal(graph, csr, sched, heads)
        dq_part = torch.empty(nchunks, 2, heads * dim_k, **fp32) if need_q and nchunks else lse
        dd_part = (torch.empty(nchunks, 2, heads, **fp32) if need_dst and nchunks
                   and not per_edge else lse)
        merge = merges_in_traversal(sched.strategy)
        counts = merge_counters(graph, csr, sched.chunk, grid[1]) if merge else lse
        args = (csr.ptr, csr.col, csr.eid, rows, row_ids, *tensors, _or(dq, lse),
                _or(da_dst, lse), dq_part, dd_part, counts, *_scalars(params, lse),
                graph.num_edges,
                heads, dim_k, dim_v, _row_stride(q, heads * dim_k), tensors[1].stride(0),
                v.stride(0), _row_stride(a_src, heads), _row_stride(a_dst, heads), sched.chunk)
        _launch_traversal("attention_bwd_dst", dict(score_params(spec, sched.strategy),
                                                    need_dq=need_q, need_ddst=need_dst),
                          plan, sched, grid, args, _shape(n_rows, graph.num_edges, spec),
                          v.device, accumulates=da_dst if per_edge else None)
        for flag, part, grad in ((need_q, dq_part, dq),
                                 (need_dst and not per_edge, dd_part, da_dst)):
            if flag and not merge:
                _combine_sum(csr, sched, rows, row_ids, nchunks, part, grad)
        if per_edge:
            da_dst = da_dst.to(a_dst.dtype)

    if need_k or need_v or need_src:
        # Rows are sources: k, v, a_src are read (and dk, dv, d a_src written) per row;
        # q, a_dst, dout, lse, delta per edge through the column ids (destinations).
        sched = plan.src
        full = side_csr(graph, "src")
        csr, row_ids, n_rows = _rows_of(graph, full, sched, "src")
        skips = csr is not full
        tensors = (_or(q, v), _or(k, v), v, _or(a_src, lse), _or(a_dst, lse),
                   _or(dst_index, lse), dout, lse, delta)
        new = dict(device=v.device)
        if into_kv:
            dk, dv = (k if need_k else None), (v if need_v else None)
        elif joint_kv:
            _, dk, dv = _joint_kv_buffer(skips, n_src, heads, dim_k, dim_v, k.dtype, v.device)
        else:
            dk = _rows_out(skips, (n_src, heads, dim_k), dtype=k.dtype, **new) if need_k else None
            dv = _rows_out(skips, (n_src, heads, dim_v), dtype=v.dtype, **new) if need_v else None
        da_src = (_rows_out(skips, (n_src, heads), dtype=a_src.dtype, **new) if need_src
                  else None)
        grid, rows, nchunks = _traversal(graph, csr, sched, heads)
        dk_part = torch.empty(nchunks, 2, heads * dim_k, **fp32) if need_k and nchunks else lse
        dv_part = torch.empty(nchunks, 2, heads * dim_v, **fp32) if need_v and nchunks else lse
        ds_part = torch.empty(nchunks, 2, heads, **fp32) if need_src and nchunks else lse
        merge = merges_in_traversal(sched.strategy)
        counts = merge_counters(graph, csr, sched.chunk, grid[1]) if merge else lse
        args = (csr.ptr, csr.col, csr.eid, rows, row_ids, *tensors, _or(dk, lse), _or(dv, lse),
                _or(da_src, lse), dk_part, dv_part, ds_part, counts, *_scalars(params, lse),
                graph.num_edges, heads, dim_k, dim_v, _row_stride(q, heads * dim_k),
                tensors[1].stride(0), v.stride(0), _row_stride(a_src, heads),
                _row_stride(a_dst, heads), _row_stride(dk, heads * dim_k),
                _row_stride(dv, heads * dim_v), sched.chunk)
        consumed = [t for t in (dk, dv) if t is not None] if into_kv else []
        _launch_traversal("attention_bwd_src", dict(score_params(spec, sched.strategy),
                                                    need_dk=need_k, need_dv=need_v,
                                                    need_dsrc=need_src),
                          plan, sched, grid, args, _shape(n_rows, graph.num_edges, spec),
                          v.device, overwrites=consumed)
        for flag, part, grad in ((need_k, dk_part, dk), (need_v, dv_part, dv),
                                 (need_src, ds_part, da_src)):
            if flag and not merge:
                _combine_sum(csr, sched, rows, row_ids, nchunks, part, grad)
        if consumed and skips:      # rows with no edges were not written: their gradient is 0
            # (index_fill_: the value a kernel argument; ``keep[ids] = 1`` would copy a CPU
            # scalar in, which a CUDA graph capture refuses)
            keep = torch.zeros(n_src, dtype=v.dtype, device=v.device)
            keep.index_fill_(0, row_ids.long(), 1)
            for t in consumed:
                t.mul_(keep.view(-1, 1, 1))
    return dv, dq, dk, da_src, da_dst


def _shape(rows: int, edges: int, spec: AttentionSpec) -> tuple:
    """Sizes whose power-of-two bucket keys a traversal's tuning: rows, edges, row width."""
    return rows, edges, spec.heads * max(spec.dim_qk, spec.dim_v)


def _or(t: Optional[torch.Tensor], dummy: torch.Tensor) -> torch.Tensor:
    # Absent operands are not rendered into the kernel; any pointer fills the slot.
    return t if t is not None else dummy


def _scalars(params: tuple, dummy: torch.Tensor):
    """(scale, slope, seed pointer, keep threshold, 1/(1-p)) as the kernels take them; the
    seed is read by the kernels from device memory (``dummy`` fills the slot without
    dropout, where the kernels are rendered without the read)."""
    scale, slope, p, seed = params
    return (float(scale), float(slope if slope is not None else 0.0),
            seed_tensor(seed, dummy.device) if p > 0 else dummy,
            dropout_threshold(p) if p > 0 else 0, 1.0 / (1.0 - p) if p > 0 else 1.0)


def seed_tensor(seed, device) -> torch.Tensor:
    """The dropout seed as the one-element int64 device tensor the kernels read: a tensor
    seed as it is (drawn on the device: see ``op.draw_seed``), an int filled in on the device
    (a fill, not a host-to-device copy)."""
    if isinstance(seed, torch.Tensor):
        return seed.reshape(1).to(device=device, dtype=torch.int64)
    return torch.full((1,), int(seed or 0) & 0x7FFFFFFF, dtype=torch.int64, device=device)
