"""GPU time of each step of a compiled relational layer's forward and backward plans: which
step (not just which kernel) takes a training step's time.

    python scripts/step_table.py hgt:synthetic:mag:64x1 [--steps 3] [--top 25]

Each plan step runs between two CUDA events (the steps are synchronous to each other on one
stream, so the events time the step's kernels and torch ops); the table gives the median over
``--steps`` training steps after a warm-up, per step name in plan order.  CUDA only.
"""
import argparse
import statistics
from collections import defaultdict

import torch

from hector.bench import suites
from hector.compiler import execute


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", help="layer:dataset:FxH, as scripts/kernel_table.py")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    layer, rest = a.case.split(":", 1)
    dataset, shape = rest.rsplit(":", 1)
    f, h = (int(v) for v in shape.lower().split("x"))
    dev = torch.device("cuda")
    W = suites.Workload(dataset, dev)
    xg = W.x(f).detach().clone().requires_grad_()
    mod = suites.hector_layer(layer, suites.pyg_layer(layer, W, f, h), "triton").to(dev)
    call = suites.caller(layer, mod, W, False)

    def step():
        xg.grad = None
        call(xg).sum().backward()
    for _ in range(2):
        step()
    torch.cuda.synchronize()

    times = defaultdict(list)
    real = execute.run_step
    order = []

    def timed(s, args, ix, backend):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = real(s, args, ix, backend)
        end.record()
        key = (s.template, s.name, tuple(tuple(t.shape) for t in args
                                          if isinstance(t, torch.Tensor))[:3])
        if key not in times:
            order.append(key)
        times[key].append((start, end))
        return out
    execute.run_step = timed
    try:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    finally:
        execute.run_step = real
    rows = []
    for key in order:
        ms = [s.elapsed_time(e) for s, e in times[key]]
        per = len(ms) / a.steps
        rows.append((statistics.median(ms) * per, per, key))
    total = sum(r[0] for r in rows)
    print(f"{a.case}: {total:.3f} ms in plan steps per training step")
    for t, per, (template, name, shapes) in sorted(rows, key=lambda r: -r[0])[:a.top]:
        print(f"  {t:8.3f} ms {per:3.0f}x  {template:9s} {name[:60]:60s} {shapes}")


if __name__ == "__main__":
    main()
