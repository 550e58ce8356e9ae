"""Triton launch of an edge-wise program (forward only: the compiler's IR autodiff writes the
backward as more edge-wise programs, run by the same template), and the custom operator
``hector::edgewise`` around it, so torch.compile and CUDA graphs see one opaque node."""
from __future__ import annotations

from functools import lru_cache
from typing import Dict, List, Sequence

import torch

from .. import registry
from ..sizes import next_pow2
from .spec import EdgewiseSpec

#: Elements of one [BLOCK_E, BH, BD] tile a map program holds per value.
TILE_ELEMENTS = 2048
#: CSR entries a reduce/softmax program loads per step.
BLOCK_ENTRIES = 16


@lru_cache(maxsize=None)
def edgewise_params(spec: EdgewiseSpec) -> tuple:
    """The registry parameters of ``spec``'s kernel (code generation runs once per spec)."""
    return tuple(sorted(spec.params().items()))


def kernel_source(spec: EdgewiseSpec) -> str:
    """The rendered kernel module of ``spec`` (what ``explain`` shows)."""
    return registry.source("edgewise", **dict(edgewise_params(spec)))


def launch(spec: EdgewiseSpec, inputs: Sequence[torch.Tensor], arrays: Sequence[torch.Tensor],
           out_rows: int, dtype: torch.dtype) -> torch.Tensor:
    """Run ``spec`` once: ``[out_rows, h, d]`` in ``dtype`` (fp32 inside the kernel)."""
    h, d = spec.root.shape
    device = arrays[0].device if arrays else inputs[0].device
    out = torch.empty((out_rows, h, d), dtype=dtype, device=device)
    if out_rows == 0:
        return out
    bh, bd = next_pow2(spec.H), next_pow2(spec.D)
    if spec.form == "map":
        block = max(1, min(128, TILE_ELEMENTS // (bh * bd)))
        grid = (-(-out_rows // block),)
    elif spec.form == "reduce":
        block, grid = BLOCK_ENTRIES, (out_rows,)
    else:
        block = BLOCK_ENTRIES
        grid = (arrays[spec.root.attr("ptr")].shape[0] - 1,)
        if grid[0] == 0:
            return out.zero_()
    kern = registry.kernel("edgewise", **dict(edgewise_params(spec)))
    kern[grid](*[t.contiguous() for t in inputs], *arrays, out, out_rows,
               BLOCK_E=block, BH=bh, BD=bd)
    return out


# -- the custom operator (torch.library) ----------------------------------------------------
# The program travels as an int naming its spec: specs are few (one per lowered statement
# list, made by the compiler once), so the table is strong and never shrinks.
_SPEC_IDS: Dict[EdgewiseSpec, int] = {}
_SPECS: List[EdgewiseSpec] = []


def spec_handle(spec: EdgewiseSpec) -> int:
    if spec not in _SPEC_IDS:
        _SPEC_IDS[spec] = len(_SPECS)
        _SPECS.append(spec)
    return _SPEC_IDS[spec]


@torch.library.custom_op("hector::edgewise", mutates_args=())
def edgewise_op(spec: int, inputs: List[torch.Tensor], arrays: List[torch.Tensor],
                out_rows: int, dtype: torch.dtype) -> torch.Tensor:
    """The program named by ``spec`` (see :func:`launch`); no autograd: the compiler writes
    the backward as more programs."""
    return launch(_SPECS[spec], inputs, arrays, out_rows, dtype)


@edgewise_op.register_fake
def _edgewise_fake(spec, inputs, arrays, out_rows, dtype):
    h, d = _SPECS[spec].root.shape
    return inputs[0].new_empty((out_rows, h, d), dtype=dtype)
