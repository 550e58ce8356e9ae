"""``filtered_ranks``: each query's filtered rank among every entity, without the ``[B, N]``
score table.

On CUDA (or under Triton's interpreter when asked: ``backend="triton"``) the generated
``rank_counts`` kernel runs twice over a ``(cdiv(N, BN), cdiv(B, BQ))`` grid of score tiles,
behind the ``hector::rank_counts`` custom op: once writing each query's truth score, once
counting the unfiltered entities that score above and equal to it.  Only ``[B]`` scores and
``[B, 2]`` counts are written, where the dense path writes and reads a ``[B, N]`` table
twice.  Elsewhere the torch reference (:mod:`.reference`) runs; both count the same entities
(scores may differ in their last bits, so near ties may rank differently).
"""
from __future__ import annotations

import torch

from ... import checks as C
from ...device import BACKENDS, TRITON_DTYPES, choose_backend
from .. import registry
from ..eager import call
from ..ptr import rows_of_entries
from ..segment_mm.spec import fp32_dot
from ..sizes import cdiv
from .reference import KINDS, filtered_ranks_torch

#: Tile sizes (BQ queries, BN entities, BD features a step) by score kind: "dot" multiplies
#: with tl.dot (sizes of at least 16); "l1"/"l2" broadcast a [BQ, BN, BD] difference.
BLOCKS = {"dot": (32, 64, 32), "l1": (16, 64, 8), "l2": (16, 64, 8)}
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def filtered_ranks(q: torch.Tensor, entities: torch.Tensor, kind: str, truth: torch.Tensor,
                   filt_ptr: torch.Tensor, filt_col: torch.Tensor,
                   backend: str = "auto") -> torch.Tensor:
    """``[B]`` float64 filtered ranks: query ``i`` (row ``q[i]`` of ``q`` ``[B, D]``) ranks
    its truth entity ``truth[i]`` among the rows of ``entities`` ``[N, D]`` by score ``kind``
    ("dot": ``q . e``; "l1": ``-|q - e|_1``; "l2": ``-|q - e|_2``), leaving out its filtered
    entities ``filt_col[filt_ptr[i]:filt_ptr[i + 1]]`` (a CSR; the truth may be among them,
    duplicates and any order are fine): ``1 + #greater + #equal / 2`` over the others.

    ``backend``: "auto" (the kernel on CUDA tensors of fp32, fp16 or bf16, the torch
    reference elsewhere), "torch" or "triton" (the kernel; on CPU tensors under Triton's
    interpreter).  16-bit rows are scored in fp32 either way."""
    _check(q, entities, kind, truth, filt_ptr, filt_col, backend)
    # "auto" takes the kernel on CUDA only: the CPU keeps the reference, interpreter or not.
    if backend == "triton" or (backend == "auto" and q.is_cuda and q.dtype in TRITON_DTYPES):
        precision = fp32_dot() if q.dtype == torch.float32 else "ieee"
        counts = call(rank_counts_op, q, entities, truth, filt_ptr, filt_col, kind, precision)
        return 1.0 + counts[:, 0].double() + counts[:, 1].double() / 2
    return filtered_ranks_torch(q, entities, kind, truth, filt_ptr, filt_col)


def _check(q, entities, kind, truth, filt_ptr, filt_col, backend) -> None:
    """Every argument by name, before anything runs (the data checks in debug mode only)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    for name, x in (("q", q), ("entities", entities)):
        C.check_not_meta(C.check_tensor(x, name), name)
        if x.dtype not in _FLOATS:
            raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")
        if x.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(x.shape)}")
    if entities.dtype != q.dtype:
        raise TypeError(f"entities has dtype {entities.dtype} but q has {q.dtype}")
    if entities.shape[1] != q.shape[1]:
        raise ValueError(f"entities must be [N, {q.shape[1]}] (q's width), got "
                         f"{tuple(entities.shape)}")
    b = q.shape[0]
    if b and entities.shape[0] == 0:
        raise ValueError("entities has no rows: there is no truth to rank")
    for name, x, size in (("truth", truth, b), ("filt_ptr", filt_ptr, b + 1),
                          ("filt_col", filt_col, None)):
        C.check_index(x, name, 1)
        if size is not None and x.numel() != size:
            raise ValueError(f"{name} must have {size} entries (q has {b} rows), got "
                             f"{x.numel()}")
    for name, x in (("entities", entities), ("truth", truth), ("filt_ptr", filt_ptr),
                    ("filt_col", filt_col)):
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}")
    if backend == "triton":        # runs where Triton does, on the dtypes it is built for
        choose_backend(backend, q, "q")
    if C.debug_enabled():
        _check_values(truth, filt_ptr, filt_col, entities.shape[0])


def _check_values(truth, filt_ptr, filt_col, n) -> None:
    """The checks that read the data (debug mode): ids in range, a well-formed CSR."""
    C.check_range(truth, "truth", n, "N (entities' rows)")
    C.check_range(filt_col, "filt_col", n, "N (entities' rows)")
    ptr = filt_ptr.long()
    if int(ptr[0]) != 0 or int(ptr[-1]) != filt_col.numel() or bool((ptr.diff() < 0).any()):
        raise ValueError(f"filt_ptr must rise from 0 to filt_col's {filt_col.numel()} entries")


def block_offsets(filt_ptr: torch.Tensor, filt_col: torch.Tensor, n: int, bn: int):
    """(``off`` ``[B, nblocks + 1]`` int64, ``col`` sorted): each query's filtered entities
    sorted, and where its list reaches each block of ``bn`` entities (``off[i, j]`` ..
    ``off[i, j + 1]`` are its ids in block ``j``): one sort of the keys ``row * n + id`` and a
    binary search per (query, block), on the device."""
    b = filt_ptr.numel() - 1
    dev = filt_col.device
    rows = rows_of_entries(filt_ptr, filt_col.numel())
    keys = torch.sort(rows * n + filt_col.long()).values
    starts = torch.clamp(torch.arange(cdiv(n, bn) + 1, device=dev) * bn, max=n)
    bounds = torch.arange(b, device=dev)[:, None] * n + starts[None, :]
    return torch.searchsorted(keys, bounds), torch.remainder(keys, n)


def launch_rank_counts(q: torch.Tensor, entities: torch.Tensor, truth: torch.Tensor,
                       filt_ptr: torch.Tensor, filt_col: torch.Tensor, kind: str,
                       precision: str, blocks=None) -> torch.Tensor:
    """``[B, 2]`` int32 (#greater, #equal) per query: the two launches of the generated
    kernel (CUDA, or Triton's interpreter in tests); ``blocks`` overrides :data:`BLOCKS`."""
    bq, bn, bd = blocks or BLOCKS[kind]
    q, entities = q.contiguous(), entities.contiguous()
    (b, d), n = q.shape, entities.shape[0]
    counts = torch.zeros(b, 2, dtype=torch.int32, device=q.device)
    if b == 0 or n == 0:
        return counts
    score = torch.zeros(b, dtype=torch.float32, device=q.device)
    off, col = block_offsets(filt_ptr, filt_col, n, bn)
    grid = (cdiv(n, bn), cdiv(b, bq))
    for mode in ("truth", "count"):
        kernel = registry.kernel("rank_counts", kind=kind, mode=mode, input_precision=precision)
        kernel[grid](q, entities, truth.contiguous(), score, off, col, counts, b, n, d,
                     off.shape[1], BQ=bq, BN=bn, BD=bd)
    return counts


@torch.library.custom_op("hector::rank_counts", mutates_args=())
def rank_counts_op(q: torch.Tensor, entities: torch.Tensor, truth: torch.Tensor,
                   filt_ptr: torch.Tensor, filt_col: torch.Tensor, kind: str,
                   precision: str) -> torch.Tensor:
    return launch_rank_counts(q, entities, truth, filt_ptr, filt_col, kind, precision)


@rank_counts_op.register_fake
def _(q, entities, truth, filt_ptr, filt_col, kind, precision):
    return q.new_empty((q.shape[0], 2), dtype=torch.int32)
