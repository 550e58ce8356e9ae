"""Input validation shared by every public entry point.

Each check raises a ``TypeError`` (wrong kind of object or dtype) or a ``ValueError`` (right
kind, bad value) whose message names the argument and the offending value, so a user sees what
to fix before any kernel runs (DESIGN.md section 6).  Checks that need a pass over the data
(id ranges) are meant to run once, when a ``Graph`` is built, not on every forward.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import torch

def debug_enabled() -> bool:
    """Debug mode (``HECTOR_DEBUG`` set and not 0): the checks that cost a pass over the data
    on every call (CSR values in range, promises a caller makes about its tensors) and the
    compiler's IR verification after each pass.  Read on every call, so tests may set it."""
    return os.environ.get("HECTOR_DEBUG", "0") not in ("", "0")


_INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_tensor(value, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_not_meta(value: torch.Tensor, name: str) -> torch.Tensor:
    """Meta tensors carry a shape but no data: nothing can be computed from them."""
    if value.is_meta:
        raise ValueError(f"{name} is on the meta device (a shape without data); pass a tensor "
                         "holding values (cpu or cuda)")
    return value


def check_index(value, name: str, ndim: int) -> torch.Tensor:
    """An integer tensor of ``ndim`` dimensions (node ids, edge types, node types)."""
    check_tensor(value, name)
    if value.dtype not in _INTEGER_DTYPES:
        raise TypeError(f"{name} must have an integer dtype, got {value.dtype}")
    if value.dim() != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimension{'s' if ndim != 1 else ''}, "
            f"got shape {tuple(value.shape)}")
    return value


def check_edge_index(value, name: str = "edge_index") -> torch.Tensor:
    check_index(value, name, 2)
    # other index tensors (edge_type, ...) are then checked to be on edge_index's device
    check_not_meta(value, name)
    if value.shape[0] != 2:
        raise ValueError(f"{name} must have shape [2, num_edges], got {tuple(value.shape)}")
    return value


def check_count(value, name: str, allow_none: bool = False) -> Optional[int]:
    """A non-negative Python integer (sizes such as num_nodes)."""
    if value is None and allow_none:
        return None
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype in _INTEGER_DTYPES:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def check_size(value, name: str, allow_none: bool = False) -> Optional[int]:
    """A layer size (channels, heads, bases, blocks): a Python int >= 1.  PyG's lazy size -1
    is refused by name: hector layers need the width when they are built."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= 1, got {type(value).__name__} ({value!r})")
    if value == -1 and name.endswith("in_channels"):
        raise ValueError(f"{name}=-1 (PyG's lazy size, inferred at the first call) is not "
                         f"supported; pass the input feature width as {name}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def check_node_input(x, name: str, width: Optional[int], dtype: Optional[torch.dtype]
                     ) -> torch.Tensor:
    """A layer's node features: a floating ``[num_nodes, width]`` tensor with data, of the
    layer's parameter dtype.  A mismatch would otherwise surface inside a matmul (or, for the
    compiled layers, silently compute in the wider dtype), so one rule for every layer: x's
    dtype must equal the parameters' (``dtype``; None when the layer has no parameters)."""
    check_tensor(x, name)
    check_not_meta(x, name)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating tensor ({', '.join(map(str, FLOAT_DTYPES))}), "
                        f"got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape [num_nodes, {width or 'features'}], "
                         f"got {tuple(x.shape)}")
    if width is not None and x.shape[1] != width:
        raise ValueError(f"{name} has {x.shape[1]} features per node but the layer was built "
                         f"for in_channels={width} (shape {tuple(x.shape)})")
    if x.shape[1] == 0:
        raise ValueError(f"{name} has no features (shape {tuple(x.shape)}); it needs at least one "
                         "column")
    if dtype is not None and x.dtype != dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but the layer's parameters are {dtype}; "
                        f"convert one of them (x.to({dtype}) or layer.to({x.dtype}))")
    return x


def check_device_option(value, option: str = "--device") -> torch.device:
    """A command-line device: cpu or cuda[:N], and CUDA present when asked for.  ValueError
    naming the option otherwise (torch's own errors are multi-line tracebacks)."""
    hint = " ('gpu' is spelled cuda)" if str(value).lower().startswith("gpu") else ""
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):
        raise ValueError(f"{option} must be cpu or cuda[:N], got {value!r}{hint}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{option} must be cpu or cuda[:N], got {value!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{option} {value}: CUDA is not available on this machine "
                             f"(use {option} cpu)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{option} {value}: this machine has {torch.cuda.device_count()} "
                             "CUDA device(s)")
    return device


def check_output_file(path, option: str, create_folders: bool = False) -> None:
    """A file a command writes later (after its first case or epoch, or at the end): checked
    before any work, so a long run does not fail at its first save, and in one ValueError
    line naming the option.  Its folder must take a new file; with ``create_folders`` (the
    writer makes missing folders) its nearest existing parent must."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{option} {path}: is a folder, not a file")
    folder = target.parent
    while create_folders and not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{option} {path}: {folder} "
                         f"{'is not a folder' if folder.exists() else 'does not exist'}")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ValueError(f"{option} {path}: cannot write in {folder} "
                         f"({err.strerror or err})") from None


def check_same_length(a: torch.Tensor, a_name: str, length: int, length_name: str) -> None:
    if a.shape[0] != length:
        raise ValueError(
            f"{a_name} has {a.shape[0]} entries but {length_name} has {length}; "
            "they must be the same length")


def check_range(values: torch.Tensor, name: str, upper: int, upper_name: str) -> None:
    """Every entry in [0, upper).  One reduction over the data: call at build time only."""
    if values.numel() == 0:
        return
    lo, hi = int(values.min()), int(values.max())
    if lo < 0:
        bad = int((values < 0).nonzero()[0, -1]) if values.dim() == 1 else None
        where = f" (first at position {bad})" if bad is not None else ""
        raise ValueError(f"{name} contains a negative id {lo}{where}; ids must be >= 0")
    if hi >= upper:
        raise ValueError(
            f"{name} contains id {hi}, out of range for {upper_name}={upper} "
            f"(valid ids are 0..{upper - 1})" if upper > 0 else
            f"{name} contains id {hi} but {upper_name}=0")


def check_same_device(tensors: Sequence[tuple], what: str = "inputs") -> torch.device:
    """All named tensors on one device; returns it.  ``tensors`` is [(name, tensor|None)]."""
    named = [(n, t) for n, t in tensors if t is not None]
    if not named:
        return torch.device("cpu")
    first_name, first = named[0]
    for n, t in named[1:]:
        if t.device != first.device:
            raise ValueError(
                f"{n} is on {t.device} but {first_name} is on {first.device}; "
                f"all {what} must be on one device")
    return first.device


def check_features(x, name: str, num_rows: int, rows_name: str, device: torch.device,
                   num_cols: Optional[int] = None) -> torch.Tensor:
    """Node or edge features: a floating tensor [num_rows, ...] on the graph's device."""
    check_tensor(x, name)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating tensor ({', '.join(map(str, FLOAT_DTYPES))}), "
                        f"got {x.dtype}")
    if x.dim() < 1 or x.shape[0] != num_rows:
        raise ValueError(f"{name} must have {num_rows} rows ({rows_name}), got shape {tuple(x.shape)}")
    if num_cols is not None and (x.dim() != 2 or x.shape[1] != num_cols):
        raise ValueError(f"{name} must have shape [{num_rows}, {num_cols}], got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but the graph is on {device}; "
                         "move one of them with .to(device)")
    return x
