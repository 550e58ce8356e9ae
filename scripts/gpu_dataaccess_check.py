"""Data access inside the kernels on the GPU (traversal_csr, edgewise, bf16 storage).

    python scripts/gpu_dataaccess_check.py [--skip-tests] [--graphs aifb,mag]
                                           [--models rgcn,rgat,hgt] [--dtypes fp32,bf16]
                                           [--dim 64] [--repeats 10] [--device cuda]

1. Runs the relational tests on CUDA (TRITON_INTERPRET=0): tests/kernels/traversal,
   tests/kernels/edgewise, tests/nn/test_data_access.py, tests/compiler/test_autodiff.py, tests/compiler/test_wgrad_steps.py.
2. Times one training step (forward + backward of the compiled layer, Triton backend) on
   synthetic graphs with the statistics of aifb and ogbn-mag, fp32 and bf16: GPU ms per step
   (hector.bench.timing: CUDA events, median), peak memory of one step, and from
   torch.profiler the CUDA time of torch's index_select / index_add / index_copy / scatter /
   gather ops against the generated Triton kernels (traversal_csr, edgewise, edge_softmax,
   segment_mm, attention).  The RGAT/HGT training steps on mag: ``--graphs mag --models rgat,hgt
   --dtypes fp32``.

Prints one table.  ``--device cpu`` is a dry run on a development machine (needs
TRITON_INTERPRET=1; uses --scale 0.001 by default there).  Exit status 1 when a test run fails.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/kernels/traversal", "tests/kernels/edgewise", "tests/nn/test_data_access.py",
         "tests/compiler/test_autodiff.py", "tests/compiler/test_wgrad_steps.py"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TORCH_MOVES = ("index_select", "index_add", "index_copy", "scatter", "gather", "index_put",
               "aten::index")


def log(*a):
    print(*a, flush=True)


def run_tests() -> bool:
    env = dict(os.environ, TRITON_INTERPRET="0")
    cmd = [sys.executable, "-m", "pytest", "-q", *TESTS]
    log("$ TRITON_INTERPRET=0 " + " ".join(cmd))
    return subprocess.call(cmd, cwd=ROOT, env=env) == 0


def build(model: str, ds, dim: int, device):
    import hector
    from hector.compiler import models
    kinds = {"rgcn": (models.rgcn, dict(in_dim=dim, out_dim=dim)),
             "rgat": (models.rgat, dict(in_dim=dim, out_dim=dim // 4, heads=4)),
             "hgt": (models.hgt, dict(in_dim=dim, out_dim=dim, heads=4))}
    fn, dims = kinds[model]
    g = ds.graph.to(device)   # (a cached property of the dataset)
    m = hector.compile(fn, backend="triton", num_relations=g.num_relations,
                       num_node_types=g.num_node_types, **dims).to(device)
    return m, g


def step_fn(m, g, x, cot):
    def step():
        out = m(g, x=x)
        grads = torch.autograd.grad(out, [x] + list(m.parameters()), cot)
        return grads
    return step


def time_step(step, device, repeats: int):
    """(median ms of one step by hector's bench timing, peak bytes of one step above the
    memory held before it)."""
    from hector.bench.timing import timed
    ms = timed(step, device, repeats)["ms"]
    if device.type != "cuda":
        return ms, 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return ms, torch.cuda.max_memory_allocated() - base


def profile(step, device):
    """(torch gather/scatter ms, Triton kernel ms, top torch move ops) of one step."""
    from torch.profiler import ProfilerActivity, profile as tprofile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with tprofile(activities=acts) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    moves = kernels = 0.0
    top = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", getattr(ev, "cuda_time_total", 0.0)) / 1000.0
        name = ev.key
        if name.startswith("aten::") and any(k in name for k in TORCH_MOVES):
            moves += t
            top.append((t, name, ev.count))
        elif any(k in name for k in ("traversal_csr", "segment_mm", "attention_", "edgewise",
                                     "edge_softmax")):
            kernels += t
    top.sort(reverse=True)
    return moves, kernels, top[:4]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--graphs", default="aifb,mag")
    ap.add_argument("--models", default="rgcn,rgat,hgt")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    scale = args.scale if args.scale is not None else (1.0 if device.type == "cuda" else 0.001)
    ok = True
    if not args.skip_tests and device.type == "cuda":
        ok = run_tests()
        log("tests:", "PASS" if ok else "FAIL")
    from hector.datasets import synthetic
    rows = []
    for gname in args.graphs.split(","):
        ds = synthetic.load(gname, device=device, scale=scale)
        log(f"graph synthetic:{gname} (scale {scale}): {ds.num_nodes} nodes, {ds.num_edges} "
            f"edges, {ds.num_relations} relations")
        for model in args.models.split(","):
            for dname in args.dtypes.split(","):
                dtype = DTYPES[dname]
                try:
                    m, g = build(model, ds, args.dim, device)
                    m = m.to(dtype)
                    x = torch.randn(g.num_nodes, args.dim, device=device, dtype=dtype,
                                    requires_grad=True)
                    out = m(g, x=x)
                    cot = torch.randn_like(out)
                    step = step_fn(m, g, x, cot)
                    ms, peak = time_step(step, device, args.repeats)
                    moves, kern, top = profile(step, device)
                    rows.append((gname, model, dname, ms, peak / 2 ** 30, moves, kern, top))
                except Exception as exc:   # report and go on: one table for every case
                    rows.append((gname, model, dname, float("nan"), float("nan"),
                                 float("nan"), float("nan"), [(0, repr(exc)[:80], 0)]))
                finally:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    log("")
    log("| graph | layer | dtype | GPU ms/step | peak GiB | torch gather/scatter ms | "
        "hector kernels ms | largest torch moves |")
    log("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for g, mdl, d, ms, peak, moves, kern, top in rows:
        tops = "; ".join(f"{n} x{c} {t:.2f}ms" for t, n, c in top) or "none"
        log(f"| {g} | {mdl} | {d} | {ms:.2f} | {peak:.2f} | {moves:.2f} | {kern:.2f} | {tops} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
