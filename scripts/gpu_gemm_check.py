"""GPU check of ``hector.kernels.segment_mm.op.segment_mm`` (the gather/scatter segment GEMM) on
realistic sizes: correctness of the Triton kernels against the torch backend (output, dx, dW),
then timings with ``triton.testing.do_bench`` (median) against (a) the torch backend and (b) one
dense ``torch.matmul`` of the same FLOPs -- no gather, no segments, cuBLAS -- as a ceiling.

Usage (no network needed)::

    python scripts/gpu_gemm_check.py                 # M=2M rows, S=4 and 100, K=N=64 and 128
    python scripts/gpu_gemm_check.py --quick         # M=200k, one S and width
    python scripts/gpu_gemm_check.py --autotune      # schedule='autotune' for the Triton path
    python scripts/gpu_gemm_check.py --dense-wgrad   # one dense segment's dW: kernel / cuBLAS

Columns: ``fwd``/``bwd`` milliseconds (bwd = dx + dW), speed-up of Triton over the torch
backend, the dense matmul's time, achieved TFLOP/s (2*M*K*N per pass) and TB/s counting the
bytes that must move once: each logical row of x as read (M*K), the indices, the weights and
the output rows (M*N, or the fp32 scatter buffer read and written).  The H200 copies ~4.2 TB/s.
"""
from __future__ import annotations

import argparse
import sys

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def rel_err(got, want):
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def make_problem(m, s, k, n, dtype, mode, gen):
    """``M`` logical rows over ``S`` segments of random (skewed) lengths, gathered from
    ``X = M/4`` rows (a node feeding ~4 edges) and, with scatter, summed into ``X`` rows."""
    dev = torch.device("cuda")
    cuts = torch.sort(torch.randint(0, m + 1, (s - 1,), generator=gen)).values
    seg_ptr = torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.tensor([m])]).to(dev)
    x_rows = max(m // 4, 1)
    case = dict(x=torch.randn(x_rows, k, generator=gen).to(dev, dtype),
                weight=(torch.randn(s, k, n, generator=gen) / k ** 0.5).to(dev, dtype),
                seg_ptr=seg_ptr,
                gather=torch.randint(0, x_rows, (m,), generator=gen, dtype=torch.int32).to(dev))
    if mode == "gather+scatter":
        case["scatter"] = torch.randint(0, x_rows, (m,), generator=gen,
                                        dtype=torch.int32).to(dev)
        case["num_out_rows"] = x_rows
    return case


def bytes_moved(case, m, k, n):
    e = case["x"].element_size()
    out = (2 * 4 * case["num_out_rows"] * n) if "scatter" in case else m * n * e
    idx = sum(case[name].numel() * case[name].element_size()
              for name in ("gather", "scatter") if name in case)
    return m * k * e + case["weight"].numel() * e + idx + out


def fwd_bwd(segment_mm, case, backend, schedule, dy_seed=7):
    x = case["x"].detach().requires_grad_()
    w = case["weight"].detach().requires_grad_()
    args = dict(case, x=x, weight=w)
    out = segment_mm(**args, backend=backend, schedule=schedule)
    dy = torch.randn(out.shape, generator=torch.Generator(device="cuda").manual_seed(dy_seed),
                     device="cuda").to(out.dtype)
    dx, dw = torch.autograd.grad(out, (x, w), dy)
    return out, dx, dw, (args, dy)


def bench(fn):
    import triton.testing
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def run_one(segment_mm, m, s, k, n, dtype, mode, schedule, gen):
    case = make_problem(m, s, k, n, dtype, mode, gen)
    got = fwd_bwd(segment_mm, case, "triton", schedule)
    want = fwd_bwd(segment_mm, case, "torch", None)
    errs = [rel_err(g, w) for g, w in zip(got[:3], want[:3])]
    ok = all(e < TOL[dtype] for e in errs)

    def timed(backend, sched):
        args, dy = fwd_bwd(segment_mm, case, backend, sched)[3]
        fwd = bench(lambda: segment_mm(**{**case}, backend=backend, schedule=sched))
        out = segment_mm(**args, backend=backend, schedule=sched)
        bwd = bench(lambda: torch.autograd.grad(out, (args["x"], args["weight"]), dy,
                                                retain_graph=True))
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fwd_bwd(segment_mm, case, backend, sched)
        return fwd, bwd, (torch.cuda.max_memory_allocated() - base) / 2 ** 30

    t_fwd, t_bwd, mem_t = timed("triton", schedule)
    r_fwd, r_bwd, mem_r = timed("torch", None)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    w0 = case["weight"][0]
    dense = bench(lambda: a @ w0)
    flops = 2.0 * m * k * n
    nbytes = bytes_moved(case, m, k, n)
    row = dict(dtype=str(dtype).split(".")[-1], mode=mode, S=s, K=k, N=n,
               err="/".join(f"{e:.0e}" for e in errs), ok="ok" if ok else "FAIL",
               fwd=t_fwd, bwd=t_bwd, torch_fwd=r_fwd, torch_bwd=r_bwd,
               x_fwd=r_fwd / t_fwd, x_bwd=r_bwd / t_bwd, dense=dense,
               tflops=flops / t_fwd * 1e-9, tbs=nbytes / t_fwd * 1e-9,
               dense_tflops=flops / dense * 1e-9, mem=mem_t, torch_mem=mem_r)
    del case, got, want, a
    torch.cuda.empty_cache()
    return row


COLUMNS = [("dtype", 8, ""), ("mode", 14, ""), ("S", 4, ""), ("K", 4, ""), ("N", 4, ""),
           ("err", 17, ""), ("ok", 4, ""), ("fwd", 7, ".3f"), ("bwd", 7, ".3f"),
           ("torch_fwd", 9, ".3f"), ("torch_bwd", 9, ".3f"), ("x_fwd", 6, ".1f"),
           ("x_bwd", 6, ".1f"), ("dense", 7, ".3f"), ("tflops", 7, ".1f"), ("tbs", 6, ".2f"),
           ("dense_tflops", 12, ".1f"), ("mem", 6, ".2f"), ("torch_mem", 9, ".2f")]


def print_row(row=None):
    if row is None:
        print(" ".join(f"{name:>{width}}" for name, width, _ in COLUMNS))
    else:
        print(" ".join(f"{row[name]:>{width}{spec}}" for name, width, spec in COLUMNS),
              flush=True)


def dense_wgrad_table(rows_list, shapes, dtype) -> None:
    """One dense segment's weight gradient ``x^T dy`` (no gather, no scatter), the segment
    kernel (row runs, atomics) against ``torch.mm`` (what ``launch.dense_wgrad_rows``
    chooses): the data behind that rule."""
    from hector.kernels.segment_mm import launch
    from hector.kernels.segment_mm.spec import GemmSpec, default_schedule
    rule = launch.dense_wgrad_rows
    print("| rows | K | N | kernel ms | cuBLAS ms | kernel / cuBLAS | rule picks |")
    print("|---|---|---|---|---|---|---|")
    for m in rows_list:
        for k, n in shapes:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            dy = torch.randn(m, n, device="cuda", dtype=dtype)
            spec = GemmSpec.of(x, None, None, False, n)
            like = torch.empty((1, k, n), device="cuda", dtype=dtype)
            call = (spec, default_schedule(spec), (0, m), x, None, dy, None, like)
            picks = "cuBLAS" if rule(spec, (0, m), x, dy) is not None else "kernel"
            try:
                launch.dense_wgrad_rows = lambda *a, **kw: None
                t_kernel = bench(lambda: launch.launch_wgrad(*call))
            finally:
                launch.dense_wgrad_rows = rule
            t_mm = bench(lambda: torch.mm(x.t(), dy))
            print(f"| {m} | {k} | {n} | {t_kernel:.4f} | {t_mm:.4f} | {t_kernel / t_mm:.2f} "
                  f"| {picks} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int)
    parser.add_argument("--segments", type=int, nargs="+")
    parser.add_argument("--dims", type=int, nargs="+")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    parser.add_argument("--modes", nargs="+", default=["gather", "gather+scatter"],
                        choices=["gather", "gather+scatter"])
    parser.add_argument("--autotune", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dense-wgrad", action="store_true",
                        help="only the table of one dense segment's weight gradient")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this script checks the Triton kernels on a GPU", file=sys.stderr)
        return 2
    if args.dense_wgrad:
        dense_wgrad_table(
            [args.rows] if args.rows else [20_000, 169_343, 500_000, 1_000_000, 2_000_000],
            [(d, d) for d in args.dims] if args.dims else [(64, 64), (128, 64), (128, 128)],
            DTYPES[args.dtypes[0]])     # (the first: fp32 by default)
        return 0
    import triton
    from hector.kernels.segment_mm.op import segment_mm
    # --quick changes the defaults only; explicit sizes win.
    defaults = (200_000, [8], [64]) if args.quick else (2_000_000, [4, 100], [64, 128])
    args.rows = args.rows or defaults[0]
    args.segments = args.segments or defaults[1]
    args.dims = args.dims or defaults[2]
    print(f"torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name()}; M={args.rows}, X=M/4, times in ms (median)")
    print("err = rel. error out/dx/dW vs torch backend; x_* = torch-backend time / Triton time;"
          " mem = peak GiB of one fwd+bwd")
    schedule = "autotune" if args.autotune else None
    gen = torch.Generator().manual_seed(0)
    print_row()
    failures = 0
    for dname in args.dtypes:
        for dim in args.dims:
            for s in args.segments:
                for mode in args.modes:
                    row = run_one(segment_mm, args.rows, s, dim, dim, DTYPES[dname], mode,
                                  schedule, gen)
                    failures += row["ok"] != "ok"
                    print_row(row)
    print("all correct" if not failures else f"{failures} configuration(s) FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
