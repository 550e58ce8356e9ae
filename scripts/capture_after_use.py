"""Can a user capture a hector layer's training step in a plain ``torch.cuda.graph`` after
eager and ``torch.compile`` calls of it in the same process, and how does
``torch.compile(mode="reduce-overhead")`` compare with that manual capture?  (CUDA)

    python scripts/capture_after_use.py [--layers gat,rgat,hgt] \
        [--datasets synthetic:cora,synthetic:aifb]

Per layer: eager steps (warm calls replayed), then ``torch.compile(layer)`` steps, then a
manual capture of one forward + backward (replayed and checked against an eager step), then
``torch.compile(layer, mode="reduce-overhead")``; prints ms per step of the manual replay and
of the reduce-overhead steps, and any failure with its message.  Run with
``TORCH_LOGS=perf_hints`` to see why cudagraph trees skip a graph; ``--profile DIR`` writes
``torch.profiler`` tables (host ops and kernels, by self time) of ten steps of each to DIR;
``--floor``: the same three steps (eager, manual capture, reduce-overhead) around one
``nn.Linear`` on the same input, nothing of hector in it: what torch's own reduce-overhead
step costs against a manual capture of it.
"""
import argparse
import os
import time
import traceback

import torch

from hector.bench import suites


def per_step(fn, n=100):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def profile(fn, path, steps=10):
    """A ``torch.profiler`` table of ``steps`` calls of ``fn`` (host ops and kernels, by
    self time), written to ``path``."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    with open(path, "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
        f.write("\n")
        f.write(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))


def step_of(module, x, call):
    """A training step as a loop makes it: zero_grad, ``call(x)``, sum, backward."""
    def step():
        module.zero_grad(set_to_none=True)
        x.grad = None
        call(x).sum().backward()
    return step


def capture(step) -> torch.cuda.CUDAGraph:
    """``step`` captured in a plain ``torch.cuda.graph`` after three warm-up calls on a side
    stream, as a user would capture it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):     # (warm calls of a hector layer replay here)
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def linear_floor(W, features=64):
    """Eager, manual-capture and reduce-overhead steps of one ``nn.Linear`` (the same step:
    zero_grad, forward, sum, backward), ms each."""
    lin = torch.nn.Linear(features, features).to(W.device)
    x = W.x(features).detach().clone().requires_grad_()
    row = {"eager ms": per_step(step_of(lin, x, lin))}
    row["manual capture ms"] = per_step(capture(step_of(lin, x, lin)).replay)
    row["compile RO ms"] = per_step(step_of(lin, x, torch.compile(lin, mode="reduce-overhead")))
    return row


def check(layer_name, W, features=64, profile_dir=None):
    ref = suites.pyg_layer(layer_name, W, features, 1)
    ours = suites.hector_layer(layer_name, ref, "triton").to(W.device)
    x = W.x(features).detach().clone().requires_grad_()
    row = {}

    def step_with(call):
        return step_of(ours, x, call)
    eager = step_with(suites.caller(layer_name, ours, W, False))
    for _ in range(4):
        eager()
    try:
        compiled = step_with(suites.caller(layer_name, torch.compile(ours), W, False))
        for _ in range(3):
            compiled()
    except Exception as exc:           # noqa: BLE001 (reported, not fatal)
        row["compile"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    try:
        graph = capture(eager)
        graph.replay()
        torch.cuda.synchronize()
        got = x.grad.clone()
        eager()
        torch.testing.assert_close(got, x.grad, rtol=1e-4, atol=1e-5)
        row["manual capture ms"] = per_step(graph.replay)
        if profile_dir:
            profile(graph.replay, os.path.join(profile_dir, f"{layer_name}-manual.txt"))
    except Exception as exc:           # noqa: BLE001
        row["manual capture"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        traceback.print_exc()
    try:
        ro = step_with(suites.caller(layer_name, torch.compile(ours, mode="reduce-overhead"),
                                     W, False))
        row["compile RO ms"] = per_step(ro)
        if profile_dir:
            profile(ro, os.path.join(profile_dir, f"{layer_name}-reduce-overhead.txt"))
    except Exception as exc:           # noqa: BLE001
        row["compile RO"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    row["eager ms"] = per_step(eager)
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="gat,rgat,hgt")
    p.add_argument("--datasets", default="synthetic:cora,synthetic:aifb")
    p.add_argument("--profile", metavar="DIR", help="write torch.profiler tables here")
    p.add_argument("--floor", action="store_true", help="also one nn.Linear's three steps")
    a = p.parse_args()
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
    dev = torch.device("cuda")
    rows = []
    for ds in a.datasets.split(","):
        W = suites.Workload(ds, dev)
        for layer in a.layers.split(","):
            if (layer in suites.RELATIONAL) != (W.graph.num_relations > 1):
                continue
            rows.append((layer, ds, check(layer, W, profile_dir=a.profile)))
        if a.floor:
            rows.append(("linear", ds, linear_floor(W)))
    for layer, ds, row in rows:
        print(layer, ds, "  ".join(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}"
                                   for k, v in row.items()))


if __name__ == "__main__":
    main()
