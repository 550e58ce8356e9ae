"""The memory floor of a layer's forward: the bytes it must move at least once, over the
measured copy bandwidth of the device.

The definition the performance targets use: every gathered neighbour row once (one per edge) plus each node row
read once (the input features) and written once (the output).  What a neighbour row is
depends on the layer: the projected source row (RGCN, RGAT, GAT), the raw input row (AGNN),
or the key and value rows (HGT, Transformer).  Index reads and the weights are left out, so
the floor is a lower bound and the fraction an upper bound of what is reachable.
"""
from __future__ import annotations

from typing import Optional

import torch

#: neighbour rows gathered per edge, in units of the output width
GATHERED_ROWS = {"rgcn": 1, "rgat": 1, "gat": 1, "agnn": 1, "hgt": 2, "transformer": 2}
COPY_BYTES = 1 << 30                      # 1 GiB copied per bandwidth sample


def floor_bytes(layer: str, nodes: int, edges: int, features: int,
                dtype_bytes: int = 4, rows: Optional[int] = None) -> int:
    """Bytes the forward of ``layer`` must move: ``E * rows * F + N * (F_in + F_out)``;
    ``rows``: neighbour rows per edge where a formulation gathers other than the layer's
    (a reordered Transformer head gathers one input row, not a key and a value)."""
    if layer not in GATHERED_ROWS:
        raise ValueError(f"layer: unknown layer {layer!r}")
    rows = GATHERED_ROWS[layer] if rows is None else rows
    return dtype_bytes * (edges * rows * features + nodes * 2 * features)


def copy_bandwidth(device: torch.device, nbytes: int = COPY_BYTES) -> float:
    """Bytes per second of a device-to-device copy (read + write counted), median of
    repeats (CUDA events via triton's do_bench; wall clock on the CPU)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    if device.type == "cuda":
        from triton.testing import do_bench
        ms = float(do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median"))
    else:
        import statistics
        import time
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append((time.perf_counter() - t0) * 1e3)
        ms = statistics.median(times)
    del src, dst
    return 2 * nbytes / (ms * 1e-3)


def floor_ms(layer: str, nodes: int, edges: int, features: int, bandwidth: float,
             dtype_bytes: int = 4) -> float:
    return floor_bytes(layer, nodes, edges, features, dtype_bytes) / bandwidth * 1e3
