"""A two-layer GAT on Cora trained with a captured step: forward, loss, backward and the Adam
update recorded once as a CUDA graph (``hector.train.capture_step``) and replayed per epoch.

    python examples/capture_step.py [--root ../shared/data/cora] [--epochs 200]

CUDA only.  Input and attention dropout are both captured: their random numbers come from
torch's CUDA generator (the attention kernels read their seed from a device tensor drawn by
it), which advances on every replay, so each step drops a fresh mask.
"""
import argparse
import time

import torch
import torch.nn.functional as F

from hector import Graph, datasets
from hector.nn import GATConv
from hector.train import capture_step

p = argparse.ArgumentParser()
p.add_argument("--root", default="../shared/data/cora")
p.add_argument("--epochs", type=int, default=200)
args = p.parse_args()
if not torch.cuda.is_available():
    raise SystemExit("capture_step needs CUDA")

torch.manual_seed(0)
data = datasets.load("cora", root=args.root).to("cuda")
x = data.x / data.x.sum(1, keepdim=True).clamp(min=1)
graph = Graph(data.edge_index, num_nodes=data.num_nodes)     # prebuilt: no lookups per step


class GAT(torch.nn.Module):
    def __init__(self, fin, classes, hidden=8, heads=8, p=0.6):
        super().__init__()
        self.p = p
        self.conv1 = GATConv(fin, hidden, heads=heads, dropout=p)
        self.conv2 = GATConv(hidden * heads, classes, heads=1, concat=False, dropout=p)

    def forward(self, x, graph):
        x = F.elu(self.conv1(F.dropout(x, self.p, self.training), graph))
        return self.conv2(F.dropout(x, self.p, self.training), graph)


model = GAT(x.shape[1], data.num_classes).cuda()
opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4, capturable=True)
train_idx, y = data.train_idx, data.y.long()
step = capture_step(model, opt, lambda out: F.cross_entropy(out[train_idx], y[train_idx]),
                    x, graph)
torch.cuda.synchronize()
t0 = time.perf_counter()
for epoch in range(1, args.epochs + 1):
    loss = step()
torch.cuda.synchronize()
print(f"{args.epochs} captured steps: {(time.perf_counter() - t0) / args.epochs * 1e3:.3f} ms "
      f"per step, last loss {loss.item():.4f}")
model.eval()
with torch.no_grad():
    pred = model(x, graph).argmax(-1)
print(f"test_acc {(pred[data.test_idx] == y[data.test_idx]).float().mean().item():.4f}")
