"""Train a two-layer GAT on Cora by mini-batches, each step replayed from one CUDA graph.

    python examples/captured_minibatch_gat.py [--root ../shared/data/cora] [--epochs 20]
                                              [--batch-size 64] [--fanout 10,10]
    python examples/captured_minibatch_gat.py --synthetic      # no download: synthetic Cora

``NeighborLoader(static=True)`` samples each batch into buffers of fixed shapes with no host
read, its blocks are capacity blocks (their sizes are those capacities), and
``hector.train.CapturedStep`` captures sampling, blocks, gathers, forward, loss, backward and
Adam once, then replays them for every batch: per batch the host copies the seeds in and
launches two graphs, the next batch's sampling and blocks overlapping this one's step.  On
the CPU the same step runs eagerly.  The same run through the
command line (captured by default on CUDA):
``hector train --model gat --dataset cora --batch-size 64 --fanout 10,10``.
"""
import argparse
import time

import torch
import torch.nn.functional as F

from hector import datasets
from hector.loader import NeighborLoader
from hector.nn import GATConv
from hector.train import CapturedStep

p = argparse.ArgumentParser()
p.add_argument("--root", default="../shared/data/cora")
p.add_argument("--synthetic", action="store_true", help="synthetic Cora (random labels)")
p.add_argument("--epochs", type=int, default=20)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--fanout", default="10,10")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
data = (datasets.load("synthetic:cora") if args.synthetic
        else datasets.load("cora", root=args.root)).to(device)


class GAT(torch.nn.Module):
    def __init__(self, f_in, classes, hidden=8, heads=8):
        super().__init__()
        self.conv1 = GATConv(f_in, hidden, heads=heads, dropout=0.6)
        self.conv2 = GATConv(hidden * heads, classes, heads=1, dropout=0.6)

    def forward(self, x, blocks, n_id=None):
        """``blocks``: a batch's two blocks (outermost first), or the whole graph twice."""
        h = F.elu(self.conv1(F.dropout(x, 0.6, self.training), blocks[0]))
        return self.conv2(F.dropout(h, 0.6, self.training), blocks[1])


torch.manual_seed(0)
model = GAT(data.x.shape[1], data.num_classes).to(device)
opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4,
                       capturable=device == "cuda")
loader = NeighborLoader(data.graph, [int(f) for f in args.fanout.split(",")],
                        input_nodes=data.train_idx, batch_size=args.batch_size, shuffle=True,
                        seed=0, static=True)
step = CapturedStep(model, opt, loader, data.x, data.y)
t0 = time.perf_counter()
for epoch in range(args.epochs):
    model.train()
    for seeds, count in step.seed_batches():
        loss = step.step(seeds, count)
seconds = time.perf_counter() - t0
model.eval()
with torch.no_grad():
    pred = model(data.x, [data.graph, data.graph]).argmax(1)
acc = (pred[data.test_idx] == data.y[data.test_idx]).float().mean().item()
print(f"{args.epochs} epochs of {len(loader)} batches in {seconds:.2f} s on {device} "
      f"({step.replays} replays, {step.eager_steps} eager steps); test accuracy {acc:.4f}")
