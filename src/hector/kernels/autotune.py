"""Autotuning of a kernel over a small config list, keyed by the kernel's spec hash and a
shape bucket.

On CUDA each config of the list is timed once (``triton.testing.do_bench``, median) per
(kernel, spec hash, shape bucket, device, config list); the fastest is kept in memory and in
``autotune.json`` in the kernel cache folder, so later processes reuse it without timing.
Under ``TRITON_INTERPRET=1`` (timings there mean nothing), off CUDA, or with
``HECTOR_AUTOTUNE=0`` the first config -- each family's heuristic default -- is used untimed.

Every config of a list must be valid for every shape it may meet (the kernels mask all
tile edges), so a wrong pick can only be slower, never wrong.  ``run(config)`` is called
several times on the real inputs; it must be repeatable: a launch that accumulates into its
output with atomics must get a freshly zeroed output on every call (the GEMM runtime
allocates its outputs inside ``run``; the attention launch zeroes the one output it sums
into, RGAT's per-(dst, relation) destination-term gradient, before every run).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from ..device import interpreting
from .registry import cache_dir
from .sizes import next_pow2

FILE_NAME = "autotune.json"

_lock = threading.RLock()
_chosen: Dict[tuple, int] = {}          # fast key -> index of the chosen config
_picks: Dict[tuple, object] = {}        # a launch path's own key -> its pick (see memo)
_files: Dict[Path, dict] = {}           # autotune.json contents per cache folder, as loaded


def enabled(device: torch.device) -> bool:
    """Whether configs are timed for ``device``: CUDA, not the interpreter, not switched off
    with ``HECTOR_AUTOTUNE=0``."""
    return (device.type == "cuda" and not interpreting()
            and os.environ.get("HECTOR_AUTOTUNE", "1") != "0")


def bucket(*sizes: int) -> Tuple[int, ...]:
    """Sizes rounded up to powers of two: shapes in one bucket share a tuning result."""
    return tuple(next_pow2(s) for s in sizes)


def config_dict(config) -> dict:
    """A config as plain data (dataclass fields; a ``reason`` text is not part of it)."""
    if dataclasses.is_dataclass(config):
        data = dataclasses.asdict(config)
    else:
        data = dict(config)
    data.pop("reason", None)
    return data


def _device_name(device: torch.device) -> str:
    """The GPU model (a choice made on one model says nothing about another)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return device.type


def _file_key(kernel: str, spec_hash: str, shape: tuple, device: torch.device,
              configs: Sequence) -> str:
    listing = json.dumps([config_dict(c) for c in configs], sort_keys=True)
    digest = hashlib.sha256(listing.encode()).hexdigest()[:16]
    return (f"{kernel}/{spec_hash[:24]}/{'x'.join(map(str, shape))}/{_device_name(device)}/"
            f"configs-{digest}")


def _timer(fn: Callable[[], object]) -> float:
    import triton.testing   # lazy: triton must not load before TRITON_INTERPRET is set
    return triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median")


def _load(folder: Path) -> dict:
    if folder not in _files:
        try:
            data = json.loads((folder / FILE_NAME).read_text(encoding="utf-8"))
            _files[folder] = data if isinstance(data, dict) else {}
        except (OSError, ValueError):   # no file yet, or a corrupt one: start afresh
            _files[folder] = {}
    return _files[folder]


def _save(folder: Path, key: str, record: dict) -> None:
    """Merge ``record`` into the folder's autotune.json (re-read first, so concurrent
    processes lose at most a duplicate timing) and replace the file atomically."""
    _files.pop(folder, None)
    data = _load(folder)
    data[key] = record
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="autotune.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, folder / FILE_NAME)
    except OSError as exc:
        warnings.warn(f"could not save autotuning results to {folder / FILE_NAME}: {exc}",
                      RuntimeWarning, stacklevel=3)


def choose(kernel: str, spec_hash: str, shape: tuple, configs: Sequence,
           run: Callable[[object], object], device: torch.device, *,
           timer: Optional[Callable[[Callable[[], object]], float]] = None,
           tune: Optional[bool] = None):
    """The config of ``configs`` to launch ``kernel`` (rendered with ``spec_hash``) with on
    inputs of shape bucket ``shape`` (see :func:`bucket`).

    ``run(config)`` launches the kernel with a config; ``timer(fn)`` returns milliseconds
    (default ``triton.testing.do_bench``); ``tune`` overrides :func:`enabled`.  A config that
    fails to compile or launch (shared memory, registers) is skipped; if all fail, the first
    is returned, so its error surfaces at the real launch."""
    configs = tuple(configs)
    if not configs:
        raise ValueError(f"choose({kernel!r}): configs is empty")
    if len(configs) == 1 or not (enabled(device) if tune is None else tune):
        return configs[0]
    folder = cache_dir()
    fast = (kernel, spec_hash, shape, str(device), configs, folder)
    index = _chosen.get(fast)
    if index is not None:
        return configs[index]
    with _lock:
        key = _file_key(kernel, spec_hash, shape, device, configs)
        saved = _load(folder).get(key)
        if (isinstance(saved, dict) and isinstance(saved.get("index"), int)
                and 0 <= saved["index"] < len(configs)
                and saved.get("config") == config_dict(configs[saved["index"]])):
            index = saved["index"]
        else:
            index, timings = _time_all(configs, run, timer or _timer)
            _save(folder, key, {"index": index, "config": config_dict(configs[index]),
                                "ms": timings})
        _chosen[fast] = index
    return configs[index]


def _time_all(configs: Sequence, run, timer) -> Tuple[int, list]:
    """(index of the fastest config, milliseconds of each; None for one that failed)."""
    timings = []
    for cfg in configs:
        try:
            timings.append(float(timer(lambda cfg=cfg: run(cfg))))
        except Exception:   # a config the compiler rejects on this device
            timings.append(None)
    ok = [(ms, i) for i, ms in enumerate(timings) if ms is not None]
    return (min(ok)[1] if ok else 0), timings


def recorded(spec_hash: str) -> Dict[str, dict]:
    """Tuning results saved in the cache folder for kernels rendered with ``spec_hash``
    (what ``hector.explain`` reports): file key -> {index, config, ms}."""
    with _lock:
        _files.pop(cache_dir(), None)   # read afresh: another process may have tuned
        data = _load(cache_dir())
    return {k: v for k, v in data.items() if f"/{spec_hash[:24]}/" in k}


def memo(key: tuple, pick: Callable[[], object]):
    """``pick()`` (a :func:`choose` call and what goes with it), kept under ``key`` until
    :func:`clear_memo`: a launch path whose key is cheaper than building the config list and
    spec hash that :func:`choose` needs looks its pick up here first.  ``key`` must hold
    everything the pick depends on, shape bucket and device included, so the memo stays
    bounded by the buckets met."""
    hit = _picks.get(key)
    if hit is None:
        hit = _picks[key] = pick()
    return hit


def clear_memo() -> None:
    """Forget choices and loaded files held in memory (tests; the JSON file stays)."""
    with _lock:
        _chosen.clear()
        _files.clear()
        _picks.clear()
