"""Triton launches of the traversal and edge-softmax kernels, and their custom operators.

A launch walks the row bins its CSR was built with (:mod:`.schedule`): short rows on the
multi-row kernel, long rows on the row kernel, hub rows in chunks then combined; no host read
happens at launch.  The backward of ``out = M x + sum_i c_i a_i + b`` is the same op on ``M^T``
(the CSR by source, built once per CSR and kept on it): ``dx = M^T dy``, ``da_i = c_i dy``,
``db = sum dy``.

The ops (``hector::traverse``, ``hector::edge_softmax``, ``hector::edge_softmax_backward``)
are opaque ``torch.library`` custom ops, as the attention and segment-GEMM ones are: the CSR
and the graph travel as int handles, so torch.compile and CUDA-graph capture see one node per
launch with a shape-only fake implementation, and a compiled layer runs the same kernels as
eager.
"""
from __future__ import annotations

import functools
import os
from typing import List, Optional, Sequence

import torch

from .. import autotune, registry
from ..eager import call
from ..attention.custom_ops import _graph, graph_handle, prepare_handles
from ..handles import HandleTable
from ..sizes import cdiv as _cdiv
from .csr import WeightedCSR
from .schedule import CHUNK, RowBins, Tiles, pick_tiles, row_bins, tile_configs
from .spec import TraversalKernelSpec


def transposed(m: WeightedCSR) -> WeightedCSR:
    """``m``'s transpose, built on first use and kept on ``m`` (graph-derived, like a CSC)."""
    t = m.__dict__.get("_transposed")
    if t is None:
        t = m.transpose()
        object.__setattr__(m, "_transposed", t)
    return t


def _run(name: str, params: tuple, count: int, width: int, args: tuple, t: Tiles, tune: bool,
         mean: float, device: torch.device) -> None:
    """Launch traversal kernel ``name`` (``params``: its spec as sorted items) over ``count``
    rows (``traversal_csr_rows``: BLOCK_R to a program) with tiles ``t``, or with the
    autotuner's pick around them (on CUDA, once per shape bucket; trials only store, so every
    run leaves the same values).  Every call of a new mini-batch's step comes here, so the
    steady path is one memo lookup: no config list, spec hash or kernel lookup."""
    multi = name.endswith("_rows")

    def run(kern, c: Tiles):
        grid = (_cdiv(count, c.block_r) if multi else count, _cdiv(width, c.block_f))
        block = dict(BLOCK_R=c.block_r) if multi else dict(BLOCK_E=c.block_e)
        kern[grid](*args, width, BLOCK_F=c.block_f, num_warps=c.num_warps, **block)
    tune = tune and autotune.enabled(device)
    shape = autotune.bucket(count, width, max(1, int(mean))) if tune else None

    def pick():
        kern = registry.kernel(name, **dict(params))
        if not tune:
            return kern, t
        return kern, autotune.choose(name, registry.spec_hash(name, **dict(params)), shape,
                                     tile_configs(t, multi), lambda c: run(kern, c), device)
    run(*autotune.memo(("traversal", name, params, t, shape, str(device),
                        os.environ.get("HECTOR_CACHE_DIR")), pick))


def launch(m: WeightedCSR, x: torch.Tensor, addends: Sequence[torch.Tensor],
           coefs: Sequence[float], bias: Optional[torch.Tensor],
           tiles: Optional[Tiles] = None) -> torch.Tensor:
    """One traversal: ``[m.rows, ...]`` output in ``x``'s dtype.  ``tiles`` pins the launch
    tiles (tests); by default :func:`~.schedule.pick_tiles`, refined by the autotuner."""
    width = int(torch.Size(x.shape[1:]).numel())
    out = torch.empty((m.rows,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    if m.rows == 0 or width == 0:
        return out
    bins = m.layout
    t = tiles or pick_tiles(bins, width)
    spec = _spec(len(addends), bias is not None)
    epilogue = []
    for a, c in zip(addends, coefs):
        epilogue += [a.contiguous(), float(c)]
    epilogue.append(bias.contiguous() if bias is not None else out)
    x = x.contiguous()
    go = dict(width=width, t=t, tune=tiles is None, device=x.device)
    starts, ends = m.ptr[:-1], m.ptr[1:]
    if bins.num_short:
        rows = bins.short
        _run("traversal_csr_rows", _with(spec, row_list=rows is not None, by_position=False),
             bins.num_short, args=(rows if rows is not None else m.ptr, bins.num_short, starts,
                                   ends, m.col, m.val, x, out, *epilogue),
             mean=bins.short_max, **go)
    if bins.num_long and bins.chunk_start is None:
        rows = bins.long
        _run("traversal_csr", _with(spec, row_list=rows is not None), bins.num_long,
             args=(rows if rows is not None else m.ptr, bins.num_long, starts, ends, m.col,
                   m.val, x, out, *epilogue), mean=bins.long_mean, **go)
    elif bins.num_long:
        _hub_rows(m, bins, spec, x, out, epilogue, go)
    return out


@functools.lru_cache(maxsize=None)
def _spec(num_addends: int, has_bias: bool) -> tuple:
    """The traversal kernel's spec parameters as sorted items (hashable; a few variants)."""
    return tuple(sorted(TraversalKernelSpec(num_addends=num_addends,
                                            has_bias=has_bias).params().items()))


def _with(spec: tuple, **more) -> tuple:
    return tuple(sorted(dict(spec, **more).items()))


def _hub_rows(m: WeightedCSR, bins: RowBins, spec: tuple, x: torch.Tensor, out: torch.Tensor,
              epilogue: list, go: dict):
    """Long rows with some hub: each chunk of ``CHUNK`` entries summed into an fp32 partial
    row (row kernel, no epilogue), then each long row's partials summed in chunk order with
    the epilogue (multi-row kernel; the partials are its ``x``, one entry of weight 1 per
    chunk)."""
    n = bins.num_chunks
    partial = torch.empty((n, go["width"]), dtype=torch.float32, device=x.device)
    _run("traversal_csr", _with(_spec(0, False), row_list=False), n,
         args=(m.ptr, n, bins.chunk_start, bins.chunk_end, m.col, m.val, x, partial, partial),
         mean=CHUNK, **go)
    ids, ones = _chunk_entries(bins, x.device)
    rows = bins.long
    _run("traversal_csr_rows", _with(spec, row_list=rows is not None, by_position=True),
         bins.num_long, args=(rows if rows is not None else m.ptr, bins.num_long,
                              bins.chunk_of[:-1], bins.chunk_of[1:], ids, ones, partial, out,
                              *epilogue), mean=n / bins.num_long, **go)


def _chunk_entries(bins: RowBins, device) -> tuple:
    """(chunk ids, weights 1) of the combine pass, made once per CSR and kept on its bins."""
    memo = bins.__dict__.get("_combine")
    if memo is None:
        n = bins.num_chunks
        memo = (torch.arange(n, dtype=torch.int32, device=device),
                torch.ones(n, dtype=torch.float32, device=device))
        object.__setattr__(bins, "_combine", memo)
    return memo


# -- edge softmax --------------------------------------------------------------------------

def softmax_bins(graph) -> RowBins:
    """The row bins of ``graph.csr_in`` (short rows several to a program; no chunks: a hub
    row's two walks stay in one program), made once per graph."""
    return graph.derived(("edge_softmax_bins",), lambda: row_bins(graph.csr_in.ptr, chunk=None))


def launch_edge_softmax(graph, s: torch.Tensor, slope: Optional[float],
                        alpha: Optional[torch.Tensor] = None,
                        grad: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Softmax of ``s [E, H, ...]`` over each destination's incoming edges (after
    ``leaky_relu(slope)`` when given), in ``s``'s edge order and dtype; with ``alpha`` (that
    softmax) and ``grad`` (its gradient), the gradient with respect to ``s`` instead."""
    bwd = alpha is not None
    out = torch.empty_like(s)
    heads = int(torch.Size(s.shape[1:]).numel())
    if graph.num_nodes == 0 or s.shape[0] == 0 or heads == 0:
        return out.zero_()
    bins, ptr, eid = softmax_bins(graph), graph.csr_in.ptr, graph.csr_in.eid
    name = "edge_softmax_bwd" if bwd else "edge_softmax"
    tensors = [s.contiguous()] + ([alpha.contiguous(), grad.contiguous()] if bwd else [])
    block_h = min(128, max(1, 1 << (heads - 1).bit_length()))
    block_r = max(1, min(256, 1024 // block_h))
    block_e = max(16, min(64, 1024 // block_h))
    slope_arg = float(slope or 0.0)
    for count, rows, multi in ((bins.num_short, bins.short, True),
                               (bins.num_long, bins.long, False)):
        if not count:
            continue
        kern = registry.kernel(name + ("_rows" if multi else ""), has_leaky=slope is not None,
                               row_list=rows is not None)
        grid = (_cdiv(count, block_r) if multi else count,)
        block = dict(BLOCK_R=block_r) if multi else dict(BLOCK_E=block_e)
        kern[grid](rows if rows is not None else ptr, count, ptr, eid, *tensors, out, heads,
                   slope_arg, BLOCK_H=block_h, **block)
    return out


# -- the custom operators (torch.library) --------------------------------------------------
# A WeightedCSR travels as an int handle, like a Graph does for the attention ops: a frozen
# dataclass of tensors is no schema type, and its row bins are host data the op must not see
# traced.  The handle is memoised on the CSR with a token (a copied CSR gets its own handle).

_CSRS = HandleTable("_op_handle", "WeightedCSR")


def csr_handle(m: WeightedCSR) -> int:
    """A process-unique int naming ``m`` for the custom ops (memoised on ``m``)."""
    return _CSRS.handle(m)


def _csr(handle: int) -> WeightedCSR:
    return _CSRS.get(handle)


@torch.library.custom_op("hector::traverse", mutates_args=())
def traverse_op(csr: int, x: torch.Tensor, addends: List[torch.Tensor], coefs: List[float],
                bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``M x + sum_i coefs[i] addends[i] + bias`` for the CSR ``M`` named by ``csr``."""
    return launch(_csr(csr), x, addends, coefs, bias)


@traverse_op.register_fake
def _(csr, x, addends, coefs, bias):
    return x.new_empty((_csr(csr).rows,) + tuple(x.shape[1:]))


def _traverse_setup(ctx, inputs, output):
    csr, _, _, coefs, bias = inputs
    ctx.csr, ctx.coefs = csr, list(coefs)
    ctx.bias_shape = None if bias is None else bias.shape


def _traverse_backward(ctx, dy):
    # needs_input_grad mirrors the inputs: a list of bools for the addends.
    need_x, need_a, need_b = (ctx.needs_input_grad[i] for i in (1, 2, 4))
    dx = None
    if need_x:
        t = transposed(_csr(ctx.csr))
        _CSRS.prepare(t)          # (a statement before the call: see HandleTable.prepare)
        dx = call(traverse_op, csr_handle(t), dy, [], [], None)
    da = [c * dy if need else None for c, need in zip(ctx.coefs, need_a)]
    db = None
    if ctx.bias_shape is not None and need_b:
        db = dy.reshape(dy.shape[0], -1).float().sum(0).to(dy.dtype).reshape(ctx.bias_shape)
    # (a float list is one leaf to torch.library's structure check, an empty list is a list)
    return None, dx, da, None if ctx.coefs else [], db


traverse_op.register_autograd(_traverse_backward, setup_context=_traverse_setup)


@torch.library.custom_op("hector::edge_softmax", mutates_args=())
def edge_softmax_op(graph: int, s: torch.Tensor, slope: Optional[float]) -> torch.Tensor:
    """Edge softmax of ``s [E, ...]`` over the incoming edges of each node of ``graph``."""
    return launch_edge_softmax(_graph(graph), s, slope)


@edge_softmax_op.register_fake
def _(graph, s, slope):
    return torch.empty_like(s)


@torch.library.custom_op("hector::edge_softmax_backward", mutates_args=())
def edge_softmax_backward_op(graph: int, s: torch.Tensor, alpha: torch.Tensor,
                             grad: torch.Tensor, slope: Optional[float]) -> torch.Tensor:
    """``ds`` of :func:`edge_softmax_op` from its output ``alpha`` and gradient ``grad``."""
    return launch_edge_softmax(_graph(graph), s, slope, alpha, grad)


@edge_softmax_backward_op.register_fake
def _(graph, s, alpha, grad, slope):
    return torch.empty_like(s)


def _softmax_setup(ctx, inputs, output):
    ctx.graph, ctx.slope = inputs[0], inputs[2]
    ctx.save_for_backward(inputs[1], output)


def _softmax_backward(ctx, grad):
    s, alpha = ctx.saved_tensors
    return None, call(edge_softmax_backward_op, ctx.graph, s, alpha, grad, ctx.slope), None


edge_softmax_op.register_autograd(_softmax_backward, setup_context=_softmax_setup)


def traverse_triton(m: WeightedCSR, x: torch.Tensor, addends: Sequence[torch.Tensor],
                    coefs: Sequence[float], bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The Triton path of :func:`~.op.traverse` (inputs validated): the custom op."""
    _CSRS.prepare(m)              # (a statement before the call: see HandleTable.prepare)
    return call(traverse_op, csr_handle(m), x, list(addends), [float(c) for c in coefs], bias)


def edge_softmax_triton(graph, s: torch.Tensor, slope: Optional[float]) -> torch.Tensor:
    """The Triton path of :func:`~.op.edge_softmax` (inputs validated): the custom op."""
    prepare_handles(graph)
    return call(edge_softmax_op, graph_handle(graph), s, None if slope is None else float(slope))
