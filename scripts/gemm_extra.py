"""The segment GEMM's extra product against the two GEMMs it replaces: ``y = x W`` and ``x (W
V)`` (RGAT's message and source score) as one GEMM whose epilogue forms ``y V``, on rows
gathered like wikikg2's compact (src, relation) rows.  Each variant at the best of the
configs the tuner would try.  CUDA only.

    python scripts/gemm_extra.py [--rows 12.9e6] [--nodes 2.5e6] [--segments 535]
                                 [--shapes 64:1,64:2,64:4,128:1,128:2,128:4,128:8]

Each shape is ``K:E`` with ``N = K``; prints per dtype and shape: the message GEMM, the score
GEMM, their sum and the merged GEMM, in ms (``docs/perf-notes.md``, "Session 24").
"""
import argparse

import torch
from triton.testing import do_bench

from hector.kernels.segment_mm import launch
from hector.kernels.segment_mm.spec import GemmSpec, tune_configs


def rows_like_compact(m: int, nodes: int, segments: int, device):
    """(segment bounds, gather index): ``m`` rows cut at random into ``segments`` segments,
    each reading random node rows in ascending order (as a graph's compact rows do)."""
    gen = torch.Generator().manual_seed(0)
    cuts = torch.sort(torch.randint(0, m, (segments - 1,), generator=gen)).values.tolist()
    bounds = tuple([0] + cuts + [m])
    seg = torch.repeat_interleave(torch.arange(segments), torch.diff(torch.tensor(bounds)))
    idx = torch.randint(0, nodes, (m,), generator=gen)
    idx = idx[torch.argsort(seg * nodes + idx)]
    return bounds, idx.to(device=device, dtype=torch.int32)


def best_ms(spec: GemmSpec, bounds, x, w, idx, v=None) -> float:
    times = []
    for cfg in tune_configs(spec):
        def fn():
            return launch.launch_gemm(spec, cfg, bounds, x, w, idx, None, bounds[-1],
                                      extra_weight=v)
        fn()
        times.append(do_bench(fn, warmup=3, rep=25))
    return min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=float, default=12.9e6)
    p.add_argument("--nodes", type=float, default=2.5e6)
    p.add_argument("--segments", type=int, default=535)
    p.add_argument("--shapes", default="64:1,64:2,64:4,128:1,128:2,128:4,128:8")
    a = p.parse_args()
    dev = torch.device("cuda")
    bounds, idx = rows_like_compact(int(a.rows), int(a.nodes), a.segments, dev)
    print("| dtype | K = N | E | x W ms | x (W V) ms | two GEMMs | merged (extra product) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for dtype in (torch.float32, torch.bfloat16):
        for shape in a.shapes.split(","):
            k, e = (int(s) for s in shape.split(":"))
            x = torch.randn(int(a.nodes), k, device=dev, dtype=dtype)
            w = (torch.randn(a.segments, k, k, device=dev) * 0.1).to(dtype)
            v = (torch.randn(k, e, device=dev) * 0.1).to(dtype)
            wv = (w.float() @ v.float()).to(dtype)
            spec = GemmSpec.of(x, idx, None, False, k)
            main_ms = best_ms(spec, bounds, x, w, idx)
            score_ms = best_ms(GemmSpec.of(x, idx, None, False, e), bounds, x, wv, idx)
            merged_ms = best_ms(GemmSpec.of(x, idx, None, False, k, extra_cols=e), bounds, x,
                                w, idx, v)
            print(f"| {str(dtype)[6:]} | {k} | {e} | {main_ms:.3f} | {score_ms:.3f} | "
                  f"{main_ms + score_ms:.3f} | {merged_ms:.3f} |", flush=True)


if __name__ == "__main__":
    main()
