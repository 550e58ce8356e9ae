"""The traversal kernels' row bins and their custom ops, on the GPU.

    python scripts/gpu_traversal_check.py [--skip-tests] [--models rgat,hgt] [--scale 1.0]
                                          [--dim 64] [--dtype fp32] [--device cuda]

1. Runs on CUDA (TRITON_INTERPRET=0): tests/kernels/traversal, tests/kernels/test_custom_ops.py
   and tests/nn/test_compile.py -k triton (compiled RGCN/RGAT/HGT on the traversal ops).
2. Builds RGAT and HGT on synthetic ogbn-mag and records every traversal and edge-softmax
   launch of one training step (forward + backward).  Per launch: rows, nnz, longest and mean
   row, width, the row bins the CSR was built with (short rows / long rows / hub chunks), and
   GPU ms of (a) the binned launch, (b) the old layout (one program per row, BLOCK_E=16) and
   (c) torch (``sparse.mm`` / the scatter softmax); the predicted bytes, the floor at the HBM
   bandwidth and the binned launch's fraction of it.
3. Times one training step of each model with the binned layout and with the old layout
   swapped into the same CSRs (one run, so the two compare like with like).

Prints the tables.  ``--device cpu`` is a dry run on a development machine (TRITON_INTERPRET=1,
tiny scale, no timing worth reading).  Exit status 1 when a test run fails.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TESTS = [["tests/kernels/traversal", "tests/kernels/test_custom_ops.py"],
         ["tests/nn/test_compile.py", "-k", "triton"]]
HBM_GBPS = 4800.0            # H200 HBM3e peak, GB/s (the floor's bandwidth)


def log(*a):
    print(*a, flush=True)


def run_tests() -> bool:
    env = dict(os.environ, TRITON_INTERPRET="0")
    ok = True
    for args in TESTS:
        cmd = [sys.executable, "-m", "pytest", "-q", *args]
        log("$ TRITON_INTERPRET=0 " + " ".join(cmd))
        ok &= subprocess.call(cmd, cwd=ROOT, env=env) == 0
    return ok


def build(model, ds, dim, device, dtype):
    import hector
    from hector.compiler import models
    kinds = {"rgcn": (models.rgcn, dict(in_dim=dim, out_dim=dim)),
             "rgat": (models.rgat, dict(in_dim=dim, out_dim=dim // 4, heads=4)),
             "hgt": (models.hgt, dict(in_dim=dim, out_dim=dim, heads=4))}
    fn, dims = kinds[model]
    g = ds.graph.to(device)
    m = hector.compile(fn, backend="triton", num_relations=g.num_relations,
                       num_node_types=g.num_node_types, **dims).to(device).to(dtype)
    x = torch.randn(g.num_nodes, dim, device=device, dtype=dtype, requires_grad=True)
    out = m(g, x=x)
    cot = torch.randn_like(out)

    def step():
        return torch.autograd.grad(m(g, x=x), [x] + list(m.parameters()), cot,
                                   allow_unused=True)
    return g, step


class Recorder:
    """Records the traversal and edge-softmax launches (their CSR or graph, and shapes)."""

    def __init__(self):
        from hector.kernels.traversal import launch as L
        self.L, self.calls, self.seen = L, [], set()
        self._launch, self._softmax = L.launch, L.launch_edge_softmax

    def __enter__(self):
        def launch(m, x, addends, coefs, bias, tiles=None):
            self.calls.append(("traverse", m, tuple(x.shape), x.dtype, len(addends),
                               bias is not None))
            return self._launch(m, x, addends, coefs, bias, tiles)

        def softmax(graph, s, slope, alpha=None, grad=None):
            self.calls.append(("softmax_bwd" if alpha is not None else "softmax", graph,
                               tuple(s.shape), s.dtype, slope, None))
            return self._softmax(graph, s, slope, alpha, grad)
        self.L.launch, self.L.launch_edge_softmax = launch, softmax
        return self

    def __exit__(self, *exc):
        self.L.launch, self.L.launch_edge_softmax = self._launch, self._softmax


def old_layout(swap: bool, calls):
    """Swap the old layout (every row one program, no chunks) into the recorded CSRs and
    graphs, or back (``swap`` False)."""
    from hector.kernels.traversal.launch import softmax_bins
    from hector.kernels.traversal.schedule import row_bins
    for kind, obj, *_ in calls:
        if kind == "traverse":
            keep = obj.__dict__.setdefault("_new_bins", obj.layout)
            object.__setattr__(obj, "bins", row_bins(obj.ptr, -1, None) if swap else keep)
        else:
            key = ("edge_softmax_bins",)
            keep = obj.__dict__.setdefault("_new_softmax_bins", softmax_bins(obj))
            obj._derived[key] = row_bins(obj.csr_in.ptr, -1, None) if swap else keep


def launch_rows(calls, device, timed):
    from hector.kernels.attention.spec import next_pow2
    from hector.kernels.traversal import launch as L
    from hector.kernels.traversal.reference import edge_softmax_torch, traverse_torch
    from hector.kernels.traversal.schedule import Tiles, row_bins
    from hector.kernels.traversal.csr import WeightedCSR
    rows = []
    for kind, obj, shape, dtype, extra, bias in calls:
        x = torch.randn(shape, device=device, dtype=dtype)
        s = torch.tensor([], dtype=dtype).element_size()
        width = int(torch.Size(shape[1:]).numel())
        if kind == "traverse":
            m, b = obj, obj.layout
            adds = [torch.randn((m.rows,) + shape[1:], device=device, dtype=dtype)] * extra
            bvec = torch.randn(width, device=device, dtype=dtype) if bias else None
            cf = [1.0] * extra
            old = WeightedCSR(m.ptr, m.col, m.val, m.rows, m.cols, row_bins(m.ptr, -1, None))
            old_tiles = Tiles(min(next_pow2(width), 128), 1, 16, 4)
            new = timed(lambda: L.launch(m, x, adds, cf, bvec))
            was = timed(lambda: L.launch(old, x, adds, cf, bvec, tiles=old_tiles))
            ref = timed(lambda: traverse_torch(m, x, adds, cf, bvec))
            nbytes = m.nnz * (width * s + 8) + m.rows * width * s * (1 + extra) + m.rows * 8
            counts = m.ptr[1:] - m.ptr[:-1]
            longest = int(counts.max()) if m.rows else 0
            bins = f"{b.num_short}/{b.num_long}/{b.num_chunks}"
            rows.append((kind, m.rows, m.nnz, longest, m.nnz / max(1, m.rows), width, bins,
                         new, was, ref, nbytes))
        else:
            graph = obj
            bwd = kind == "softmax_bwd"
            b = L.softmax_bins(graph)
            alpha = torch.rand(shape, device=device, dtype=dtype) if bwd else None
            grad = torch.randn(shape, device=device, dtype=dtype) if bwd else None
            new = timed(lambda: L.launch_edge_softmax(graph, x, extra, alpha, grad))
            key = ("edge_softmax_bins",)
            graph._derived[key] = row_bins(graph.csr_in.ptr, -1, None)
            was = timed(lambda: L.launch_edge_softmax(graph, x, extra, alpha, grad))
            graph._derived[key] = b
            ref = float("nan") if bwd else timed(lambda: edge_softmax_torch(
                graph.dst.long(), graph.num_nodes, x, extra))
            e = graph.num_edges
            nbytes = e * width * s * (4 if bwd else 3) + e * 8 * 2 + graph.num_nodes * 8
            bins = f"{b.num_short}/{b.num_long}/0"
            deg = graph.in_degree
            rows.append((kind, graph.num_nodes, e, deg.max, deg.mean, width, bins, new, was,
                         ref, nbytes))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--models", default="rgat,hgt")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    scale = args.scale if args.scale is not None else (1.0 if device.type == "cuda" else 0.0002)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    ok = True
    if not args.skip_tests and device.type == "cuda":
        ok = run_tests()
        log("tests:", "PASS" if ok else "FAIL")
    from hector.bench.timing import timed as bench_timed
    from hector.datasets import synthetic

    def timed(fn):
        return bench_timed(fn, device, 3)["ms"]
    ds = synthetic.load("mag", device=device, scale=scale)
    log(f"graph synthetic:mag (scale {scale}): {ds.num_nodes} nodes, {ds.num_edges} edges")
    steps = []
    for model in args.models.split(","):
        g, step = build(model, ds, args.dim, device, dtype)
        with Recorder() as rec:
            step()
        new_ms = timed(step)
        old_layout(True, rec.calls)
        old_ms = timed(step)
        old_layout(False, rec.calls)
        steps.append((model, new_ms, old_ms))
        log("")
        log(f"### {model}: {len(rec.calls)} traversal/softmax launches per step "
            f"({args.dtype}, F={args.dim})")
        log("| op | rows | nnz | longest | mean | width | bins short/long/chunks | binned ms | "
            "old ms | torch ms | MB moved | floor ms | % of floor |")
        log("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: "
            "| ---: |")
        for op, r, nnz, mx, mean, w, bins, new, was, ref, nb in launch_rows(rec.calls, device,
                                                                            timed):
            floor = nb / (HBM_GBPS * 1e6)
            log(f"| {op} | {r} | {nnz} | {mx} | {mean:.2f} | {w} | {bins} | {new:.3f} | "
                f"{was:.3f} | {ref:.3f} | {nb / 1e6:.1f} | {floor:.3f} | "
                f"{100 * floor / max(new, 1e-9):.0f}% |")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    log("")
    log("| model | step ms (binned) | step ms (old layout) |")
    log("| --- | ---: | ---: |")
    for model, new_ms, old_ms in steps:
        log(f"| {model} | {new_ms:.2f} | {old_ms:.2f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
