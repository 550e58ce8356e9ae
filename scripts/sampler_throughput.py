"""Neighbour-sampling throughput of ``hector.loader.NeighborLoader`` on synthetic graphs.

    python scripts/sampler_throughput.py [--device cuda] [--scale 1.0] [--profiles mag,products]
                                         [--fanout 25,20] [--batch-size 1024] [--batches 20]
                                         [--threads N] [--pyg]

For each profile (default: ``mag``, heterogeneous; ``products``, homogeneous) it builds the
graph on the device, then times ``--batches`` batches of ``--batch-size`` seeds (one warm-up
batch first), twice: sampling and relabelling only (``sample_hop`` + ``relabel``), and whole
batches (plus building each block's ``Graph``).  Prints one table row per profile: sampled
edges per batch, milliseconds per batch both ways, and sampled edges per second of whole
batches.  Default scale: 1.0 on CUDA, 0.05 on a CPU (the full graphs take minutes to generate
there).
"""
import argparse
import time

import torch

from hector.datasets import synthetic
from hector.loader import NeighborLoader, relabel, sample_hop


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats):
    fn()                         # warm-up: allocator, CUDA context, first kernels
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    sync(device)
    return (time.perf_counter() - t0) / repeats, out


def measure(profile, device, scale, fanouts, batch_size, batches, pyg=False):
    data = synthetic.load(profile, device=device, scale=scale)
    graph = data.graph
    seeds = (data.node_type_names[0] if data.node_type_names else None)
    if pyg and graph.num_relations > 1:     # PyG's fan-outs are per relation: ours too
        fanouts = [{r: f for r in range(graph.num_relations)} for f in fanouts]
    loader = NeighborLoader(graph, fanouts, input_nodes=seeds, batch_size=batch_size,
                            shuffle=True, seed=0)
    batches = min(batches, len(loader))
    seed_ids = loader.seeds[torch.randperm(loader.seeds.numel(), device=device)]
    chunks = [seed_ids[i * batch_size:(i + 1) * batch_size] for i in range(batches)]
    chunk_iter = iter(range(10 ** 9))

    def sample_only():
        dst, edges = chunks[next(chunk_iter) % batches], 0
        for f in loader.fanouts:
            src, pos, rel = sample_hop(loader.index, dst, f, loader.generator)
            dst = relabel(loader.index, dst, src)[0]
            edges += src.numel()
        return edges

    def whole_batch():
        batch = loader.sample(chunks[next(chunk_iter) % batches])
        return sum(b.num_edges for b in batch.blocks)

    t_sample, _ = timed(sample_only, device, batches)
    t_batch, edges = timed(whole_batch, device, batches)
    out = dict(profile=profile, nodes=graph.num_nodes, edges=graph.num_edges,
               relations=graph.num_relations, edges_per_batch=edges,
               ms_sample=1e3 * t_sample, ms_batch=1e3 * t_batch,
               edges_per_s=edges / t_batch)
    if pyg:
        out["pyg"] = measure_pyg(data, [c.cpu() for c in chunks],
                                 [f if isinstance(f, int) else f[0] for f in fanouts])
    return out


def measure_pyg(data, chunks, fanouts):
    """PyG's NeighborLoader on ``data``'s graph (on the CPU), one batch per seed chunk:
    (ms per batch, sampled edges per batch)."""
    from torch_geometric.data import Data, HeteroData
    from torch_geometric.loader import NeighborLoader as PygLoader
    g = data.graph.to("cpu")
    ei, et = g.input_edge_index(), g.input_edge_type()
    if g.num_relations == 1:
        pdata, seeds = Data(edge_index=ei, num_nodes=g.num_nodes), None
    else:
        # node types as PyG's HeteroData wants them: per-type local ids
        pdata, types, ptr = HeteroData(), g.node_type_names, g.host_ptr["node"]
        local = torch.empty(g.num_nodes, dtype=torch.long)
        order = torch.cat([g.nodes_of_type(t) for t in range(len(types))])
        local[order] = torch.cat([torch.arange(ptr[t + 1] - ptr[t]) for t in range(len(types))])
        for t, name in enumerate(types):
            pdata[name].num_nodes = ptr[t + 1] - ptr[t]
        for r, (s, rel, d) in enumerate(g.relation_names):
            pdata[s, rel, d].edge_index = local[ei[:, et == r]]
        seeds = types[0]
        chunks = [local[c] for c in chunks]
    # One loader over every chunk's seeds in order (its set-up, a CSC of the whole graph,
    # once), read batch by batch: each batch is the same seeds as ours.
    seed_ids = torch.cat(chunks)
    loader = PygLoader(pdata, num_neighbors=fanouts, batch_size=chunks[0].numel(),
                       input_nodes=seed_ids if seeds is None else (seeds, seed_ids))
    batches = iter(loader)
    next(batches)                       # warm-up, as ``timed`` gives ours

    def edges_of(batch):
        return (batch.edge_index.shape[1] if seeds is None else
                sum(batch[e].edge_index.shape[1] for e in batch.edge_types))
    t0 = time.perf_counter()
    edges = [edges_of(b) for b in batches]
    t = (time.perf_counter() - t0) / max(len(edges), 1)
    edges = edges[-1] if edges else 0
    return 1e3 * t, edges


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--scale", type=float, default=None)
    p.add_argument("--profiles", default="mag,products")
    p.add_argument("--fanout", default="25,20")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (on a busy machine 1 is faster: torch.sort's "
                        "parallel path stalls when the cores are shared)")
    p.add_argument("--pyg", action="store_true",
                   help="also time PyG's NeighborLoader (needs pyg-lib or torch-sparse)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    scale = args.scale if args.scale is not None else (1.0 if device.type == "cuda" else 0.05)
    fanouts = [int(f) for f in args.fanout.split(",")]
    print(f"device={device} scale={scale} fanout={fanouts} batch_size={args.batch_size} "
          f"threads={torch.get_num_threads()}")
    head = ("profile", "nodes", "edges", "R", "edges/batch", "ms sample", "ms batch",
            "edges/s") + (("PyG edges/batch", "PyG ms batch", "PyG edges/s") if args.pyg else ())
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for profile in args.profiles.split(","):
        r = measure(profile, device, scale, fanouts, args.batch_size, args.batches, args.pyg)
        pyg = ""
        if args.pyg:
            ms, edges = r["pyg"]
            pyg = f" {edges:,} | {ms:.1f} | {edges / ms / 1e3:.2f} M |"
        print(f"| {r['profile']} | {r['nodes']:,} | {r['edges']:,} | {r['relations']} | "
              f"{r['edges_per_batch']:,} | {r['ms_sample']:.1f} | {r['ms_batch']:.1f} | "
              f"{r['edges_per_s'] / 1e6:.2f} M |" + pyg)


if __name__ == "__main__":
    main()
