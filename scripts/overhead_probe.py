"""Where a small-graph layer call spends its time on CUDA: host time per call (Python and
launches, no sync), device time per call (CUDA events over many back-to-back calls), and the
kernels launched per call (torch.profiler).  Small graphs are launch-bound; this says by how
much.

    python scripts/overhead_probe.py --dataset synthetic:cora --features 128 --heads 1
"""
import argparse
import json
import time

import torch


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def probe(layer_name, W, features, heads, calls=200):
    from hector.bench import suites
    ref = suites.pyg_layer(layer_name, W, features, heads)
    backend = "triton" if W.device.type == "cuda" else "torch"
    ours = suites.hector_layer(layer_name, ref, backend).to(W.device)
    x = W.x(features)
    out = {}
    for name, mod, pyg in (("hector", ours, False), ("PyG", ref, True)):
        call = suites.caller(layer_name, mod, W, pyg)
        for train in (False, True):
            xg = x.detach().clone().requires_grad_(train)

            def step():
                if train:
                    call(xg).sum().backward()
                else:
                    with torch.no_grad():
                        call(xg)
            for _ in range(5):
                step()
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                step()
            host = (time.perf_counter() - t0) / calls * 1e3
            sync()
            wall = (time.perf_counter() - t0) / calls * 1e3
            acts = [torch.profiler.ProfilerActivity.CUDA if torch.cuda.is_available()
                    else torch.profiler.ProfilerActivity.CPU]
            with torch.profiler.profile(activities=acts) as prof:
                step()
                sync()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            gpu_us = sum(e.device_time for e in kernels)
            out[f"{name} {'train' if train else 'infer'}"] = dict(
                host_ms=host, wall_ms=wall, kernels=len(kernels), kernel_ms=gpu_us / 1e3)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="synthetic:cora")
    p.add_argument("--layers", default="gat,agnn,transformer,rgcn,rgat,hgt")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--json")
    p.add_argument("--calls", type=int, default=200)
    a = p.parse_args()
    from hector.bench import suites
    W = suites.Workload(a.dataset, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    res = {}
    print(f"{'layer':12} {'peer/mode':16} {'host ms':>8} {'wall ms':>8} {'kernels':>8} {'kernel ms':>9}")
    for layer in a.layers.split(","):
        heads = 1 if layer == "agnn" else a.heads
        res[layer] = probe(layer, W, a.features, heads, a.calls)
        for k, v in res[layer].items():
            print(f"{layer:12} {k:16} {v['host_ms']:8.3f} {v['wall_ms']:8.3f} {v['kernels']:8d} "
                  f"{v['kernel_ms']:9.3f}")
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
