"""Train a two-layer GAT (Velickovic et al. 2018) on Cora with hector's GATConv.

    python examples/train_gat_cora.py [--root ../shared/data/cora] [--epochs 300]

The same run through the command line: ``hector train --model gat --dataset cora``.
"""
import argparse
import time

import torch
import torch.nn.functional as F

from hector import datasets
from hector.nn import GATConv

p = argparse.ArgumentParser()
p.add_argument("--root", default="../shared/data/cora")
p.add_argument("--epochs", type=int, default=300)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

torch.manual_seed(args.seed)
torch.set_flush_denormal(True)
data = datasets.load("cora", root=args.root)
x = data.x / data.x.sum(1, keepdim=True).clamp(min=1)      # row-normalised bag of words
backend = "auto" if torch.cuda.is_available() else "torch"


class GAT(torch.nn.Module):
    def __init__(self, fin, classes, hidden=8, heads=8, p=0.6):
        super().__init__()
        self.p = p
        self.conv1 = GATConv(fin, hidden, heads=heads, dropout=p, backend=backend)
        self.conv2 = GATConv(hidden * heads, classes, heads=1, concat=False, dropout=p,
                             backend=backend)

    def forward(self, x, edge_index):
        x = F.dropout(x, self.p, self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, self.p, self.training)
        return self.conv2(x, edge_index)


model = GAT(x.shape[1], data.num_classes)
opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
best_val, best_state, t0 = -1.0, None, time.perf_counter()
for epoch in range(1, args.epochs + 1):
    model.train()
    opt.zero_grad()
    loss = F.cross_entropy(model(x, data.edge_index)[data.train_idx], data.y[data.train_idx])
    loss.backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(x, data.edge_index).argmax(-1)
    val = (pred[data.val_idx] == data.y[data.val_idx]).float().mean().item()
    if val > best_val:
        best_val, best_state = val, {k: v.clone() for k, v in model.state_dict().items()}
    if epoch % 50 == 0:
        print(f"epoch {epoch:3d}  loss {loss.item():.4f}  val_acc {val:.4f}")

model.load_state_dict(best_state)
model.eval()
with torch.no_grad():
    pred = model(x, data.edge_index).argmax(-1)
test = (pred[data.test_idx] == data.y[data.test_idx]).float().mean().item()
print(f"best val_acc {best_val:.4f}  test_acc {test:.4f}  ({time.perf_counter() - t0:.1f} s)")
