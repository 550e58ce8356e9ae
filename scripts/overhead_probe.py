"""Where a warm layer call spends its time: host time per call (CPU time of the launching
thread: Python, checks, dispatch, launches), wall time per call, device time per call (the
kernels torch.profiler sees) and kernels launched per call.  Small graphs are launch-bound;
this says by how much, per layer, for an eager inference call and an eager training step
(forward + backward).

    python scripts/overhead_probe.py --datasets synthetic:cora,synthetic:aifb \
        [--layers gat,agnn,transformer,rgcn,rgat,hgt] [--features 64] [--heads 1] \
        [--root DIR] [--cprofile DIR] [--json FILE] [--pyg] [--torch-floor]

``--root``: a folder holding real datasets (``cora/``, ``aifb/`` ...: ``../shared/data``);
``--cprofile DIR``: a cProfile of 50 warm training steps per (layer, dataset), by own time,
written to ``DIR/<layer>-<dataset>.txt``; ``--pyg``: PyG's layer too (same parameters).
Relational layers run on relational datasets, attention layers on any (their relations are
ignored).
"""
import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _step(call, xg, train, module):
    def step():
        if train:          # (as a training loop does: hector bench's step too)
            module.zero_grad(set_to_none=True)
            xg.grad = None
            call(xg).sum().backward()
        else:
            with torch.no_grad():
                call(xg)
    return step


def _kernels(step):
    acts = [torch.profiler.ProfilerActivity.CUDA if torch.cuda.is_available()
            else torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        step()
        sync()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(kernels), sum(e.device_time for e in kernels) / 1e3


def probe(layer_name, W, features, heads, calls=200, pyg=False, cprofile=None):
    """{'<peer> infer|train': {host_ms, wall_ms, kernels, kernel_ms}} for one layer."""
    from hector.bench import suites
    ref = suites.pyg_layer(layer_name, W, features, heads)
    backend = "triton" if W.device.type == "cuda" else "torch"
    ours = suites.hector_layer(layer_name, ref, backend).to(W.device)
    x = W.x(features)
    out = {}
    peers = [("hector", ours, False)] + ([("PyG", ref, True)] if pyg else [])
    for name, mod, is_pyg in peers:
        call = suites.caller(layer_name, mod, W, is_pyg)
        for train in (False, True):
            xg = x.detach().clone().requires_grad_(train)
            step = _step(call, xg, train, mod)
            for _ in range(5):
                step()
            sync()
            # Host: the process's CPU time over back-to-back calls (autograd launches the
            # backward from its device thread; the queue does not fill: these steps are
            # host-bound); wall: the same loop up to the last kernel's end.
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(calls):
                step()
            host = (time.process_time() - c0) / calls * 1e3
            sync()
            wall = (time.perf_counter() - t0) / calls * 1e3
            n, kernel_ms = _kernels(step)
            out[f"{name} {'train' if train else 'infer'}"] = dict(
                host_ms=host, wall_ms=wall, kernels=n, kernel_ms=kernel_ms)
            if cprofile and train and not is_pyg:
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(50):
                    step()
                sync()
                pr.disable()
                buf = io.StringIO()
                pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(45)
                pstats.Stats(pr, stream=buf).sort_stats("cumtime").print_stats(45)
                Path(cprofile).mkdir(parents=True, exist_ok=True)
                tag = W.name.replace(":", "_")
                (Path(cprofile) / f"{layer_name}-{tag}.txt").write_text(buf.getvalue())
    return out


def launch_floor(calls=2000):
    """Host us per launch of a trivial Triton kernel (4 pointer/int arguments) through
    ``kernel[grid](...)``, and per ``torch.empty``: the floors a warm step's launches sit on."""
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(x, y, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)
    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    for _ in range(10):
        _copy[(1,)](x, y, 1024, BLOCK=1024)
    sync()
    c0 = time.thread_time()
    for _ in range(calls):
        _copy[(1,)](x, y, 1024, BLOCK=1024)
    launch = (time.thread_time() - c0) / calls * 1e6
    sync()
    c0 = time.thread_time()
    for _ in range(calls):
        torch.empty(1024, device="cuda")
    empty = (time.thread_time() - c0) / calls * 1e6
    print(f"launch floor: triton kernel[grid](...) {launch:.1f} us, torch.empty {empty:.1f} us")


def torch_floor(W, features, calls=200):
    """Host ms of the same training step (zero_grad, forward, sum, backward) around one
    ``nn.Linear`` on the same input: what torch itself costs per step (the autograd engine,
    two GEMM launches, the accumulation), eager and through torch's own
    ``make_graphed_callables`` (a replay in an ``autograd.Function``, as hector's warm
    calls are): the floor under a warm hector step's host time."""
    lin = torch.nn.Linear(features, features).to(W.device)
    x = W.x(features).detach().clone().requires_grad_(True)
    res = {}
    graphed = torch.cuda.make_graphed_callables(lin, (x,)) if x.is_cuda else None
    for name, mod in (("torch Linear", lin), ("torch graphed Linear", graphed)):
        if mod is None:
            continue
        step = _step(mod, x, True, lin)
        for _ in range(5):
            step()
        sync()
        c0 = time.process_time()
        for _ in range(calls):
            step()
        res[f"{name} train"] = dict(host_ms=(time.process_time() - c0) / calls * 1e3,
                                    wall_ms=float("nan"), kernels=0, kernel_ms=float("nan"))
        sync()
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--datasets", default="synthetic:cora")
    p.add_argument("--layers", default="gat,agnn,transformer,rgcn,rgat,hgt")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--root", default=None)
    p.add_argument("--json")
    p.add_argument("--cprofile")
    p.add_argument("--pyg", action="store_true")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--launch-floor", action="store_true")
    p.add_argument("--torch-floor", action="store_true",
                   help="also torch's own step around one Linear, eager and graphed")
    a = p.parse_args()
    if a.launch_floor and torch.cuda.is_available():
        launch_floor()
    from hector.bench import suites
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    res, rows = {}, []
    for ds in a.datasets.split(","):
        root = None
        if a.root and not ds.startswith("synthetic:"):
            root = str(Path(a.root) / ds)
        W = suites.Workload(ds, dev, root=root)
        if a.torch_floor:
            r = torch_floor(W, a.features, a.calls)
            res[f"torch {ds}"] = r
            rows += [("torch", ds, k, v) for k, v in r.items()]
        for layer in a.layers.split(","):
            if layer in suites.RELATIONAL and W.graph.num_relations < 2:
                continue
            heads = 1 if layer == "agnn" else a.heads
            r = probe(layer, W, a.features, heads, a.calls, a.pyg, a.cprofile)
            res[f"{layer} {ds}"] = r
            rows += [(layer, ds, k, v) for k, v in r.items()]
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
    print(f"{'layer':12} {'dataset':22} {'peer/mode':14} {'host ms':>8} {'wall ms':>8} "
          f"{'kernels':>8} {'kernel ms':>9}")
    for layer, ds, k, v in rows:
        print(f"{layer:12} {ds:22} {k:14} {v['host_ms']:8.3f} {v['wall_ms']:8.3f} "
              f"{v['kernels']:8d} {v['kernel_ms']:9.3f}")


if __name__ == "__main__":
    main()
