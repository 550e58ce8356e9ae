"""What is alive at the peak of one training step of a hector layer (CUDA).

    python scripts/memory_peak.py [--layer hgt] [--profile mag] [--features 64] [--heads 1]
                                  [--top 25]

(one layer as ``hector bench`` builds it: RGCN F -> F, RGAT with ``--heads`` heads of F //
heads, HGT with ``--heads`` heads)

Records the CUDA caching allocator's history (``torch.cuda.memory._record_memory_history``)
over one forward + backward after a warm-up step, replays the allocations and frees in
order, and prints the peak (bytes allocated above the step's start) and the tensors alive at
that moment, largest first, each with the innermost hector frames that allocated it.  This is
how a training step's memory peak is diagnosed: which values of the compiled plan, or which
kernel temporaries, make up a step's peak.
"""
import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batch_overhead import make_model  # noqa: E402

from hector.datasets import synthetic  # noqa: E402


def where(frames, depth=3) -> str:
    """The innermost ``depth`` frames inside hector (file:line function), innermost first."""
    mine = [f for f in frames if "/hector/" in f.get("filename", "")]
    return " <- ".join(f"{f['filename'].split('/hector/')[-1]}:{f['line']} {f['name']}"
                       for f in mine[:depth]) or "(outside hector)"


def replay(trace):
    """(peak bytes above the start, live blocks at the peak: addr -> (size, frames))."""
    live, now, peak, at_peak = {}, 0, 0, {}
    for e in trace:
        act = e["action"]
        if act == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            now += e["size"]
            if now > peak:
                peak, at_peak = now, dict(live)
        elif act in ("free_requested", "free"):
            if e["addr"] in live:
                now -= live.pop(e["addr"])[0]
    return peak, at_peak


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layer", default="hgt", choices=("rgcn", "rgat", "hgt"))
    p.add_argument("--profile", default="mag")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--steps", action="store_true",
                   help="also print the allocator's bytes after each plan step (and the "
                        "highest within it) beside the plan replay's, step by step")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("memory_peak.py needs CUDA")
    dev = torch.device("cuda")
    g = synthetic.load(args.profile, device=dev, scale=args.scale).graph
    if args.layer == "hgt":
        from hector.nn import HGTConv
        layer = HGTConv(args.features, args.features, (g.node_type_names, g.relation_names),
                        heads=args.heads).to(dev)
    elif args.layer == "rgat":
        from hector.nn import RGATConv
        layer = RGATConv(args.features, max(1, args.features // args.heads), g.num_relations,
                         heads=args.heads).to(dev)
    else:
        layer = make_model(args.layer, g, args.features, dev)[0][0]
    x = torch.randn(g.num_nodes, args.features, device=dev, requires_grad=True)

    def step():
        if args.layer == "hgt":
            ptr = g.host_ptr["node"]
            out = layer({t: x[ptr[i]:ptr[i + 1]] for i, t in enumerate(g.node_type_names)}, g)
            loss = sum(o.float().square().mean() for o in out.values())
        else:
            loss = layer(x, g).float().square().mean()
        loss.backward()
    step()                                   # warm-up: plans, kernels, index structures
    x.grad = None
    for prm in layer.parameters():
        prm.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    per_step = _per_step(start) if args.steps else None
    step()
    torch.cuda.synchronize()
    if per_step is not None:
        per_step.stop()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][dev.index or 0]
    peak, blocks = replay(trace)
    print(f"{args.layer} on synthetic {args.profile} (F={args.features}): step peak "
          f"{peak / 2**20:.0f} MiB above the start ({start / 2**20:.0f} MiB held before; "
          f"max_memory_allocated - start = "
          f"{(torch.cuda.max_memory_allocated() - start) / 2**20:.0f} MiB)")
    by_site = defaultdict(lambda: [0, 0])
    for size, frames in blocks.values():
        site = where(frames)
        by_site[site][0] += size
        by_site[site][1] += 1
    print("| MiB | tensors | allocated at (innermost hector frames) |")
    print("|---:|---:|---|")
    for site, (size, count) in sorted(by_site.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"| {size / 2**20:.0f} | {count} | {site} |")
    try:      # the plan replay's prediction (hector.compiler.memory; absent in older trees)
        from hector.compiler.memory import describe_peak
    except ImportError:
        return
    print("\nplan replay (values only, no kernel scratch):")
    entry = layer.program.compiled_for(g)
    print(describe_peak(entry, top=args.top))
    if per_step is not None:
        from hector.compiler.memory import simulate
        points, _ = simulate(entry)
        print("\n| step | allocator after (MiB) | highest within | replay live |")
        print("|---|---:|---:|---:|")
        for (name, after, high), pt in zip(per_step.rows, points):
            print(f"| {pt.phase[:3]} [{pt.index}] {name} | {after / 2**20:.0f} | "
                  f"{high / 2**20:.0f} | {pt.live / 2**20:.0f} |")


def _per_step(start: int):
    """Wrap the plan runner's step call: the allocator's bytes above ``start`` after each
    step and the highest during it (a sync per step: for diagnosis only)."""
    from hector.compiler import execute
    real = execute.run_step

    class Spy:
        def __init__(self):
            self.rows = []       # (step name, bytes after it, highest during it)

        def __call__(self, step, args, ix, backend):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            out = real(step, args, ix, backend)
            torch.cuda.synchronize()
            self.rows.append((step.name, torch.cuda.memory_allocated() - start,
                              torch.cuda.max_memory_allocated() - start))
            return out

        def stop(self):
            execute.run_step = real
    spy = Spy()
    execute.run_step = spy
    return spy


if __name__ == "__main__":
    main()
