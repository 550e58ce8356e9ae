"""How ``hector bench`` times one function, and how it decides a timing is too noisy to judge.

Each measurement is a list of run times summarised as median, min and max, and its spread as
the relative interquartile range ``(q3 - q1) / median`` (robust to one outlier run, unlike
``(max - min) / median``).  On the CPU, runs continue past ``repeats`` while the spread is
above ``NOISE_IQR`` and the time budget lasts; a measurement that ends with fewer than
``MIN_RUNS`` runs or a spread still above ``NOISE_IQR`` is flagged ``noisy``, and no met/MISSED
verdict is drawn from it (see ``targets``).  On a CPU shared with other work (identical runs
of PyG's RGCN measured 25 ms to 1 s) a median of 5 alone flipped verdicts between runs.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

CPU_MAX_S = 6.0         # CPU: timed runs per measurement stop after this, settled or not
MAX_RUNS = 100          # CPU: at most this many timed runs per measurement
MIN_RUNS = 3            # fewer runs than this: the spread is unknown, the timing noisy
NOISE_IQR = 0.10        # relative interquartile range above which a timing is noisy
SLOW_MS = 250.0         # CUDA: a run slower than this is timed SLOW_REPEATS times
SLOW_REPEATS = 3
ROUNDS = 4              # interleaved timing: alternating rounds per peer


def spread(times: List[float]) -> float:
    """Relative interquartile range of ``times`` (inf with fewer than two)."""
    if len(times) < 2:
        return float("inf")
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / max(statistics.median(times), 1e-12)


def summary(times: List[float]) -> dict:
    """{ms (the median), min_ms, max_ms, runs, iqr (relative), noisy}."""
    iqr = spread(times)
    return dict(ms=statistics.median(times), min_ms=min(times), max_ms=max(times),
                runs=len(times), iqr=iqr if iqr != float("inf") else None,
                noisy=len(times) < MIN_RUNS or iqr > NOISE_IQR)


def _cpu_times(fn, repeats: int, budget_s: Optional[float] = None) -> List[float]:
    budget_s = CPU_MAX_S if budget_s is None else budget_s     # (read at call time)
    fn()                                       # warm-up: caches, lazy initialisation
    times: List[float] = []
    start = time.perf_counter()
    while len(times) < MAX_RUNS:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        settled = len(times) >= max(repeats, MIN_RUNS) and spread(times) <= NOISE_IQR
        # a slow or noisy case must not blow up the run: stop at the budget, even after one
        if settled or time.perf_counter() - start > budget_s:
            break
    return times


def _cuda_times(fn, device: torch.device) -> List[float]:
    t0 = time.perf_counter()
    fn()                                       # warm-up: compilation, autotuning, caches
    torch.cuda.synchronize(device)
    if (time.perf_counter() - t0) * 1e3 < SLOW_MS:
        from triton.testing import do_bench
        try:
            times = do_bench(fn, warmup=25, rep=100, return_mode="all")
        except (TypeError, ValueError, AssertionError):     # a Triton without "all"
            times = do_bench(fn, warmup=25, rep=100, return_mode="median")
        return [float(t) for t in times] if isinstance(times, (list, tuple)) else [float(times)]
    times = []
    for _ in range(SLOW_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end))
    return times


def run_times(fn, device: torch.device, repeats: int,
              budget_s: Optional[float] = None) -> List[float]:
    """The raw run times (ms) behind :func:`timed` (``budget_s``: the CPU's time budget,
    ``CPU_MAX_S`` when None)."""
    if device.type == "cuda":
        return _cuda_times(fn, device)
    return _cpu_times(fn, repeats, budget_s)


def interleaved(fns: Dict[str, Callable[[], object]], device: torch.device, repeats: int,
                rounds: int = ROUNDS) -> Dict[str, dict]:
    """``summary`` of each of ``fns``' run times, timed in ``rounds`` alternating rounds (the
    order reversed every round) and pooled: two peers compared this way see the same
    clocks, host load and thermal state, where back-to-back measurements drift apart (the
    eager small-graph rows of an optimised and an unoptimised plan flipped between runs)."""
    names = list(fns)
    times: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            times[n] += run_times(fns[n], device, max(repeats // rounds, 1), CPU_MAX_S / rounds)
    return {n: summary(t) for n, t in times.items()}


def timed(fn, device: torch.device, repeats: int) -> dict:
    """``summary`` of ``fn``'s run times in milliseconds.  CUDA: events, through triton's
    do_bench (warm-up, then about 100 ms of runs), except that a run slower than SLOW_MS is
    timed SLOW_REPEATS times (PyG on the large profiles takes seconds a run).  CPU:
    time.perf_counter after one warm-up, ``repeats`` runs or more (see the module doc)."""
    return summary(run_times(fn, device, repeats))


def cuda_syncs(fn):
    """``(fn(), syncs)``: the synchronizing CUDA calls ``fn`` made (host reads of device
    data, each a wait for the GPU to drain), found by ``torch.cuda.set_sync_debug_mode``,
    counted by the Python line that made each (``file:line``, the path from ``src/`` on).
    The scripts that hunt per-batch syncs (``scripts/batch_overhead.py``,
    ``scripts/ddp_step_profile.py``) use it; CUDA only."""
    import collections
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # (a warning raised inside torch/cuda/ itself is this helper's own mode switch: seen once
    # per call on the H200, torch 2.11, at torch/cuda/__init__.py)
    return out, collections.Counter(f"{w.filename.rsplit('/src/', 1)[-1]}:{w.lineno}"
                                    for w in caught if "synchroniz" in str(w.message)
                                    and "/torch/cuda/" not in w.filename.replace("\\", "/"))
