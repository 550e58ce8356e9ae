"""Link prediction, hector's R-GCN encoder against PyG's, in one process: the same entity
table, decoder (DistMult), loss, negatives and optimizer (``hector.train.linkpred.link_epoch``),
only the two RGCN layers differ.  Per encoder: ms per epoch (one full-graph step, median),
validation MRR every ``--eval-every`` epochs, and the time to reach ``--target`` MRR.

    python scripts/link_vs_pyg.py --dataset fb15k-237 --root DIR [--device cuda]
        [--epochs 3000] [--eval-every 250] [--hidden 200] [--target 0.2]
        [--encoders hector,pyg] [--negatives 1] [--edge-dropout 0]
        [--stop-at-target] [--max-seconds S]

``--stop-at-target`` ends an encoder's run at its first evaluation at or above the target,
``--max-seconds`` when its training time passes S: both let every encoder have its turn in
one bounded call.

PyG's peer is its ``RGCNConv`` (``torch_geometric.nn``), the layer its R-GCN link-prediction
example uses; both encoders are two layers over the training triples and their inverses
with a ReLU between, mean aggregation and a root weight, as ``hector train --task link
--model rgcn`` builds them.  Prints one line per evaluation and a table last.
"""
import argparse
import statistics
import time

import torch

from hector import Graph, datasets
from hector.nn import DistMult, RGCNConv
from hector.train.link import KnownTriples, link_metrics
from hector.train.linkpred import dropped_edges, link_epoch, whole_graph


class Encoder(torch.nn.Module):
    def __init__(self, kind, n, h, relations):
        super().__init__()
        self.embed = torch.nn.Embedding(n, h)
        torch.nn.init.xavier_uniform_(self.embed.weight)
        if kind == "pyg":
            import torch_geometric.nn as pyg
            self.convs = torch.nn.ModuleList(pyg.RGCNConv(h, h, relations) for _ in range(2))
        else:
            self.convs = torch.nn.ModuleList(RGCNConv(h, h, relations) for _ in range(2))
        self.kind = kind

    def forward(self, graph, edge_index, edge_type):
        x = self.embed.weight
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index, edge_type) if self.kind == "pyg" else conv(x, graph)
            if i == 0:
                x = torch.relu(x)
        return x


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="fb15k-237")
    p.add_argument("--root")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--epochs", type=int, default=3000)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--hidden", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--target", type=float, default=0.2)
    p.add_argument("--encoders", default="hector,pyg")
    p.add_argument("--negatives", type=int, default=1)
    p.add_argument("--edge-dropout", type=float, default=0.0,
                   help="each epoch the encoders over a random 1 - P of the triples")
    p.add_argument("--stop-at-target", action="store_true")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="end an encoder's run once its training time passes this")
    args = p.parse_args()
    device = torch.device(args.device)
    data = datasets.load(args.dataset, root=args.root)
    train, valid = (data.extra[f"{s}_triples"].long().to(device) for s in ("train", "valid"))
    n, r = data.num_nodes, int(data.num_relations)
    edge_index = torch.cat([train[[0, 2]], train[[2, 0]]], 1)
    edge_type = torch.cat([train[1], train[1] + r])
    graph = Graph(edge_index, edge_type=edge_type, num_nodes=n, num_relations=2 * r)
    known = KnownTriples(torch.cat([train, valid], 1), n, r)
    rows = []
    for kind in args.encoders.split(","):
        torch.manual_seed(0)
        enc = Encoder(kind, n, args.hidden, 2 * r).to(device)
        dec = DistMult(r, args.hidden).to(device)
        opt = torch.optim.Adam([*enc.parameters(), *dec.parameters()], lr=args.lr)
        gen = torch.Generator(device=device).manual_seed(0)
        times, reached, trained, best = [], None, 0.0, 0.0
        for epoch in range(1, args.epochs + 1):
            sync(device)
            t0 = time.perf_counter()
            enc.train()
            g, ei, et = graph, edge_index, edge_type
            if args.edge_dropout:        # (this epoch's encoder graph, the same for both)
                ei, et = dropped_edges(train, r, args.edge_dropout, gen)
                g = Graph(ei, edge_type=et, num_nodes=n, num_relations=2 * r)
            link_epoch(whole_graph(lambda: enc(g, ei, et)), dec, opt, train,
                       n, args.negatives, 0.01, train.shape[1], gen)
            sync(device)
            times.append(time.perf_counter() - t0)
            trained += times[-1]
            over = args.max_seconds is not None and trained > args.max_seconds
            if epoch % args.eval_every and not over:
                continue
            enc.eval()
            with torch.no_grad():
                mrr = link_metrics(enc(graph, edge_index, edge_type), dec, valid, known)["mrr"]
            best = max(best, mrr)
            print(f"{kind} epoch {epoch} val_mrr {mrr:.4f} training {trained:.1f}s", flush=True)
            if reached is None and mrr >= args.target:
                reached = trained
            if over or (reached is not None and args.stop_at_target):
                break
        rows.append((kind, 1e3 * statistics.median(times), best, reached))
    print(f"| encoder | ms per epoch | best val MRR | training s to MRR {args.target} |")
    print("|---|---|---|---|")
    for kind, ms, best, reached in rows:
        print(f"| {kind} | {ms:.2f} | {best:.4f} | "
              f"{'not reached' if reached is None else f'{reached:.1f}'} |")


if __name__ == "__main__":
    main()
