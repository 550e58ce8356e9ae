"""Which GPU kernels take a layer's time: torch.profiler's kernel table of one case's
inference and training step (forward, ``.sum()``, backward), hector's layer and optionally
PyG's, after a warm-up (plans, autotuning and caches built).

    python scripts/kernel_table.py agnn:synthetic:arxiv:128x1 gat:github-musae:64x4 \
        [--pyg] [--ops] [--captured] [--top 15] [--steps 5] [--data-root DATA]

A case is ``layer:dataset:FxH`` (the dataset may hold a colon: ``synthetic:arxiv``).  Prints,
per case and mode, the GPU time per step and the top kernels by total GPU time (calls per
step, microseconds per step); CUDA only.  ``--captured`` profiles hector's steps replayed from
CUDA graphs (``hector bench``'s captured peer) and prints their timed replay beside the
kernels' sum: the difference is what the replay spends between kernels.
"""
import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

from hector.bench import runner, suites, timing


def parse_case(text: str):
    layer, rest = text.split(":", 1)
    dataset, shape = rest.rsplit(":", 1)
    f, h = (int(v) for v in shape.lower().split("x"))
    return layer, dataset, f, h


def table(fn, steps: int, top: int, ops: bool = False) -> str:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    acts = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if ops else [])
    with profile(activities=acts, record_shapes=ops) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name[:90]
        t, n = rows.get(name, (0.0, 0))
        rows[name] = (t + e.device_time, n + 1)
    total = sum(t for t, _ in rows.values()) / steps
    lines = [f"  GPU {total / 1000:.3f} ms per step, {sum(n for _, n in rows.values()) / steps:.0f}"
             " kernels"]
    for name, (t, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {t / steps:9.1f} us {n / steps:5.1f}x  {name}")
    if ops:       # which torch ops launched them, with their input shapes
        lines.append(prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_device_time_total", row_limit=top, max_name_column_width=40,
            max_shapes_column_width=60))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cases", nargs="+")
    p.add_argument("--pyg", action="store_true", help="also PyG + torch.compile's table")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--ops", action="store_true",
                   help="also the torch ops by GPU time, with their input shapes")
    p.add_argument("--captured", action="store_true",
                   help="hector's steps replayed from CUDA graphs, with their timed replay")
    p.add_argument("--data-root", default=None)
    a = p.parse_args()
    dev = torch.device("cuda")
    for text in a.cases:
        layer, dataset, f, h = parse_case(text)
        root = (os.path.join(a.data_root, dataset)
                if a.data_root and not dataset.startswith("synthetic:") else None)
        W = suites.Workload(dataset, dev, root=root)
        x = W.x(f)
        xg = x.detach().clone().requires_grad_()
        ref = suites.pyg_layer(layer, W, f, h)
        mods = [("hector", suites.hector_layer(layer, ref, "triton").to(dev), False)]
        if a.pyg:
            mods.append(("PyG compile", torch.compile(ref), True))
        for name, mod, pyg in mods:
            call = suites.caller(layer, mod, W, pyg)

            def infer():
                with torch.no_grad():
                    call(x)

            def step():
                xg.grad = None
                call(xg).sum().backward()
            fns = (infer, step)
            if a.captured and not pyg:
                fns = runner.captured(infer, step, mod, xg)
            for mode, fn in zip(("inference", "training"), fns):
                print(f"== {text} {name} {mode}", flush=True)
                if a.captured and not pyg:
                    print(f"  replay {timing.timed(fn, dev, 50)['ms']:.4f} ms (timed)")
                print(table(fn, a.steps, a.top, a.ops), flush=True)


if __name__ == "__main__":
    main()
