"""Count and size the steps of a compiled relational layer's plans (no GPU needed).

``python scripts/backward_steps.py rgat synthetic:fb15k [scale]`` prints, for the layer with all
passes on and with reorder/compact/fuse off, every forward and backward step: its template,
what runs it on CUDA (a Triton kernel or torch ops), its output and input row kinds and
shapes, and the bytes it reads and writes (fp32, each operand once; index arrays left out),
with the row counts of the graph.  ``--loops`` adds the Python-loop iterations of steps that
run per relation / per node type with torch ops.
"""
from __future__ import annotations

import argparse
import sys

import torch


def step_rows(ix, v):
    from hector.compiler.ir import WEIGHT
    if v.kind == WEIGHT:
        return None
    return ix.rows[v.kind]


def numel(ix, v, weights):
    from hector.compiler.ir import WEIGHT
    n = 1
    for s in v.shape:
        n *= s
    if v.kind == WEIGHT:
        return n * weights.get(v.per, 1)
    return n * ix.rows[v.kind]


def runner(step):
    """What runs the step on CUDA (see compiler/execute.run_step)."""
    from hector.compiler.execute import triton_step
    return "triton" if triton_step(step) else "torch"


def describe(plan, ix, weights, title):
    total = 0
    lines = [f"-- {title}: {len(plan.steps)} steps"]
    for i, s in enumerate(plan.steps):
        nbytes = 4 * (sum(numel(ix, v, weights) for v in s.inputs) + numel(ix, s.output, weights))
        total += nbytes
        ins = ", ".join(f"{v.kind}{list(v.shape)}" for v in s.inputs)
        lines.append(f"[{i:2d}] {s.template:9s} {runner(s):6s} {s.name:42s} "
                     f"-> {s.output.kind}{list(s.output.shape)} <- {ins}  {nbytes / 2**20:8.1f} MiB")
    lines.append(f"   total {total / 2**20:.1f} MiB moved")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("layer", choices=("rgcn", "rgat", "hgt"))
    p.add_argument("dataset")
    p.add_argument("scale", type=float, nargs="?", default=None)
    p.add_argument("--features", type=int, default=64)
    args = p.parse_args(argv)
    from hector.bench.suites import UNOPTIMISED, Workload, hector_layer, pyg_layer
    from hector.compiler.steps_torch import GraphIndex
    W = Workload(args.dataset, torch.device("cpu"), scale=args.scale)
    ref = pyg_layer(args.layer, W, args.features, 1)
    g = W.hgt()["graph"] if args.layer == "hgt" else W.graph
    ix = GraphIndex.of(g)
    weights = {"relation": g.num_relations, "node_type": g.num_node_types}
    print(f"{args.dataset} scale={args.scale}: N={ix.rows['node']} E={ix.rows['edge']} "
          f"compact_src={ix.rows['compact_src']} compact_dst={ix.rows['compact_dst']} "
          f"R={g.num_relations} T={g.num_node_types}")
    for name, kw in (("all passes", {}), ("unopt", UNOPTIMISED)):
        m = hector_layer(args.layer, ref, "triton", **kw)
        cp = m.program.compiled_for(g)
        print(f"==== {args.layer} {name}")
        print(describe(cp.forward_plan, ix, weights, "forward"))
        print(describe(cp.backward_plan, ix, weights, "backward"))


if __name__ == "__main__":
    sys.exit(main())
