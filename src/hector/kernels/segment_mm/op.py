"""``segment_mm``: Hector's gather/scatter segment GEMM as a public op, entry of this kernel
family.  The typed linear layers of the compiler (per relation, per node type, per
compact row) all lower to it.  Inputs are validated here (DESIGN.md section 6); the work is done
by the torch backend (:mod:`hector.kernels.segment_mm.reference`) or the Triton kernels
(:mod:`hector.kernels.segment_mm.launch`)."""
from __future__ import annotations

from typing import Optional, Union

import torch

from ... import checks as C
from ...device import choose_backend
from ..eager import call
from .bounds import DeviceBounds
from .custom_ops import segment_mm_csr_op, segment_mm_csr_scatter_op, segment_mm_triton
from .launch import out_width
from .reference import csr_rows_torch, csr_rows_transposed_torch, segment_mm_torch
from .spec import NARROW, PROLOGUES, GemmSchedule, is_narrow

_INDEX_DTYPES = (torch.int32, torch.int64)


def segment_mm(x: torch.Tensor, weight: torch.Tensor, seg_ptr, *,
               gather: Optional[torch.Tensor] = None, scatter: Optional[torch.Tensor] = None,
               num_out_rows: Optional[int] = None, transpose_weight: bool = False,
               backend: str = "auto",
               schedule: Union[None, str, GemmSchedule] = None,
               gather_unique: bool = False, scatter_unique: bool = False,
               bias: Optional[torch.Tensor] = None,
               prologue: Optional[str] = None,
               addend: Optional[torch.Tensor] = None,
               extra_weight: Optional[torch.Tensor] = None,
               capacity: Optional[int] = None):
    r"""Segment GEMM with an optional gather on the input rows and scatter-add on the output
    rows: a typed linear layer whose weight is picked per segment of rows.

    There are :math:`M` = ``seg_ptr[-1]`` logical rows; row :math:`r` with
    ``seg_ptr[s] <= r < seg_ptr[s+1]`` uses ``weight[s]``:

    .. math::
        a_r = x_{g(r)}, \qquad y_r = a_r W_s \;(\text{or } a_r W_s^\top) \;[+\, b_s], \qquad
        \text{out}_{c(r)} \mathrel{+}= y_r

    with :math:`g(r)` = ``gather[r]`` (or :math:`r`) and :math:`c(r)` = ``scatter[r]``;
    without ``scatter`` row :math:`r` of the output is :math:`y_r`.  Products accumulate in
    float32 and the output has ``x``'s dtype.  Differentiable in ``x`` and ``weight``.

    Args:
        x: ``[X, K]`` input rows.
        weight: ``[S, K, N]`` one weight per segment (``[S, N, K]`` with
            ``transpose_weight``), same dtype as ``x``.
        seg_ptr: ``[S + 1]`` int32/int64 non-decreasing segment bounds, ``seg_ptr[0] = 0``
            (e.g. ``graph.rel_ptr``), or the same as a list/tuple of Python ints.  A tensor
            is read on the host once per call (a CPU tensor saves a device sync; Python ints
            save the read, and let ``torch.compile`` trace the call).
        gather: ``[M]`` int32/int64 row of ``x`` for each logical row; without it ``M = X``.
        scatter: ``[M]`` int32/int64 output row of each logical row (summed into).
        num_out_rows: number of output rows; required with ``scatter``.
        transpose_weight: use ``weight[s].T`` (weights stored ``[S, N, K]``; the backward
            of a typed linear).
        backend: 'auto' | 'torch' | 'triton' ('auto': Triton on CUDA or under
            ``TRITON_INTERPRET=1``, torch otherwise).
        schedule: Triton tiling: None (on CUDA the autotuner's pick from a small config
            list, timed once per shape bucket and kept in the kernel cache; the heuristic
            under the interpreter or with ``HECTOR_AUTOTUNE=0``), ``"autotune"`` (the same,
            spelled out) or a pinned :class:`hector.kernels.segment_mm.spec.GemmSchedule`.
        gather_unique: ``gather`` is a permutation of ``x``'s rows (``X = M``): the backward
            stores ``dx`` rows once instead of summing them with atomics into zeros.
        scatter_unique: ``scatter`` is a permutation of the output rows (``num_out_rows =
            M``): rows are stored once, not summed into a zeroed fp32 buffer with atomics.
            Both are promises (checked with ``HECTOR_DEBUG=1``); the torch backend sums as
            always, which gives the same result for a permutation.
        bias: ``[S, N]`` added to each logical row of segment ``s`` (before the scatter), by
            the kernel's epilogue; differentiable (its gradient sums ``dy``'s rows per
            segment).
        prologue: an elementwise function of ``x`` applied as its rows are loaded, one of
            ``hector.kernels.segment_mm.spec.PROLOGUES`` (``"gelu"``, ``"relu"``,
            ``"sigmoid"``, ``"tanh"``): the product of ``f(x)`` with no ``f(x)`` tensor;
            differentiable (``dx = (dy W^T) f'(x)``).
        addend: ``[rows, N]`` (the output's shape) added to the output, row by row, by the
            kernel's epilogue in fp32 before the one rounding (a residual or a sum computed
            elsewhere, with no pass of its own); floating point, on ``x``'s device.  Only
            where each output row is stored once: no ``scatter``, or ``scatter_unique``.
            Differentiable (its gradient is the output's).
        extra_weight: ``[N, E]`` (``x``'s dtype): also return ``y @ extra_weight``, each
            row's product formed by the kernel's epilogue from the fp32 row ``y_r`` before
            its rounding (RGAT's source score ``(x W_r) a`` beside ``x W_r``, without a
            second GEMM reading the gathered rows again).  Only for rows stored in order:
            no ``scatter``, ``bias``, ``addend`` or ``prologue``; the heuristic or
            autotuned schedule.  Differentiable in ``extra_weight`` too.
        capacity: bounds kept on the device (a mini-batch's per-relation row counts, one
            CUDA graph for every batch): ``seg_ptr`` is a tensor on ``x``'s device that is
            never read back, ``seg_ptr[-1] <= capacity`` (a promise, checked with
            ``HECTOR_DEBUG=1``), and every row count of the call is ``capacity``'s (``x``
            without ``gather``, ``gather``, ``scatter``, ``addend``, the output).  The
            kernels take their tiles from ``seg_ptr`` on the device over a grid sized for
            ``capacity`` rows; output rows past ``seg_ptr[-1]`` are zero and rows of
            ``gather``/``scatter`` past it are not read.  The torch backend reads
            ``seg_ptr`` (one host read).

    Returns:
        ``[M, N]``, or ``[num_out_rows, N]`` with ``scatter`` (rows never hit are 0); with
        ``extra_weight`` the pair ``([M, N], [M, E])``.

    Index ranges of ``gather``/``scatter`` are not checked per call (that needs a pass over
    the data; the ``Graph`` that produced them checked them once); set ``HECTOR_DEBUG=1`` to
    check them here.
    """
    device_ptr = None
    if capacity is not None:     # every shape checked against the capacity's row count
        device_ptr = _check_device_bounds(seg_ptr, capacity, x, weight)
        seg_ptr = [0] * weight.shape[0] + [capacity]
    bounds, num_out_rows = _check(x, weight, seg_ptr, gather, scatter, num_out_rows,
                                  transpose_weight, gather_unique, scatter_unique, bias)
    _check_addend(addend, x, weight, bounds, scatter, num_out_rows, scatter_unique,
                  transpose_weight)
    _check_extra(extra_weight, x, weight, scatter, bias, addend, prologue, transpose_weight)
    if prologue is not None and prologue not in PROLOGUES:
        raise ValueError(f"prologue must be None or one of {sorted(PROLOGUES)}, got "
                         f"{prologue!r}")
    backend = choose_backend(backend, x, "x")
    if not (schedule is None or schedule == "autotune" or isinstance(schedule, GemmSchedule)):
        raise TypeError("schedule must be None, 'autotune' or a "
                        f"hector.kernels.segment_mm.spec.GemmSchedule, got {schedule!r}")
    if device_ptr is not None and backend != "triton":
        return _torch_within_capacity(x, weight, device_ptr, capacity, gather, scatter,
                                      num_out_rows, transpose_weight, bias, prologue, addend,
                                      extra_weight)
    if device_ptr is not None:
        bounds = DeviceBounds(device_ptr, capacity)
    if backend == "triton":
        return segment_mm_triton(x, weight, bounds, gather, scatter, num_out_rows,
                                 transpose_weight, schedule, gather_unique, scatter_unique,
                                 # (rows may be strided: the kernel takes a row stride)
                                 bias if bias is None or bias.stride(1) == 1
                                 else bias.contiguous(), prologue or "", addend,
                                 extra_weight)
    return segment_mm_torch(x, weight, bounds, gather, scatter, num_out_rows, transpose_weight,
                            bias, prologue, addend, extra_weight)


def _check_device_bounds(seg_ptr, capacity, x, weight) -> torch.Tensor:
    """``seg_ptr`` of a call with ``capacity`` (see :func:`segment_mm`): an index tensor of
    ``S + 1`` entries on ``x``'s device; its values only with ``HECTOR_DEBUG=1``."""
    capacity = C.check_count(capacity, "capacity")
    if not isinstance(seg_ptr, torch.Tensor):
        raise TypeError("seg_ptr must be a tensor on x's device when capacity is given (bounds "
                        f"kept on the device), got {type(seg_ptr).__name__}")
    C.check_index(seg_ptr, "seg_ptr", 1)
    _check_index_dtype(seg_ptr, "seg_ptr")
    C.check_same_device([("x", x), ("seg_ptr", seg_ptr)])
    if seg_ptr.numel() != weight.shape[0] + 1:
        raise ValueError(f"seg_ptr must have S + 1 = {weight.shape[0] + 1} entries (S = "
                         f"weight.shape[0]), got {seg_ptr.numel()}")
    if C.debug_enabled():
        b = seg_ptr.tolist()
        if b[0] != 0 or any(hi < lo for lo, hi in zip(b, b[1:])) or b[-1] > capacity:
            raise ValueError(f"seg_ptr must be non-decreasing from 0 to at most capacity = "
                             f"{capacity}, got {b}")
    return seg_ptr


def _torch_within_capacity(x, weight, seg_ptr, capacity, gather, scatter, num_out_rows,
                           transpose_weight, bias, prologue, addend, extra_weight):
    """The torch backend of a call with ``capacity``: the reference over the real rows
    (``seg_ptr`` read on the host), the output padded with zero rows to ``capacity``."""
    bounds = seg_ptr.tolist()
    m = bounds[-1]
    cut = (lambda t: t[:m] if t is not None else None)
    out = segment_mm_torch(x if gather is not None else x[:m], weight, bounds, cut(gather),
                           cut(scatter), num_out_rows, transpose_weight, bias, prologue,
                           addend if scatter is not None else cut(addend), extra_weight)
    if scatter is not None:
        return out

    def pad(t):
        return torch.cat([t, t.new_zeros(capacity - m, t.shape[1])])
    return tuple(pad(t) for t in out) if extra_weight is not None else pad(out)


def _check_extra(extra_weight, x, weight, scatter, bias, addend, prologue,
                 transpose_weight) -> None:
    """``extra_weight`` is None or ``[N, E]`` in ``x``'s dtype and device, on a GEMM whose
    rows are stored in order with nothing added (see :func:`segment_mm`)."""
    if extra_weight is None:
        return
    C.check_tensor(extra_weight, "extra_weight")
    n = out_width(weight, transpose_weight)
    if extra_weight.dim() != 2 or extra_weight.shape[0] != n or extra_weight.shape[1] < 1:
        raise ValueError(f"extra_weight must be [N, E] = [{n}, E >= 1], got "
                         f"{list(extra_weight.shape)}")
    if extra_weight.dtype != x.dtype:
        raise TypeError(f"extra_weight must have x's dtype {x.dtype}, got {extra_weight.dtype}")
    C.check_same_device([("x", x), ("extra_weight", extra_weight)])
    if scatter is not None or bias is not None or addend is not None or prologue:
        raise ValueError("extra_weight needs output rows stored in order with nothing added: "
                         "no scatter, bias, addend or prologue")
    if is_narrow(x.shape[1], n, x.dtype):
        raise ValueError(f"extra_weight needs min(K, N) > {NARROW} in fp32, got K = "
                         f"{x.shape[1]}, N = {n} (such a product runs on the narrow kernel, "
                         "which has no such epilogue)")


def _check_addend(addend, x, weight, bounds, scatter, num_out_rows, scatter_unique,
                  transpose_weight) -> None:
    """``addend`` is None or a floating ``[output rows, N]`` tensor on ``x``'s device, and
    each output row is stored once (no scatter, or a permutation)."""
    if addend is None:
        return
    C.check_tensor(addend, "addend")
    n = out_width(weight, transpose_weight)
    rows = num_out_rows if scatter is not None else int(bounds[-1])
    if tuple(addend.shape) != (rows, n):
        raise ValueError(f"addend must have the output's shape [{rows}, {n}], got "
                         f"{list(addend.shape)}")
    if not addend.is_floating_point():
        raise TypeError(f"addend must be floating point, got {addend.dtype}")
    C.check_same_device([("x", x), ("addend", addend)])
    if scatter is not None and not scatter_unique:
        raise ValueError("addend needs each output row stored once: a scatter that sums rows "
                         "(scatter_unique=False) would add it once per row summed")


def segment_mm_csr(x: torch.Tensor, weight: torch.Tensor, seg_ptr, csr_ptr: torch.Tensor,
                   csr_col: torch.Tensor, csr_val: Optional[torch.Tensor] = None, *,
                   gather: Optional[torch.Tensor] = None,
                   scatter: Optional[torch.Tensor] = None,
                   num_out_rows: Optional[int] = None, transpose_weight: bool = False,
                   backend: str = "auto", gather_unique: bool = False,
                   scatter_unique: bool = False,
                   bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    r""":func:`segment_mm` whose input rows are sums over a CSR of ``x``'s rows, formed by
    the kernel as it loads them (its *CSR prologue*): the summed rows are never written.

    .. math::
        a_r = \sum_{e = p_i}^{p_{i+1} - 1} v_e\, x_{c_e}, \quad i = g(r), \qquad
        y_r = a_r W_s \;[+\, b_s], \qquad \text{out}_{c(r)} \mathrel{+}= y_r

    with :math:`p` = ``csr_ptr``, :math:`c` = ``csr_col``, :math:`v` = ``csr_val`` (ones when
    None; ``1 / length`` per entry gives a mean) and :math:`g(r)` = ``gather[r]`` (or
    :math:`r`).  RGCN's per-(destination, relation) mean followed by its relation weight is
    one such call.  Sums run in fp32 and are rounded once to ``x``'s dtype.  Each program
    walks its rows' entries in lockstep up to its longest row: callers order rows by length
    within each segment (a ``gather`` permutation; ``scatter`` the same permutation puts
    the outputs back in CSR order).  Differentiable in ``x``, ``weight`` and ``bias`` (not in
    ``csr_val``).

    Args:
        x: ``[X, K]`` rows the CSR's columns index.
        weight, seg_ptr, scatter, num_out_rows, transpose_weight, backend, gather_unique,
            scatter_unique, bias: as in :func:`segment_mm`, where ``gather`` indexes the
            CSR's rows instead of ``x``'s.
        csr_ptr: ``[R + 1]`` int32/int64 row bounds, ``csr_ptr[0] = 0``.
        csr_col: ``[nnz]`` int32/int64 rows of ``x`` (``nnz = csr_ptr[-1]``).
        csr_val: ``[nnz]`` float32 weight of each entry, or None for ones.

    Returns:
        ``[M, N]``, or ``[num_out_rows, N]`` with ``scatter``.
    """
    csr_val = _check_csr(csr_ptr, csr_col, csr_val)
    C.check_tensor(x, "x")
    if x.dim() != 2:
        raise ValueError(f"x must have shape [rows, K], got {tuple(x.shape)}")
    C.check_same_device([("x", x), ("csr_ptr", csr_ptr), ("csr_col", csr_col),
                         ("csr_val", csr_val)])
    # The summed rows stand where segment_mm's x would: R of them (a K-element stand-in).
    rows = x.new_zeros(1, x.shape[1]).expand(csr_ptr.numel() - 1, x.shape[1])
    bounds, num_out_rows = _check(rows, weight, seg_ptr, gather, scatter, num_out_rows,
                                  transpose_weight, gather_unique, scatter_unique, bias)
    if C.debug_enabled():
        _check_csr_values(csr_ptr, csr_col, x.shape[0], "x.shape[0]")
    backend = choose_backend(backend, x, "x")
    if backend == "triton":
        return call(segment_mm_csr_op, x, weight, csr_ptr.contiguous(), csr_col.contiguous(),
                    csr_val.contiguous(), None if gather is None else gather.contiguous(),
                    None if scatter is None else scatter.contiguous(), list(bounds),
                    num_out_rows if scatter is not None else bounds[-1], transpose_weight,
                    gather_unique, scatter_unique,
                    bias if bias is None or bias.stride(1) == 1 else bias.contiguous())
    return segment_mm_torch(csr_rows_torch(x, csr_ptr, csr_col, csr_val), weight, bounds,
                            gather, scatter, num_out_rows, transpose_weight, bias)


def segment_mm_csr_scatter(x: torch.Tensor, weight: torch.Tensor, seg_ptr,
                           csr_ptr: torch.Tensor, csr_col: torch.Tensor,
                           csr_val: Optional[torch.Tensor] = None, *, rows: torch.Tensor,
                           num_out_rows: int, gather: Optional[torch.Tensor] = None,
                           transpose_weight: bool = False, backend: str = "auto",
                           gather_unique: bool = False) -> torch.Tensor:
    r""":func:`segment_mm` whose output rows are added through a CSR by the kernel as it
    finishes them (its *CSR scatter epilogue*, the transpose of :func:`segment_mm_csr`'s
    prologue): the product rows are never written.

    .. math::
        y_r = x_{g(r)} W_s, \qquad \text{out}_{c_e} \mathrel{+}= v_e\, y_r
        \quad \text{for } e = p_i .. p_{i+1} - 1,\ i = \text{rows}[r]

    RGCN's backward is one such call: each (destination, relation) row's gradient
    ``dy[dst] W_r^T`` spread over its edges' sources with the mean's ``1 / count``.  Sums
    run in fp32 (atomics) and are rounded once.  Each program walks its rows' entries in
    lockstep up to its longest: callers keep CSR rows short (split a long row into pieces:
    the sum is linear) and order them by length within each segment.  Differentiable in
    ``x`` and ``weight``.

    Args:
        x, weight, seg_ptr, gather, transpose_weight, backend, gather_unique: as in
            :func:`segment_mm`.
        csr_ptr, csr_col, csr_val: as in :func:`segment_mm_csr`; ``csr_col`` indexes the
            output's rows.
        rows: ``[M]`` int32/int64 CSR row of each logical row.
        num_out_rows: rows of the output (the CSR's columns).

    Returns:
        ``[num_out_rows, N]``.
    """
    csr_val = _check_csr(csr_ptr, csr_col, csr_val)
    num_out_rows = C.check_count(num_out_rows, "num_out_rows")
    bounds, _ = _check(x, weight, seg_ptr, gather, None, None, transpose_weight,
                       gather_unique, False, None)
    _check_row_index(rows, "rows", bounds[-1])
    C.check_same_device([("x", x), ("csr_ptr", csr_ptr), ("csr_col", csr_col),
                         ("csr_val", csr_val), ("rows", rows)])
    if C.debug_enabled():
        _check_csr_values(csr_ptr, csr_col, num_out_rows, "num_out_rows")
        C.check_range(rows, "rows", csr_ptr.numel() - 1, "the CSR's rows")
    backend = choose_backend(backend, x, "x")
    if backend == "triton":
        return call(segment_mm_csr_scatter_op, x, weight, csr_ptr.contiguous(),
                    csr_col.contiguous(), csr_val.contiguous(),
                    None if gather is None else gather.contiguous(), rows.contiguous(),
                    list(bounds), num_out_rows, transpose_weight, gather_unique)
    y = segment_mm_torch(x, weight, bounds, gather, rows, csr_ptr.numel() - 1,
                         transpose_weight)
    return csr_rows_transposed_torch(y, csr_ptr, csr_col, csr_val, num_out_rows)


def _check_csr(csr_ptr: torch.Tensor, csr_col: torch.Tensor,
               csr_val: Optional[torch.Tensor]) -> torch.Tensor:
    """Types and shapes of a CSR argument; returns ``csr_val`` (ones when None)."""
    C.check_index(csr_ptr, "csr_ptr", 1)
    _check_index_dtype(csr_ptr, "csr_ptr")
    C.check_index(csr_col, "csr_col", 1)
    _check_index_dtype(csr_col, "csr_col")
    if csr_ptr.numel() < 1:
        raise ValueError("csr_ptr must have R + 1 >= 1 entries, got 0")
    if csr_val is None:
        csr_val = torch.ones(csr_col.shape, dtype=torch.float32, device=csr_col.device)
    C.check_tensor(csr_val, "csr_val")
    if csr_val.dtype != torch.float32 or csr_val.shape != csr_col.shape:
        raise ValueError(f"csr_val must be float32 with csr_col's shape {tuple(csr_col.shape)}, "
                         f"got {csr_val.dtype} {tuple(csr_val.shape)}")
    return csr_val


def _check_csr_values(csr_ptr: torch.Tensor, csr_col: torch.Tensor, cols: int,
                      what: str) -> None:
    """(``HECTOR_DEBUG``, reads the device) the CSR's bounds and columns are in range."""
    if int(csr_ptr[0]) != 0 or int(csr_ptr[-1]) != csr_col.numel() or bool(
            (csr_ptr[1:] < csr_ptr[:-1]).any()):
        raise ValueError("csr_ptr must start at 0, not decrease and end at csr_col.numel()")
    C.check_range(csr_col, "csr_col", cols, what)


def _check_row_index(t: torch.Tensor, name: str, rows: int) -> None:
    """``gather`` / ``scatter``: a 1-D integer index with one entry per logical row."""
    C.check_index(t, name, 1)
    _check_index_dtype(t, name)
    if t.shape[0] != rows:
        raise ValueError(f"{name} has {t.shape[0]} entries but seg_ptr[-1] = {rows} "
                         "logical rows; they must be equal")


def _check_index_dtype(t: torch.Tensor, name: str) -> None:
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")


def _host_bounds(seg_ptr, x) -> list:
    """``seg_ptr`` as Python ints: a tuple or list of ints is taken as it is (what the
    compiler passes: no tensor read, so ``torch.compile`` traces the call), a tensor is read
    on the host (the one host read of the call)."""
    if isinstance(seg_ptr, (list, tuple)):
        if not all(isinstance(b, int) and not isinstance(b, bool) for b in seg_ptr):
            raise TypeError("seg_ptr given as a sequence must hold Python ints")
        return list(seg_ptr)
    C.check_index(seg_ptr, "seg_ptr", 1)
    _check_index_dtype(seg_ptr, "seg_ptr")
    if seg_ptr.device != x.device and seg_ptr.device.type != "cpu":
        raise ValueError(f"seg_ptr is on {seg_ptr.device} but x is on {x.device}; "
                         "it must be on x's device or the CPU")
    return seg_ptr.tolist()


def _check(x, weight, seg_ptr, gather, scatter, num_out_rows, transpose_weight,
           gather_unique=False, scatter_unique=False, bias=None):
    """Validates everything that needs no pass over the data; returns ``seg_ptr`` as ints
    and ``num_out_rows`` as an int (or None)."""
    C.check_tensor(x, "x")
    if x.dtype not in C.FLOAT_DTYPES:
        raise TypeError(f"x must be a floating tensor ({', '.join(map(str, C.FLOAT_DTYPES))}), "
                        f"got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x must have shape [rows, K], got {tuple(x.shape)}")
    C.check_tensor(weight, "weight")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight has dtype {weight.dtype} but x has {x.dtype}; they must match")
    if not isinstance(transpose_weight, bool):
        raise TypeError(f"transpose_weight must be a bool, got {type(transpose_weight).__name__}")
    layout = "[S, N, K]" if transpose_weight else "[S, K, N]"
    k_axis = 2 if transpose_weight else 1
    if weight.dim() != 3 or weight.shape[k_axis] != x.shape[1]:
        raise ValueError(f"weight must have shape {layout} with K={x.shape[1]} (x.shape[1])"
                         f"{' (transpose_weight=True)' if transpose_weight else ''}, "
                         f"got {tuple(weight.shape)}")
    if bias is not None:
        C.check_tensor(bias, "bias")
        n = out_width(weight, transpose_weight)
        if bias.dtype != x.dtype:
            raise TypeError(f"bias has dtype {bias.dtype} but x has {x.dtype}; they must match")
        if tuple(bias.shape) != (weight.shape[0], n):
            raise ValueError(f"bias must have shape [S, N] = [{weight.shape[0]}, {n}], got "
                             f"{tuple(bias.shape)}")
    C.check_same_device([("x", x), ("weight", weight), ("gather", gather),
                         ("scatter", scatter), ("bias", bias)])
    bounds = _host_bounds(seg_ptr, x)
    num_segments = weight.shape[0]
    if len(bounds) != num_segments + 1:
        raise ValueError(f"seg_ptr must have S + 1 = {num_segments + 1} entries (S = "
                         f"weight.shape[0] = {num_segments}), got {len(bounds)}")
    if bounds[0] != 0:
        raise ValueError(f"seg_ptr[0] must be 0, got {bounds[0]}")
    drops = [i for i in range(num_segments) if bounds[i + 1] < bounds[i]]
    if drops:
        i = drops[0]
        raise ValueError(f"seg_ptr must be non-decreasing, but seg_ptr[{i + 1}]="
                         f"{bounds[i + 1]} < seg_ptr[{i}]={bounds[i]}")
    m = bounds[-1]
    if gather is not None:
        _check_row_index(gather, "gather", m)
    elif x.shape[0] != m:
        raise ValueError(f"without gather, x must have seg_ptr[-1] = {m} rows, got "
                         f"{x.shape[0]} (pass gather to read rows of x by index)")
    if scatter is not None:
        _check_row_index(scatter, "scatter", m)
        if num_out_rows is None:
            raise ValueError("num_out_rows is required with scatter (the output row count)")
        num_out_rows = C.check_count(num_out_rows, "num_out_rows")
    elif num_out_rows is not None:
        num_out_rows = C.check_count(num_out_rows, "num_out_rows")
        if num_out_rows != m:
            raise ValueError(f"num_out_rows={num_out_rows} without scatter; the output then "
                             f"has seg_ptr[-1] = {m} rows (pass scatter to sum rows)")
    for name, flag, index, rows in (("gather", gather_unique, gather, x.shape[0]),
                                    ("scatter", scatter_unique, scatter, num_out_rows)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}_unique must be a bool, got {type(flag).__name__}")
        if flag and index is not None and rows != m:
            raise ValueError(f"{name}_unique=True: {name} must be a permutation of the "
                             f"seg_ptr[-1] = {m} rows, but it indexes {rows} rows")
    if C.debug_enabled():
        for name, flag, index, rows, of in (
                ("gather", gather_unique, gather, x.shape[0], "x.shape[0]"),
                ("scatter", scatter_unique, scatter, num_out_rows, "num_out_rows")):
            if index is None:
                continue
            C.check_range(index, name, rows, of)
            if flag and not bool(torch.bincount(index.long(), minlength=rows).eq(1).all()):
                raise ValueError(f"{name}_unique=True but {name} repeats a row (it must be a "
                                 "permutation)")
    return bounds, num_out_rows
