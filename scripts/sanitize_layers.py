"""Every hector layer's forward and backward on small graphs, for ``compute-sanitizer``
(CUDA): run under ``compute-sanitizer --tool memcheck`` to find invalid accesses and failed
API calls (a cudaMalloc that fails is reported even when its caller recovers).

    compute-sanitizer --tool memcheck --show-backtrace host \
        python scripts/sanitize_layers.py [--layers gat,agnn,transformer,rgcn,rgat,hgt] \
        [--datasets synthetic:cora,synthetic:aifb] [--steps 2] [--phase-marks]

``--phase-marks`` prints a line before each layer's phase (build, forward, backward), so a
sanitizer report can be placed in the run.  The bench suite's workloads and layers
(``hector.bench.suites``): the same layers, parameters and inputs ``hector bench`` times.
"""
import argparse

import torch

from hector.bench import suites


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="gat,agnn,transformer,rgcn,rgat,hgt")
    p.add_argument("--datasets", default="synthetic:cora,synthetic:aifb")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--phase-marks", action="store_true")
    p.add_argument("--device", default="cuda", help="cuda (default; cpu: the torch backend, "
                                                    "a smoke run of this script)")
    a = p.parse_args()
    dev = torch.device(a.device)
    backend = "triton" if dev.type == "cuda" else "torch"

    def mark(text):
        if a.phase_marks:
            print(f"[phase] {text}", flush=True)
    ran = 0
    for ds in a.datasets.split(","):
        W = suites.Workload(ds, dev)
        for layer in a.layers.split(","):
            if (layer in suites.RELATIONAL) != (W.graph.num_relations > 1):
                continue
            mark(f"{layer} {ds} build")
            ref = suites.pyg_layer(layer, W, a.features, 1)
            ours = suites.hector_layer(layer, ref, backend).to(dev)
            call = suites.caller(layer, ours, W, False)
            x = W.x(a.features).detach().clone().requires_grad_()
            for step in range(a.steps):
                mark(f"{layer} {ds} forward {step}")
                out = call(x)
                mark(f"{layer} {ds} backward {step}")
                out.float().pow(2).mean().backward()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            ran += 1
            print(f"{layer} {ds}: {a.steps} steps, output {tuple(out.shape)}", flush=True)
    print(f"done: {ran} layer-graph pairs")


if __name__ == "__main__":
    main()
