"""Train a two-layer RGCN on AIFB by mini-batches of sampled neighbourhoods.

    python examples/minibatch_rgcn.py [--root ../shared/data/aifb] [--epochs 10]
                                      [--batch-size 64] [--fanout 10,10]
    python examples/minibatch_rgcn.py --synthetic      # no download: synthetic AIFB

``NeighborLoader`` yields, per batch, one bipartite block per layer (outermost first) and the
global ids of the nodes they read (``batch.n_id``) and of the seeds (``batch.seed``).  Every
hector layer takes a block in place of ``edge_index`` and returns its destination rows, so a
layer's output is the next block's input.  AIFB has no node features: the first layer is
RGCN's one-hot layer (``FeaturelessRGCN``), which reads its weight rows of ``batch.n_id``.
The same run through the command line:
``hector train --model rgcn --dataset aifb --batch-size 64 --fanout 10,10``.
"""
import argparse
import time

import torch
import torch.nn.functional as F

from hector import datasets
from hector.loader import NeighborLoader
from hector.nn import RGCNConv
from hector.train.models import FeaturelessRGCN

p = argparse.ArgumentParser()
p.add_argument("--root", default="../shared/data/aifb")
p.add_argument("--synthetic", action="store_true", help="synthetic AIFB (random labels)")
p.add_argument("--epochs", type=int, default=10)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--fanout", default="10,10")
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

torch.manual_seed(args.seed)
data = (datasets.load("synthetic:aifb", seed=args.seed) if args.synthetic
        else datasets.load("aifb", root=args.root))
graph, R = data.graph, data.num_relations
backend = "auto" if torch.cuda.is_available() else "torch"
conv1 = FeaturelessRGCN(data.num_nodes, 16, R)
conv2 = RGCNConv(16, data.num_classes, R, backend=backend)
opt = torch.optim.Adam(list(conv1.parameters()) + list(conv2.parameters()), lr=0.01)
loader = NeighborLoader(graph, [int(f) for f in args.fanout.split(",")],
                        input_nodes=data.train_idx, batch_size=args.batch_size, shuffle=True,
                        seed=args.seed)

t0 = time.perf_counter()
for epoch in range(1, args.epochs + 1):
    for batch in loader:
        outer, inner = batch.blocks                       # outermost first
        h = F.relu(conv1.forward_block(outer, batch.n_id))  # [outer.num_dst_nodes, 16]
        logits = conv2(h, inner)                          # [batch.batch_size, classes]
        loss = F.cross_entropy(logits, data.y[batch.seed])
        opt.zero_grad()
        loss.backward()
        opt.step()
    if epoch % 5 == 0 or epoch == args.epochs:
        print(f"epoch {epoch:3d}  last batch loss {loss.item():.4f}")

with torch.no_grad():                                   # evaluation on the full graph
    h = F.relu(conv1(data.edge_index, data.edge_type))
    pred = conv2(h, graph).argmax(-1)
acc = (pred[data.test_idx] == data.y[data.test_idx]).float().mean().item()
print(f"test accuracy {acc:.4f}  ({time.perf_counter() - t0:.1f} s, {len(loader)} batches "
      f"per epoch)")
