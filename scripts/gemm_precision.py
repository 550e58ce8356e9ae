"""fp32 segment GEMMs by multiply mode (``HECTOR_FP32_DOT``): time and error of "ieee" (FMA
units), "tf32x3" (three TF32 tensor-core products) and "tf32" (one), per tile config, on the
shapes of the compiled relational layers on synthetic mag (CUDA only).

    python scripts/gemm_precision.py [--rows 1940000] [--width 64] [--configs]

Cases: a node-type GEMM (``rows`` contiguous rows, 4 segments), a compact-row GEMM (1.58 x
``rows`` rows gathered from ``rows`` node rows, 8 relations), and the weight gradient of
each.  Error: max |got - fp64| / max |fp64| over the output.  Time: ``triton.testing.do_bench``
median.  TB/s counts each row read once and written once (the floor's bytes).
"""
from __future__ import annotations

import argparse
import os

import torch
import triton

from hector.kernels.segment_mm.launch import launch_gemm, launch_wgrad
from hector.kernels.segment_mm.spec import FP32_DOT_ENV, GemmSpec, tune_configs


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-300))


def cases(rows: int, width: int, gen: torch.Generator):
    dev = torch.device("cuda")
    x = torch.randn(rows, width, generator=gen).to(dev)
    w4 = (torch.randn(4, width, width, generator=gen) / width ** 0.5).to(dev)
    w8 = (torch.randn(8, width, width, generator=gen) / width ** 0.5).to(dev)
    node_bounds = tuple(rows * i // 4 for i in range(5))
    m = int(rows * 1.58)
    gather = torch.randint(0, rows, (m,), generator=gen, dtype=torch.int32).to(dev)
    compact_bounds = tuple(m * i // 8 for i in range(9))
    return [("node GEMM", x, w4, node_bounds, None), ("compact GEMM", x, w8, compact_bounds, gather)]


def reference(x, w, bounds, gather):
    a = (x if gather is None else x.index_select(0, gather.long())).double()
    out = torch.empty(a.shape[0], w.shape[2], dtype=torch.float64, device=x.device)
    for s in range(len(bounds) - 1):
        lo, hi = bounds[s], bounds[s + 1]
        out[lo:hi] = a[lo:hi] @ w[s].double()
    return a, out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_940_000)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--configs", action="store_true", help="every tune config, not only the heuristic")
    a = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    print(f"{'case':14} {'mode':7} {'config':28} {'fwd ms':>8} {'TB/s':>5} {'err':>8} "
          f"{'wgrad ms':>9} {'err':>8}")
    for name, x, w, bounds, gather in cases(a.rows, a.width, gen):
        a64, want = reference(x, w, bounds, gather)
        dy = torch.randn(want.shape, generator=gen).to(x.device)
        dw_want = torch.stack([a64[lo:hi].t() @ dy[lo:hi].double()
                               for lo, hi in zip(bounds[:-1], bounds[1:])])
        del a64
        moved = (bounds[-1] * x.shape[1] + want.numel()) * 4
        for mode in ("ieee", "tf32x3", "tf32"):
            os.environ[FP32_DOT_ENV] = mode if mode != "tf32" else "ieee"
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            spec = GemmSpec.of(x, gather, None, False, w.shape[2])
            configs = tune_configs(spec)
            for sched in (configs if a.configs else configs[:1]):
                def fwd():
                    return launch_gemm(spec, sched, bounds, x, w, gather, None, 0)

                def wg():
                    return launch_wgrad(spec, sched, bounds, x, gather, dy, None, w)
                err = rel_err(fwd(), want)
                werr = rel_err(wg(), dw_want)
                t = triton.testing.do_bench(fwd)
                tw = triton.testing.do_bench(wg)
                cfg = f"{sched.block_m}x{sched.block_n}x{sched.block_k} w{sched.num_warps}"
                print(f"{name:14} {mode:7} {cfg:28} {t:8.3f} {moved / t / 1e9:5.2f} {err:8.1e} "
                      f"{tw:9.3f} {werr:8.1e}", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False


if __name__ == "__main__":
    main()
