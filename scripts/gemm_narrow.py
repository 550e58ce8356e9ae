"""Timing of the segment GEMMs whose output or reduction is narrow (RGAT's per-head scores
and their dx) on a synthetic profile's compact rows, for every config the tuner would try
(the heuristic first), next to the byte floor.  CUDA only.

    python scripts/gemm_narrow.py wikikg2 mag [--heads 1,4] [--features 64]

Each line: profile, N (or K for dx), config (block_m x block_n x block_k, warps), ms.
"""
import argparse

import torch
import triton

from hector.bench import suites
from hector.kernels.segment_mm.op import segment_mm
from hector.kernels.segment_mm.spec import GemmSpec, tune_configs

BANDWIDTH = 4.3e12      # H200 HBM3e, bytes/s (docs/perf-notes.md's floors)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profiles", nargs="+", help="synthetic profile names, e.g. wikikg2 mag")
    p.add_argument("--heads", default="1,4", help="narrow widths to time")
    p.add_argument("--features", type=int, default=64)
    a = p.parse_args()
    dev, k = torch.device("cuda"), a.features
    for name in a.profiles:
        g = suites.Workload("synthetic:" + name, dev).graph
        x = torch.randn(g.num_nodes, k, device=dev)
        rows = g.compact_src.node.long()
        ptr = [int(v) for v in g.compact_src.rel_ptr.tolist()]
        m = rows.numel()
        for n in (int(h) for h in a.heads.split(",")):
            w = torch.randn(g.num_relations, k, n, device=dev) / k ** 0.5
            floor = (m * k + m * n) * 4 / BANDWIDTH * 1e3
            for cfg in tune_configs(GemmSpec(True, False, False, torch.float32, k, n)):
                t = triton.testing.do_bench(
                    lambda: segment_mm(x, w, ptr, gather=rows, schedule=cfg), warmup=5, rep=30)
                print(f"{name} N={n} ({m} rows, floor {floor:.3f} ms) {cfg.block_m}x{cfg.block_n}"
                      f"x{cfg.block_k} w{cfg.num_warps}: {t:.3f} ms", flush=True)
            dy = torch.randn(m, n, device=dev)
            for cfg in tune_configs(GemmSpec(False, False, True, torch.float32, n, k)):
                t = triton.testing.do_bench(
                    lambda: segment_mm(dy, w, ptr, transpose_weight=True, schedule=cfg),
                    warmup=5, rep=30)
                print(f"{name} dx K={n} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} "
                      f"w{cfg.num_warps}: {t:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
