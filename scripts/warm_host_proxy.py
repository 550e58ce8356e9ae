"""A CPU proxy for the host time of a warm, replayed layer step (no GPU needed).

On CUDA a warm hector layer call copies its inputs into a captured graph's buffers, replays
it inside an ``autograd.Function`` and hands out fresh outputs and gradients
(``hector.compiler.warm``).  Everything but the two ``replay()`` calls is host work that the
CPU runs the same way: the signature, the checks, ``Function.apply``, the copies and clones,
the autograd engine.  This script runs that path on the CPU, on a tiny graph (so that the
copies move no data to speak of), with the graphs' ``replay`` a no-op: what is left is the
warm path's own host cost, comparable between trees and against torch's own step around one
``nn.Linear`` (eager, and the same with a no-op ``Function`` around it).

    python scripts/warm_host_proxy.py [--layers gat,agnn,transformer,rgcn,rgat,hgt] \
        [--steps 2000] [--cprofile FILE]

Prints microseconds of CPU time per training step (zero_grad, forward, sum, backward) and per
inference call.  A proxy: a CUDA launch costs the host more than a CPU op on a few elements.
"""
import argparse
import contextlib
import cProfile
import pstats
import time

import torch

from hector.compiler import warm

from capture_after_use import step_of   # (scripts/ is on the path of a script run)


class _NoGraph:
    """A CUDA graph and stream stand-in: capture runs the code eagerly, replay does nothing."""
    def replay(self):
        pass

    def wait_stream(self, other):
        pass


def patch():
    """Let ``warm_call`` take CPU tensors: its own capture code runs, eagerly, inside
    stand-ins for CUDA graphs and streams, and the graphs replay nothing."""
    warm.DEVICE = "cpu"
    torch.cuda.is_available = lambda: True
    torch.cuda.is_current_stream_capturing = lambda: False
    torch.cuda.graph_pool_handle = lambda: None
    torch.cuda.Stream = torch.cuda.current_stream = torch.cuda.CUDAGraph = _NoGraph
    torch.cuda.stream = lambda _s: contextlib.nullcontext()
    torch.cuda.graph = lambda *_a, **_k: contextlib.nullcontext()


def tiny_workload():
    from hector.bench import suites
    # (a small relational graph: each step's copies move a few kilobytes)
    return suites.Workload("synthetic:aifb", torch.device("cpu"), scale=0.01)


def per_call(fn, steps):
    for _ in range(20):
        fn()
    c0 = time.process_time()
    for _ in range(steps):
        fn()
    return (time.process_time() - c0) / steps * 1e6


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, *params):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return (g.clone(),) + (None,) * (len(ctx.needs_input_grad) - 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="gat,agnn,transformer,rgcn,rgat,hgt")
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--cprofile", help="a cProfile of one layer's replayed steps, written here")
    p.add_argument("--cprofile-layer", default="gat")
    a = p.parse_args()
    torch.set_num_threads(1)
    from hector.bench import suites
    W = tiny_workload()
    F = a.features
    x = W.x(F).detach().clone().requires_grad_(True)
    rows = []
    lin = torch.nn.Linear(F, F)
    rows.append(("torch Linear", "train", per_call(step_of(lin, x, lin), a.steps)))
    fn = lambda t: _Identity.apply(lin(t), *lin.parameters())   # noqa: E731
    rows.append(("torch Linear + Function", "train", per_call(step_of(lin, x, fn), a.steps)))
    patch()
    for name in a.layers.split(","):
        ref = suites.pyg_layer(name, W, F, 1)
        ours = suites.hector_layer(name, ref, "torch")
        call = suites.caller(name, ours, W, False)
        step = step_of(ours, x, call)
        rows.append((name, "train", per_call(step, a.steps)))
        stats = warm.warm_stats(ours)
        assert stats["replayed"] > a.steps, (name, stats)       # (the proxy measured replays)

        def infer():
            with torch.no_grad():
                call(x)
        rows.append((name, "infer", per_call(infer, a.steps)))
        if a.cprofile and name == a.cprofile_layer:
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(500):
                step()
            pr.disable()
            with open(a.cprofile, "w") as f:
                pstats.Stats(pr, stream=f).sort_stats("tottime").print_stats(30)
    print(f"{'what':28} {'mode':6} {'host us':>8}")
    for what, mode, us in rows:
        print(f"{what:28} {mode:6} {us:8.1f}")


if __name__ == "__main__":
    main()
