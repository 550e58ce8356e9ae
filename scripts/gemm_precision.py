"""fp32 segment GEMMs by multiply mode (``HECTOR_FP32_DOT``): time and error of "ieee" (FMA
units), "tf32x3" (three TF32 tensor-core products) and "tf32" (one), per tile config, on the
shapes of the compiled relational layers on synthetic mag (CUDA only).

    python scripts/gemm_precision.py [--rows 1940000] [--width 64] [--configs]
    python scripts/gemm_precision.py --dense 169343x128x512,2708x128x512


Cases: a node-type GEMM (``rows`` contiguous rows, 4 segments), a compact-row GEMM (1.58 x
``rows`` rows gathered from ``rows`` node rows, 8 relations), and the weight gradient of
each.  Error: max |got - fp64| / max |fp64| over the output.  Time: ``triton.testing.do_bench``
median.  TB/s counts each row read once and written once (the floor's bytes).

``--dense RxKxN,...``: instead, dense products ``[R, K] x [K, N]`` (the attention layers'
node projections) in one segment, each mode beside torch's fp32 ``mm`` (cuBLAS), with the
weight gradient ``x^T dy`` beside torch's; TFLOP/s counts ``2 R K N``.
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


def set_mode(mode):
    os.environ[FP32_DOT_ENV] = mode if mode != "tf32" else "ieee"
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"


def dense(shapes: str, all_configs: bool, gen: torch.Generator):
    """Dense node projections: the segment GEMM by mode against torch's fp32 mm."""
    print(f"{'R x K x N':20} {'mode':7} {'config':22} {'fwd ms':>8} {'TFLOP/s':>7} {'err':>8} "
          f"{'wgrad ms':>9} {'err':>8}")
    for shape in shapes.split(","):
        r, k, n = (int(v) for v in shape.split("x"))
        dev = torch.device("cuda")
        x = torch.randn(r, k, generator=gen).to(dev)
        w = (torch.randn(1, k, n, generator=gen) / k ** 0.5).to(dev)
        dy = torch.randn(r, n, generator=gen).to(dev)
        want = x.double() @ w[0].double()
        dw_want = x.double().t() @ dy.double()
        flop = 2 * r * k * n
        set_mode("ieee")
        rows = [("torch mm", "cuBLAS", lambda: x @ w[0], lambda: x.t() @ dy)]
        for mode in ("ieee", "tf32x3", "tf32"):
            set_mode(mode)
            spec = GemmSpec.of(x, None, None, False, n)
            configs = tune_configs(spec)
            for sched in (configs if all_configs else configs[:1]):
                cfg = f"{sched.block_m}x{sched.block_n}x{sched.block_k} w{sched.num_warps}"
                rows.append((mode, cfg,
                             lambda s=spec, c=sched: launch_gemm(s, c, (0, r), x, w, None, None, 0),
                             lambda s=spec, c=sched: launch_wgrad(s, c, (0, r), x, None, dy, None, w)))
        for mode, cfg, fwd, wg in rows:
            set_mode("ieee" if mode == "torch mm" else mode)
            try:
                err, werr = rel_err(fwd(), want), rel_err(wg().reshape(k, n), dw_want)
            except triton.runtime.errors.OutOfResources as e:   # a config too big for N
                print(f"{shape:20} {mode:7} {cfg:22} skipped: {e}", flush=True)
                continue
            t, tw = triton.testing.do_bench(fwd), triton.testing.do_bench(wg)
            print(f"{shape:20} {mode:7} {cfg:22} {t:8.3f} {flop / t / 1e9:7.1f} {err:8.1e} "
                  f"{tw:9.3f} {werr:8.1e}", flush=True)
    set_mode("ieee")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_940_000)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--configs", action="store_true", help="every tune config, not only the heuristic")
    p.add_argument("--dense", help="RxKxN,...: dense products against torch's mm instead")
    a = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    if a.dense:
        return dense(a.dense, a.configs, gen)
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
            set_mode(mode)
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
    set_mode("ieee")


if __name__ == "__main__":
    main()
