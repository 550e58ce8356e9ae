"""Eager training steps of the optimised and the unoptimised plan of one relational layer,
timed in one process in alternating rounds (the suite times its peers minutes apart, and on
small graphs an eager step is host time, which drifts between runs), with an optional
cProfile of each.

    python scripts/eager_plans_ab.py --profile mutag --layer rgcn|rgat|hgt [--rounds 4]
                                     [--steps 50] [--features 64] [--cprofile]

The layers, their inputs and their calls are the bench's (``hector.bench.suites``).

Prints ms per eager forward + backward step (``--inference``: forward) for each round and
variant, the medians, and optimised / unoptimised.
"""
import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

from hector.bench import suites


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="mutag", help="synthetic profile (default mutag)")
    p.add_argument("--layer", default="rgcn", choices=list(suites.RELATIONAL))
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--inference", action="store_true",
                   help="time forwards under no_grad instead of training steps")
    p.add_argument("--cprofile", action="store_true", help="print each variant's top calls")
    a = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = "triton" if device.type == "cuda" else "torch"
    W = suites.Workload("synthetic:" + a.profile, device)
    x = W.x(a.features).detach().clone().requires_grad_()
    variants = {}
    for name, switches in (("optimised", {}), ("unoptimised", suites.UNOPTIMISED)):
        m = suites.own_layer(a.layer, W, a.features, 1, backend, **switches)
        variants[name] = (m, suites.caller(a.layer, m, W, False))

    def step(variant):
        m, call = variant
        if a.inference:
            with torch.no_grad():
                call(x)
            return
        m.zero_grad(set_to_none=True)
        x.grad = None
        call(x).sum().backward()

    def timed(variant) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(a.steps):
            step(variant)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t) / a.steps * 1e3

    for variant in variants.values():    # plans, kernels, autotune picks built
        for _ in range(5):
            step(variant)
    times = {k: [] for k in variants}
    for r in range(a.rounds):
        order = list(variants) if r % 2 == 0 else list(variants)[::-1]
        for k in order:
            times[k].append(timed(variants[k]))
        print(f"round {r}: " + ", ".join(f"{k} {times[k][-1]:.3f} ms" for k in variants))
    med = {k: statistics.median(v) for k, v in times.items()}
    what = "forward" if a.inference else "step"
    print(f"{a.layer} synthetic:{a.profile} F={a.features} on {device}: median ms per eager "
          f"{what}: optimised {med['optimised']:.3f}, unoptimised {med['unoptimised']:.3f}, "
          f"ratio {med['optimised'] / med['unoptimised']:.2f}")
    if a.cprofile:
        for k, variant in variants.items():
            pr = cProfile.Profile()
            pr.enable()
            timed(variant)
            pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
            print(f"== {k}\n{s.getvalue()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
