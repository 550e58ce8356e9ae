"""The DF-GNN strategy suite on a GPU: node- vs edge-parallel vs auto for GAT, AGNN and
Transformer layers, against PyG, on citation graphs, batches of small graphs, super-node
graphs and the large synthetic profiles.

    python scripts/attention_suite.py [--graphs cora,github-musae,...] [--out results.json]

For each (graph, layer, F x H) it measures inference (forward under no_grad) and training
(forward + backward) with CUDA events through triton.testing.do_bench (median), and the peak
memory of one training step; PyG runs the same layer with parameters copied (an OOM is
recorded as such).  Prints one table row per case and writes everything as JSON.
"""
import argparse
import json
import time
from pathlib import Path

import torch

from hector import datasets
from hector.graph import Graph
from hector.nn import AGNNConv, GATConv, TransformerConv

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def suite_graphs(names):
    for name in names:
        t0 = time.perf_counter()
        if name.startswith("batch:"):          # many small molecule-like graphs
            count = int(name.split(":")[1])
            gen = torch.Generator().manual_seed(0)
            graphs = []
            for _ in range(count):
                n = int(torch.randint(10, 40, (1,), generator=gen))
                e = 2 * n
                ei = torch.randint(0, n, (2, e), generator=gen)
                graphs.append(Graph(torch.cat([ei, ei.flip(0)], 1), num_nodes=n))
            g = Graph.batch(graphs).to("cuda")   # built on the CPU: thousands of tiny builds
        elif name.startswith("synthetic:"):
            d = datasets.load(name, device="cuda")
            g = Graph(d.edge_index, num_nodes=d.num_nodes)
        else:
            d = datasets.load(name, root=DATA / name)
            g = Graph(d.edge_index.cuda(), num_nodes=d.num_nodes)
        torch.cuda.synchronize()
        yield name, g, time.perf_counter() - t0


def make(kind, f, h, strategy=None):
    """hector layer (strategy given) or PyG layer (strategy None), seeded identically."""
    import torch_geometric.nn as pyg
    torch.manual_seed(0)
    if kind == "gat":
        ref = pyg.GATConv(f * h, f, heads=h, add_self_loops=False)
    elif kind == "agnn":
        ref = pyg.AGNNConv(add_self_loops=False)
    else:
        ref = pyg.TransformerConv(f * h, f, heads=h)
    ref = ref.cuda()
    if strategy is None:
        return ref
    cls = {"gat": GATConv, "agnn": AGNNConv, "transformer": TransformerConv}[kind]
    return cls.from_pyg(ref, strategy=strategy, backend="triton")


def measure(layer, x, graph_arg):
    """(inference ms, training ms, peak training MiB) or an 'OOM' marker."""
    from triton.testing import do_bench
    try:
        with torch.no_grad():
            t_inf = do_bench(lambda: layer(x, graph_arg), warmup=25, rep=100, return_mode="median")
        xg = x.detach().requires_grad_()

        def step():
            layer.zero_grad(set_to_none=True)
            layer(xg, graph_arg).sum().backward()
        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        t_train = do_bench(step, warmup=25, rep=100, return_mode="median")
        return {"inference_ms": t_inf, "training_ms": t_train, "peak_train_MiB": peak}
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"oom": True}


def op_inputs(kind, g, f, h):
    """The attention op's inputs for each layer kind (what the layer feeds it)."""
    n = g.num_nodes
    rnd = lambda *shape: torch.randn(*shape, device="cuda", requires_grad=True)  # noqa: E731
    if kind == "gat":
        return dict(v=rnd(n, h, f), a_src=rnd(n, h), a_dst=rnd(n, h), negative_slope=0.2)
    if kind == "agnn":
        return dict(v=rnd(n, 1, f), q=rnd(n, 1, f), k=rnd(n, 1, f))
    return dict(v=rnd(n, h, f), q=rnd(n, h, f), k=rnd(n, h, f), scale=f ** -0.5)


def time_op(g, inputs, strategy, train):
    """Median ms of the attention op alone, replayed from a CUDA graph (no host overhead);
    falls back to plain events when capture is impossible.  Returns (ms, method)."""
    from triton.testing import do_bench, do_bench_cudagraph
    from hector.kernels.attention.op import edge_attention
    tensors = [t for t in inputs.values() if isinstance(t, torch.Tensor)]

    def fn():
        out = edge_attention(g, strategy=strategy, backend="triton", **inputs)
        if train:
            torch.autograd.grad(out, tensors, torch.ones_like(out))
    fn()
    try:
        return do_bench_cudagraph(fn, rep=100, return_mode="median"), "cudagraph"
    except Exception:                                            # capture not possible
        torch.cuda.synchronize()
        return do_bench(fn, warmup=25, rep=100, return_mode="median"), "events"


def strategy_times(g, kind, f, h, rounds=3):
    """{strategy: {inference_ms, training_ms}}: the three strategies measured in interleaved
    rounds (min over rounds of each median), so clock or host drift hits all alike."""
    inputs = op_inputs(kind, g, f, h)
    best = {s: {"inference_ms": float("inf"), "training_ms": float("inf")}
            for s in ("node", "edge", "auto")}
    method = None
    for _ in range(rounds):
        for s in best:
            for train, key in ((False, "inference_ms"), (True, "training_ms")):
                ms, method = time_op(g, inputs, s, train)
                best[s][key] = min(best[s][key], ms)
    for s in best:
        best[s]["method"] = method
    return best


def fmt(r, key):
    return "OOM" if r.get("oom") else f"{r[key]:.3f}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--graphs", default="cora,amazon-computers,github-musae,synthetic:pubmed,"
                   "synthetic:arxiv,batch:4000,synthetic:proteins,synthetic:reddit")
    p.add_argument("--kinds", default="gat,agnn,transformer")
    p.add_argument("--out", default="attention_suite.json")
    p.add_argument("--no-pyg", action="store_true")
    p.add_argument("--sizes", default="128x1,64x4", help="features x heads cases")
    args = p.parse_args()
    rows = []
    print("op: the attention op alone (CUDA-graph replay); layer: the whole hector layer "
          "(strategy auto) and PyG's, with events; times in ms")
    print(f"{'graph':22s} {'layer':11s} {'FxH':6s} {'auto':5s} | "
          f"{'op node inf/train':>17s} {'op edge inf/train':>17s} {'op auto inf/train':>17s} | "
          f"{'layer inf/train':>17s} {'PyG inf/train':>17s} | mem MiB ours/PyG")
    for name, g, t_build in suite_graphs(args.graphs.split(",")):
        for kind in args.kinds.split(","):
            for f, h in [tuple(map(int, c.split("x"))) for c in args.sizes.split(",")]:
                if kind == "agnn" and h != 1:
                    continue                       # AGNN has one head by definition
                width = f * h
                x = torch.randn(g.num_nodes, width, device="cuda")
                res = strategy_times(g, kind, f, h)
                res["layer"] = measure(make(kind, f, h, "auto"), x, g)
                if not args.no_pyg:
                    ei = g.input_edge_index()
                    res["pyg"] = measure(make(kind, f, h), x, ei)
                    del ei
                from hector.device import num_sms
                from hector.kernels.attention.plan import choose_strategy
                chosen, why = choose_strategy(g.in_degree, g.num_edges, num_sms(g.device), h)
                row = dict(graph=name, nodes=g.num_nodes, edges=g.num_edges, build_s=t_build,
                           max_degree=g.in_degree.max, kind=kind, f=f, heads=h, auto_choice=chosen,
                           reason=why, **{f"{k}": v for k, v in res.items()})
                rows.append(row)
                pyg = res.get("pyg", {"oom": True})
                print(f"{name:22s} {kind:11s} {f}x{h:<4d} {chosen:5s} | "
                      + " ".join(f"{fmt(res[s], 'inference_ms'):>8s}/{fmt(res[s], 'training_ms'):<8s}"
                                 for s in ("node", "edge", "auto"))
                      + f" | {fmt(res['layer'], 'inference_ms'):>8s}/{fmt(res['layer'], 'training_ms'):<8s}"
                      + f" {fmt(pyg, 'inference_ms'):>8s}/{fmt(pyg, 'training_ms'):<8s} | "
                      f"{fmt(res['layer'], 'peak_train_MiB')}/{fmt(pyg, 'peak_train_MiB')}",
                      flush=True)
                Path(args.out).write_text(json.dumps(rows, indent=1))
                del x
                torch.cuda.empty_cache()
        del g
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
