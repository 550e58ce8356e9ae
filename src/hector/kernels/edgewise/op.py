"""``edgewise``: the public entry of the edge-wise kernel family (checks, then a backend)."""
from __future__ import annotations

from typing import Sequence

import torch

from ...checks import check_tensor
from ...device import choose_backend
from ..eager import call
from .launch import edgewise_op, spec_handle
from .reference import edgewise_torch
from .spec import EdgewiseSpec


def edgewise(spec: EdgewiseSpec, inputs: Sequence[torch.Tensor], arrays: Sequence[torch.Tensor],
             out_rows: int, dtype: torch.dtype, backend: str = "auto") -> torch.Tensor:
    """Evaluate the program ``spec`` for ``out_rows`` output rows: ``inputs`` are the row
    tensors and weights it loads (floating), ``arrays`` its integer index arrays (access
    schemes, CSR pointers and entries); the result is ``[out_rows, h, d]`` in ``dtype``."""
    if not isinstance(spec, EdgewiseSpec):
        raise TypeError(f"spec must be an EdgewiseSpec, got {type(spec).__name__}")
    inputs, arrays = list(inputs), list(arrays)
    if len(inputs) != spec.num_inputs or len(arrays) != spec.num_arrays:
        raise ValueError(f"spec reads {spec.num_inputs} inputs and {spec.num_arrays} arrays, "
                         f"got {len(inputs)} and {len(arrays)}")
    if not inputs:
        raise ValueError("inputs: the program reads no tensor")
    for i, t in enumerate(inputs):
        check_tensor(t, f"inputs[{i}]")
        if not t.is_floating_point():
            raise TypeError(f"inputs[{i}] must be floating, got {t.dtype}")
    for j, a in enumerate(arrays):
        check_tensor(a, f"arrays[{j}]")
        if a.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"arrays[{j}] must be int32 or int64, got {a.dtype}")
    devices = {t.device for t in inputs + arrays}
    if len(devices) > 1:
        raise ValueError(f"inputs and arrays must share one device, got {sorted(map(str, devices))}")
    if type(out_rows) is not int or out_rows < 0:
        raise ValueError(f"out_rows must be a non-negative int, got {out_rows!r}")
    if choose_backend(backend, inputs[0], "inputs[0]") == "torch":
        return edgewise_torch(spec, inputs, arrays, out_rows, dtype)
    return call(edgewise_op, spec_handle(spec), inputs, arrays, out_rows, dtype)
