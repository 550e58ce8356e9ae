"""Time ``Graph`` construction on a synthetic profile (default: mag, 1.9M nodes, 21M edges).

    python scripts/time_graph_build.py [--profile mag] [--device cuda] [--repeats 5]

Prints generation time, then the median of ``--repeats`` builds after one warm-up build
(the warm-up pays CUDA context and allocator start-up), and the graph's memory.
"""
import argparse
import statistics
import time

import torch

from hector import Graph
from hector.datasets import synthetic


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--profile", default="mag")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--scale", type=float, default=1.0)
    args = p.parse_args()
    device = torch.device(args.device)
    t0 = time.perf_counter()
    data = synthetic.load(args.profile, device=device, scale=args.scale)
    sync(device)
    t_gen = time.perf_counter() - t0

    def build():
        return Graph(data.edge_index, edge_type=data.edge_type, num_nodes=data.num_nodes,
                     num_relations=data.num_relations, node_type=data.node_type,
                     num_node_types=len(data.node_type_names or [None]))
    build()
    times = []
    for _ in range(args.repeats):
        sync(device)
        t0 = time.perf_counter()
        g = build()
        sync(device)
        times.append(time.perf_counter() - t0)
    print(f"profile={args.profile} device={device} nodes={g.num_nodes:,} edges={g.num_edges:,} "
          f"relations={g.num_relations} generate={t_gen:.2f}s build_median={statistics.median(times):.3f}s "
          f"build_min={min(times):.3f}s graph_MiB={g.nbytes() / 2**20:.0f} "
          f"max_in_degree={g.in_degree.max:,} super_nodes={g.in_degree.num_super}")


if __name__ == "__main__":
    main()
