"""Choose RGAT/HGT defaults for the RDF family on validation data only.

AIFB (like the other RDF sets) has no validation split, so this script holds out a fixed,
stratified 20% of the *training* nodes (per class, chosen with a generator seeded 0, the same
for every run and every training seed), trains on the remaining 80% exactly as ``hector
train`` does (Adam, full batch, the model after the last epoch), and scores each
configuration by its mean validation accuracy over seeds 0-2.  The test split is never read.

    PYTHONPATH=src python scripts/tune_rdf.py --model rgat --data-root ../shared/data \
        --stage 1 [--base '{"lr": 0.01}'] [--json out.json]

Stage 1 crosses the first layer (embedding / rgcn) and weight decay (other settings: the
current defaults, or ``--base``); stage 2 crosses hidden, heads and dropout around ``--base`` (the best stage-1 setting).  Every setting is
scored after each of ``--epochs`` epochs (snapshots of one run per seed).
One line per configuration is printed, then the table sorted by mean validation accuracy.
"""
import argparse
import itertools
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from hector import datasets
from hector.train.defaults import defaults
from hector.train.models import build

SEEDS = (0, 1, 2)
EPOCHS = (50, 100)


def validation_split(train_idx, y, frac=0.2, seed=0):
    """A fixed stratified split of ``train_idx`` into (fit, val); independent of run seeds."""
    g = torch.Generator().manual_seed(seed)
    fit, val = [], []
    for c in torch.unique(y[train_idx]).tolist():
        idx = train_idx[y[train_idx] == c]
        idx = idx[torch.randperm(idx.numel(), generator=g)]
        k = max(1, round(frac * idx.numel()))
        val.append(idx[:k])
        fit.append(idx[k:])
    return torch.cat(fit).sort().values, torch.cat(val).sort().values


def run_one(model, data, cfg, fit_idx, val_idx, seed, snapshots):
    """Validation accuracy after each epoch count in ``snapshots`` (one training run: without
    a schedule, the model after epoch k does not depend on the total number of epochs)."""
    torch.manual_seed(seed)
    net = build(model, data, cfg, backend="torch")
    opt = torch.optim.Adam(net.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    y = data.y.long()
    out = {}
    for epoch in range(1, max(snapshots) + 1):
        net.train()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(None, data.edge_index, data.edge_type)[fit_idx], y[fit_idx])
        loss.backward()
        opt.step()
        if epoch in snapshots:
            net.eval()
            with torch.no_grad():
                logits = net(None, data.edge_index, data.edge_type)
            out[epoch] = float((logits[val_idx].argmax(-1) == y[val_idx]).float().mean())
    return out


def grid(stage, model, base):
    """Settings other than epochs; every setting is scored at each of ``EPOCHS``."""
    if stage == 1:
        axes = dict(first_layer=["embedding", "rgcn"], weight_decay=[0.0, 5e-4])
    else:
        axes = dict(hidden=[16, 32], heads=[1, 2, 4] if model == "rgat" else [1, 2, 4],
                    dropout=[0.0, 0.2])
    for values in itertools.product(*axes.values()):
        yield {**base, **dict(zip(axes, values))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=("rgat", "hgt"))
    p.add_argument("--dataset", default="aifb")
    p.add_argument("--data-root", default="../shared/data")
    p.add_argument("--stage", type=int, default=1, choices=(1, 2))
    p.add_argument("--base", default="{}", help="JSON settings fixed for this stage")
    p.add_argument("--epochs", default=",".join(map(str, EPOCHS)),
                   help="epoch counts to score (comma list)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    torch.set_flush_denormal(True)   # as hector train does
    data = datasets.load(a.dataset, root=f"{a.data_root}/{a.dataset}")
    assert data.x is None, "the RDF family is featureless"
    y = data.y.long()
    fit_idx, val_idx = validation_split(data.train_idx, y)
    print(f"{a.dataset}: fit {fit_idx.numel()} / val {val_idx.numel()} of "
          f"{data.train_idx.numel()} training nodes", flush=True)
    rows = []
    for over in grid(a.stage, a.model, json.loads(a.base)):
        cfg = {**defaults(a.model, a.dataset), **over}
        t0 = time.perf_counter()
        snaps = [int(e) for e in a.epochs.split(",")]
        per_seed = [run_one(a.model, data, cfg, fit_idx, val_idx, s, snaps) for s in SEEDS]
        for e in snaps:
            accs = [r[e] for r in per_seed]
            row = dict(over={**over, "epochs": e}, val=accs, mean=statistics.mean(accs))
            rows.append(row)
            print(f"{json.dumps(row['over'])}  val {' / '.join(f'{100 * v:.1f}' for v in accs)}"
                  f"  mean {100 * row['mean']:.1f}", flush=True)
        print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    print("\n| setting | val acc seeds 0/1/2 | mean |\n|---|---|---:|")
    for r in sorted(rows, key=lambda r: -r["mean"]):
        print(f"| {json.dumps(r['over'])} | {' / '.join(f'{100 * v:.1f}' for v in r['val'])} "
              f"| {100 * r['mean']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
