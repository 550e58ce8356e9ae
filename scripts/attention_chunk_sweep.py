"""Attention schedule sweep on homogeneous graphs: each traversal kernel (forward,
destination-side and source-side backward) timed under node-parallel and edge-parallel
schedules of several edge tiles, warps and chunk sizes, against the plan the strategy rule
makes (autotuned, as a layer runs it).  CUDA only; fp32.

    python scripts/attention_chunk_sweep.py arxiv,github-musae,amazon-computers [--data-root DIR]

Names are attention-suite graphs: a synthetic profile (``arxiv``) or a real graph folder
under ``--data-root`` (``amazon-computers``, ``github-musae``, ``cora``).  Head shapes: GAT
(four heads of 16, one of 128) and Transformer (the same, with q.k).  Prints, per graph and
head shape, the rule's times and the four fastest configurations of each kernel.  Session 10
ran it on the H200 (docs/perf-notes.md, "Session 10"); its output is
docs/data/attention-chunk-sweep-session10-h200.log.
"""
import argparse
import itertools
import time
from dataclasses import replace

import torch

from hector.bench import suites
from hector.kernels.attention.launch import attention_backward, attention_forward
from hector.kernels.attention.plan import AttentionPlan, make_plan
from hector.kernels.attention.spec import AttentionSpec

#: name: (heads, dim_qk, dim_v, q.k term, source term, destination term, leaky slope)
SPECS = {"gat4x16": (4, 0, 16, False, True, True, 0.2),
         "gat1x128": (1, 0, 128, False, True, True, 0.2),
         "tf1x128": (1, 128, 128, True, False, False, None),
         "tf4x16": (4, 16, 16, True, False, False, None)}
TILES = [(4, 1), (8, 1), (16, 1), (16, 2), (32, 2), (32, 4)]     # (edge tile, warps)
CHUNKS = [64, 128, 256, 512, 1024]
REAL = ("cora", "amazon-computers", "github-musae")


def sweep(g, name, sname, cfg, dev, bench):
    H, DK, DV, qk, has_src, has_dst, slope = cfg
    n, E = g.num_nodes, g.num_edges
    spec = AttentionSpec(H, DK, DV, qk, has_src, has_dst, slope, False, torch.float32)
    v = torch.randn(n, H, DV, device=dev)
    q = torch.randn(n, H, DK, device=dev) if qk else None
    k = torch.randn_like(q) if qk else None
    a_s = torch.randn(n, H, device=dev) if has_src else None
    a_d = torch.randn(n, H, device=dev) if has_dst else None
    dout = torch.randn_like(v)
    params = (1.0 / max(DK, 1) ** 0.5, slope, 0.0, 0)
    needs_dst, needs_src = (False, qk, False, False, has_dst), (True, False, qk, has_src, False)
    rule = make_plan(g, spec)
    out, lse = attention_forward(g, spec, rule, params, v, q, k, a_s, a_d)

    def timed(p):
        return (bench(lambda: attention_forward(g, spec, p, params, v, q, k, a_s, a_d)),
                bench(lambda: attention_backward(g, spec, p, params, needs_dst, dout, v, q, k,
                                                 a_s, a_d, out, lse)),
                bench(lambda: attention_backward(g, spec, p, params, needs_src, dout, v, q, k,
                                                 a_s, a_d, out, lse)))
    base = timed(rule)
    rows = []
    for strategy in ("node", "edge"):
        for (be, nw), ch in itertools.product(TILES, CHUNKS if strategy == "edge" else [0]):
            s = replace(rule.dst, strategy=strategy, block_e=be, num_warps=nw, chunk=ch,
                        reason="")
            rows.append((timed(AttentionPlan(s, s)), strategy, be, nw, ch))
    gb = E * 4 * H * (DV + 2 * DK) / 1e9
    print(f"## {name} {sname}: gathered {gb:.2f} GB (floor {gb / 4.8:.3f} ms at 4.8 TB/s)")
    d, s = rule.dst, rule.src
    print(f"  rule (+tune): fwd {base[0]:.3f} dst {base[1]:.3f} src {base[2]:.3f}  (dst "
          f"{d.strategy} be{d.block_e} w{d.num_warps} ch{d.chunk}; src {s.strategy} "
          f"be{s.block_e} ch{s.chunk})")
    for i, what in enumerate(("fwd", "dst", "src")):
        best = sorted(rows, key=lambda r: r[0][i])[:4]
        print(f"  best {what}: " + "; ".join(f"{r[0][i]:.3f} {r[1]} be{r[2]} w{r[3]} ch{r[4]}"
                                             for r in best))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("datasets", help="comma-separated attention-suite graphs")
    p.add_argument("--data-root", default=".gpu/data", help="folder of the real graphs")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_chunk_sweep: needs CUDA (kernel timings)")
    from triton.testing import do_bench
    dev = torch.device("cuda")
    bench = lambda fn: do_bench(fn, warmup=3, rep=20)  # noqa: E731
    t0 = time.time()
    for ds in args.datasets.split(","):
        name = ds if ds in REAL else f"synthetic:{ds}"
        W = suites.Workload(name, dev, root=args.data_root if ds in REAL else None)
        g = W.homogeneous_graph()
        print(f"##### {ds}: nodes {g.num_nodes} edges {g.num_edges} in max {g.in_degree.max} "
              f"mean {g.in_degree.mean:.1f}; out max {g.out_degree.max}", flush=True)
        for sname, cfg in SPECS.items():
            sweep(g, ds, sname, cfg, dev, bench)
            print(f"  [{time.time() - t0:.0f} s]", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
