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
from typing import List

import torch

CPU_MAX_S = 6.0         # CPU: timed runs per measurement stop after this, settled or not
MAX_RUNS = 100          # CPU: at most this many timed runs per measurement
MIN_RUNS = 3            # fewer runs than this: the spread is unknown, the timing noisy
NOISE_IQR = 0.10        # relative interquartile range above which a timing is noisy
SLOW_MS = 250.0         # CUDA: a run slower than this is timed SLOW_REPEATS times
SLOW_REPEATS = 3


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


def _cpu_times(fn, repeats: int) -> List[float]:
    fn()                                       # warm-up: caches, lazy initialisation
    times: List[float] = []
    start = time.perf_counter()
    while len(times) < MAX_RUNS:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        settled = len(times) >= max(repeats, MIN_RUNS) and spread(times) <= NOISE_IQR
        # a slow or noisy case must not blow up the run: stop at the budget, even after one
        if settled or time.perf_counter() - start > CPU_MAX_S:
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


def timed(fn, device: torch.device, repeats: int) -> dict:
    """``summary`` of ``fn``'s run times in milliseconds.  CUDA: events, through triton's
    do_bench (warm-up, then about 100 ms of runs), except that a run slower than SLOW_MS is
    timed SLOW_REPEATS times (PyG on the large profiles takes seconds a run).  CPU:
    time.perf_counter after one warm-up, ``repeats`` runs or more (see the module doc)."""
    if device.type == "cuda":
        return summary(_cuda_times(fn, device))
    return summary(_cpu_times(fn, repeats))
