"""Knowledge-graph link prediction with R-GCN (Schlichtkrull et al. 2018): a learned entity
table, two ``RGCNConv`` layers over the training triples and their inverses, a DistMult
decoder, negatives by corrupting heads or tails, and the filtered MRR and Hits@k.

    python examples/link_prediction.py [--root ../shared/data/fb15k-237] [--epochs 500]
                                       [--eval-every 100] [--hidden 200]
    python examples/link_prediction.py --synthetic     # no data: a small generated graph

Every step encodes every entity on the whole training graph and scores all training triples
and one negative each (R-GCN's full-batch setting; on FB15k-237 a step takes ~45 ms on an
H200).  Validation triples are ranked every ``--eval-every`` epochs (filtered by the training
and validation triples), the test triples once at the end (filtered by all three).  The same
run through the command line, with early stopping, checkpoints and sampled encoders:
``hector train --task link --model rgcn --dataset fb15k-237 --root ../shared/data/fb15k-237``.
"""
import argparse
import time

import torch
import torch.nn.functional as F

from hector import Graph, datasets
from hector.nn import DistMult, RGCNConv
from hector.train.link import KnownTriples, corrupt, link_metrics

p = argparse.ArgumentParser()
p.add_argument("--root", default="../shared/data/fb15k-237")
p.add_argument("--synthetic", action="store_true", help="a small generated knowledge graph")
p.add_argument("--epochs", type=int, default=500)
p.add_argument("--eval-every", type=int, default=100)
p.add_argument("--hidden", type=int, default=200)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()
torch.manual_seed(args.seed)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def synthetic_kg(n=300, r=6, per_relation=400, size=5):
    """Entities in groups of ``size``; relation ``k`` links group ``g`` to group ``g + k + 1``
    (modulo the groups' count): a structure an encoder can learn.  Split 80 / 10 / 10."""
    g = torch.Generator().manual_seed(args.seed)
    groups = n // size
    rel = torch.arange(r).repeat_interleave(per_relation)
    head = torch.randint(0, groups * size, (rel.numel(),), generator=g)
    tail = ((head // size + rel + 1) % groups) * size + torch.randint(0, size, (rel.numel(),),
                                                                      generator=g)
    triples = torch.unique(torch.stack([head, rel, tail]), dim=1)
    triples = triples[:, torch.randperm(triples.shape[1], generator=g)]
    k = triples.shape[1] // 10
    return n, r, triples[:, 2 * k:], triples[:, :k], triples[:, k:2 * k]


if args.synthetic:
    n, r, train, valid, test = synthetic_kg()
else:
    data = datasets.load("fb15k-237", root=args.root)
    n, r = data.num_nodes, int(data.num_relations)
    train, valid, test = (data.extra[f"{s}_triples"].long() for s in ("train", "valid", "test"))
train, valid, test = train.to(device), valid.to(device), test.to(device)

# The encoder's graph: each training triple and its inverse (relation r + R), as R-GCN.
graph = Graph(torch.cat([train[[0, 2]], train[[2, 0]]], 1),
              edge_type=torch.cat([train[1], train[1] + r]), num_nodes=n,
              num_relations=2 * r).to(device)
h = args.hidden
embed = torch.nn.Embedding(n, h).to(device)
torch.nn.init.xavier_uniform_(embed.weight)        # (unit rows make huge first scores)
conv1, conv2 = RGCNConv(h, h, 2 * r).to(device), RGCNConv(h, h, 2 * r).to(device)
decoder = DistMult(r, h).to(device)
params = [*embed.parameters(), *conv1.parameters(), *conv2.parameters(), *decoder.parameters()]
opt = torch.optim.Adam(params, lr=0.01)
gen = torch.Generator(device=device).manual_seed(args.seed)


def encode():
    return conv2(F.relu(conv1(embed.weight, graph)), graph)


known_valid = KnownTriples(torch.cat([train, valid], 1), n, r)
t0 = time.perf_counter()
for epoch in range(1, args.epochs + 1):
    neg = corrupt(train, n, k=1, generator=gen)
    entity = encode()
    pos_score = decoder(entity[train[0]], train[1], entity[train[2]])
    neg_score = decoder(entity[neg[0]], neg[1], entity[neg[2]])
    loss = F.binary_cross_entropy_with_logits(
        torch.cat([pos_score, neg_score]),
        torch.cat([torch.ones_like(pos_score), torch.zeros_like(neg_score)]))
    loss = loss + 0.01 * (entity.pow(2).mean() + decoder.rel.pow(2).mean())
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    if epoch % args.eval_every == 0 or epoch == args.epochs:
        with torch.no_grad():
            val = link_metrics(encode(), decoder, valid, known_valid)
        print(f"epoch {epoch:4d}  loss {loss.item():.4f}  valid mrr {val['mrr']:.4f}  "
              f"hits@10 {val['hits10']:.4f}")

with torch.no_grad():
    result = link_metrics(encode(), decoder, test, KnownTriples(torch.cat([train, valid, test],
                                                                          1), n, r))
print(f"test mrr {result['mrr']:.4f}  hits@1 {result['hits1']:.4f}  hits@3 "
      f"{result['hits3']:.4f}  hits@10 {result['hits10']:.4f}  "
      f"({time.perf_counter() - t0:.1f} s, {args.epochs} epochs)")
