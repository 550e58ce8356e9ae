"""Train a two-layer RGCN (Schlichtkrull et al. 2018) for entity classification on AIFB.

    python examples/train_rgcn_aifb.py [--root ../shared/data/aifb] [--epochs 50]

AIFB has no node features: the first layer's input is one-hot (the identity), so its
per-relation weights are one row per node.  ``FeaturelessRGCN`` computes exactly
``RGCNConv(num_nodes, 16, R)(torch.eye(num_nodes), ...)`` without building the identity; the
second layer is hector's compiled ``RGCNConv``.  The settings are the RGCN paper's for AIFB
(no basis decomposition, no L2 penalty).  The same run through the
command line: ``hector train --model rgcn --dataset aifb``.
"""
import argparse
import time

import torch
import torch.nn.functional as F

from hector import datasets
from hector.nn import RGCNConv
from hector.train.models import FeaturelessRGCN

p = argparse.ArgumentParser()
p.add_argument("--root", default="../shared/data/aifb")
p.add_argument("--epochs", type=int, default=50)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

torch.manual_seed(args.seed)
torch.set_flush_denormal(True)
data = datasets.load("aifb", root=args.root)
R = data.num_relations
backend = "auto" if torch.cuda.is_available() else "torch"

conv1 = FeaturelessRGCN(data.num_nodes, 16, R)
conv2 = RGCNConv(16, data.num_classes, R, backend=backend)
params = list(conv1.parameters()) + list(conv2.parameters())
opt = torch.optim.Adam(params, lr=0.01, weight_decay=0.0)


def forward():
    h = F.relu(conv1(data.edge_index, data.edge_type))
    return conv2(h, data.edge_index, data.edge_type)


t0 = time.perf_counter()
for epoch in range(1, args.epochs + 1):
    opt.zero_grad()
    loss = F.cross_entropy(forward()[data.train_idx], data.y[data.train_idx])
    loss.backward()
    opt.step()
    if epoch % 10 == 0:
        print(f"epoch {epoch:3d}  loss {loss.item():.4f}")

with torch.no_grad():
    pred = forward().argmax(-1)
test = (pred[data.test_idx] == data.y[data.test_idx]).float().mean().item()
print(f"test_acc {test:.4f}  ({time.perf_counter() - t0:.1f} s)")
