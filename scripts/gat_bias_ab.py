"""A/B in one process (CUDA): GATConv's inference and training step, each captured in a CUDA
graph, with its output bias added by the attention kernels' epilogue (the current forward)
against the earlier broadcast add after the attention; median of 7 x 200 replays, in us.

    python scripts/gat_bias_ab.py [DATA_ROOT]     # DATA_ROOT holds cora/ (default .gpu/data)
"""
import statistics
import sys

import torch

import hector.nn.gat as gat
from hector.bench import runner, suites

EPILOGUE = gat.GATConv.forward


def add_after(self, x, edge_index, edge_attr=None):
    """The forward before the change: the attention without a bias, then a broadcast add."""
    bias, self.bias = self.bias, None
    try:
        out = EPILOGUE(self, x, edge_index, edge_attr)
    finally:
        self.bias = bias
    return out + bias


def per_call_us(fn, reps=200):
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def main():
    dev = torch.device("cuda")
    data = sys.argv[1] if len(sys.argv) > 1 else ".gpu/data"
    cases = (("cora", f"{data}/cora", 128, 1), ("cora", f"{data}/cora", 64, 4),
             ("synthetic:pubmed", None, 128, 1), ("synthetic:arxiv", None, 128, 1))
    for name, root, f, h in cases:
        W = suites.Workload(name, dev, root=root)
        x = W.x(f)
        xg = x.clone().requires_grad_()
        module = suites.hector_layer("gat", suites.pyg_layer("gat", W, f, h), "triton").to(dev)
        graph = W.homogeneous_graph()

        def infer():
            with torch.no_grad():
                module(x, graph)

        def step():
            module.zero_grad(set_to_none=True)
            xg.grad = None
            module(xg, graph).sum().backward()
        res = {}
        # each forward twice, interleaved: a configuration should agree with itself
        for label, forward in (("epilogue", EPILOGUE), ("add", add_after),
                               ("epilogue2", EPILOGUE), ("add2", add_after)):
            gat.GATConv.forward = forward
            try:
                replays = runner.captured(infer, step, module, xg)
            finally:
                gat.GATConv.forward = EPILOGUE
            res[label] = tuple(per_call_us(r) for r in replays)
        print(f"{name} {f}x{h}: " + "  ".join(f"{k} {a:.1f}/{b:.1f} us"
                                               for k, (a, b) in res.items()), flush=True)


if __name__ == "__main__":
    main()
