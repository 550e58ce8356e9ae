"""A/B in one process (CUDA): GATConv's inference and training step, each captured in a CUDA
graph, with its output bias added by the attention kernels' epilogue (the current forward)
against the earlier broadcast add after the attention; median of 7 x 200 replays, in us.

    python scripts/gat_bias_ab.py [DATA_ROOT]     # DATA_ROOT holds cora/ (default .gpu/data)
"""
import statistics, sys, torch
from hector.bench import suites
import hector.nn.gat as gatmod

def old_forward(self, x, edge_index, edge_attr=None):
    # the pre-change path: attention without bias, then a broadcast add
    b = self.bias
    self.bias = None
    try:
        out = NEW(self, x, edge_index, edge_attr)
    finally:
        self.bias = b
    return out + b
NEW = gatmod.GATConv.forward

def timed(fn, reps=200):
    ts = []
    for _ in range(7):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(reps): fn()
        e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / reps)
    return statistics.median(ts)

dev = torch.device("cuda")
data = sys.argv[1] if len(sys.argv) > 1 else ".gpu/data"
for name, root, f, h in (("cora", f"{data}/cora", 128, 1), ("cora", f"{data}/cora", 64, 4),
                         ("synthetic:pubmed", None, 128, 1), ("synthetic:arxiv", None, 128, 1)):
    W = suites.Workload(name, dev, root=root)
    x = W.x(f); xg = x.clone().requires_grad_()
    ref = suites.pyg_layer("gat", W, f, h)
    m = suites.hector_layer("gat", ref, "triton").to(dev)
    g = W.homogeneous_graph()
    res = {}
    for label, fwd in (("epilogue", NEW), ("add", old_forward), ("epilogue2", NEW), ("add2", old_forward)):
        gatmod.GATConv.forward = fwd
        def infer():
            with torch.no_grad(): m(x, g)
        def step():
            m.zero_grad(set_to_none=True); xg.grad = None
            m(xg, g).sum().backward()
        side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3): infer(); step()
        torch.cuda.current_stream().wait_stream(side)
        gi, gs = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(gi): infer()
        m.zero_grad(set_to_none=True); xg.grad = None
        with torch.cuda.graph(gs): step()
        res[label] = (timed(gi.replay), timed(gs.replay))
    gatmod.GATConv.forward = NEW
    print(f"{name} {f}x{h}: " + "  ".join(f"{k} {a*1e3:.1f}/{b*1e3:.1f} us" for k, (a, b) in res.items()), flush=True)
