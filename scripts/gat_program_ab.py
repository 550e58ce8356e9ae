"""GAT two ways on one GPU, same parameters: ``hector.nn.GATConv`` (the attention op called
by hand) against ``hector.compile(models.gat)`` (the DSL program through the pipeline).
Captured forward (inference) and forward + backward (training), ms per replay, medians of
interleaved rounds (the bench's own capture and timing), plus
the largest output difference: what the layer would gain or lose by being built from the
program.

    python scripts/gat_program_ab.py [--datasets synthetic:cora,synthetic:arxiv] [--heads 1,4]
"""
from __future__ import annotations

import argparse

import torch

import hector
from hector.bench.runner import captured
from hector.bench.timing import interleaved
from hector.compiler import models
from hector.datasets import load
from hector.graph import with_self_loops
from hector.nn import GATConv


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", default="synthetic:cora,synthetic:arxiv")
    p.add_argument("--heads", default="1,4")
    p.add_argument("--features", type=int, default=64)
    a = p.parse_args()
    dev = torch.device("cuda")
    print("| graph | heads | stage | GATConv ms | program ms | program / GATConv | max diff |")
    print("|---|---|---|---|---|---|---|")
    for name in a.datasets.split(","):
        data = load(name)
        n, C = data.num_nodes, a.features
        ei = data.edge_index.to(dev)
        graph = with_self_loops(hector.Graph(ei, num_nodes=n))
        x = torch.randn(n, C, device=dev)
        for H in (int(h) for h in a.heads.split(",")):
            torch.manual_seed(0)
            layer = GATConv(C, C // H, heads=H).to(dev)
            prog = hector.compile(models.gat, in_dim=C, out_dim=C // H, heads=H).to(dev)
            with torch.no_grad():
                prog.lin.copy_(layer.lin.weight)        # (both stored [out, in])
                prog.att_src.copy_(layer.att_src.view(H, C // H, 1))
                prog.att_dst.copy_(layer.att_dst.view(H, C // H, 1))
                prog.bias.normal_()
                layer.bias.copy_(prog.bias)
            diff = (layer(x, graph) - prog(graph, x=x)).abs().max().item()
            xg = x.clone().requires_grad_()
            replays = {}
            for label, m, call in (("layer", layer, lambda t: layer(t, graph)),
                                   ("program", prog, lambda t: prog(graph, x=t))):
                def infer(call=call):
                    with torch.no_grad():
                        call(x)

                def step(call=call):
                    call(xg).sum().backward()
                replays[label] = captured(infer, step, m, xg)
            for i, stage in enumerate(("inference", "training")):
                st = interleaved({k: r[i] for k, r in replays.items()}, dev, 30)
                t0, t1 = st["layer"]["ms"], st["program"]["ms"]
                print(f"| {name} | {H} | {stage} | {t0:.3f} | {t1:.3f} | {t1 / t0:.2f} | "
                      f"{diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
