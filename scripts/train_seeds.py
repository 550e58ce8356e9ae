"""Train (model, dataset) pairs over several seeds with ``hector train``'s loop and summarise
test accuracy (mean, std, per seed) and epoch time: the README's training table.

    python scripts/train_seeds.py --runs rgcn:aifb,gat:cora --seeds 0-4 \
        --data-root ../shared/data --device cpu --json out.json
    python scripts/train_seeds.py --runs rgcn:aifb --batch-size 32 --fanout 25,20 --devices 2

With ``--devices N`` each seed runs in N processes as ``hector train --devices N`` runs it
(gloo with --device cpu, NCCL on CUDA; DistributedDataParallel); rank 0's result counts.

Each run's full log goes to --log (default: discarded); one line per run is printed.
"""
import argparse
import io
import json
import statistics
import sys
import time

from hector.train import train_processes
from hector.train.minibatch import DEFAULT_FANOUT


def seeds_of(text: str):
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


def namespace(model, dataset, root, seed, device, dtype, batch_size=None, fanout=None,
              devices=1):
    return argparse.Namespace(batch_size=batch_size, fanout=fanout, devices=devices,
        model=model, dataset=dataset, root=root, seed=seed, device=device, dtype=dtype,
        backend=None, checkpoint=None, resume=None, log_every=50, no_progress=True,
        epochs=None, lr=None, weight_decay=None, hidden=None, heads=None, dropout=None,
        patience=None)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", required=True, help="comma list of model:dataset")
    p.add_argument("--seeds", default="0-4", help="e.g. 0-4 or 0,3,7")
    p.add_argument("--data-root", default="../shared/data")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--json", default=None)
    p.add_argument("--batch-size", type=int, default=None,
                   help="train by mini-batches (hector train --batch-size)")
    p.add_argument("--fanout", default=None, help="with --batch-size, e.g. 25,20")
    p.add_argument("--devices", type=int, default=1,
                   help="processes per run (hector train --devices N; implies mini-batches)")
    p.add_argument("--log", default=None, help="append every run's log here")
    a = p.parse_args(argv)
    summary = []
    log = open(a.log, "a") if a.log else None
    for item in a.runs.split(","):
        model, dataset = item.split(":")
        results = []
        for seed in seeds_of(a.seeds):
            buf = io.StringIO()
            t0 = time.perf_counter()
            root = None if dataset.startswith("synthetic:") else f"{a.data_root}/{dataset}"
            r = train_processes(namespace(model, dataset, root, seed, a.device, a.dtype,
                                          a.batch_size, a.fanout, a.devices), out=buf)
            if log:
                log.write(buf.getvalue())
                log.flush()
            results.append(r)
            print(f"{model} {dataset} seed {seed}: test_acc {r['test_acc']:.4f} epochs "
                  f"{r['epochs']} epoch_time {r['epoch_time'] * 1e3:.1f} ms total "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
        accs = [r["test_acc"] for r in results]
        summary.append(dict(model=model, dataset=dataset, device=a.device, dtype=a.dtype,
                            batch_size=a.batch_size, fanout=a.fanout, devices=a.devices,
                            seeds=seeds_of(a.seeds), test_acc=accs,
                            mean=statistics.mean(accs),
                            std=statistics.stdev(accs) if len(accs) > 1 else 0.0,
                            epoch_ms=statistics.median(r["epoch_time"] for r in results) * 1e3,
                            total_s=statistics.median(r["total_time"] for r in results),
                            runs=results))
    print("\n| model | dataset | device | devices | batch / fan-out | seeds | test acc per seed | "
          "mean ± std | epoch ms | run s |")
    print("|---|---|---|---:|---|---|---|---:|---:|---:|")
    for s in summary:
        # what ran: --devices > 1 implies mini-batches even without --batch-size
        used = s["runs"][0]["batch_size"]
        fanout = s["fanout"] or ",".join(map(str, DEFAULT_FANOUT))
        batch = f"{used} / {fanout}" if used else "full graph"
        print(f"| {s['model']} | {s['dataset']} | {s['device']} {s['dtype']} | "
              f"{s['devices']} | {batch} | {a.seeds} | "
              f"{' / '.join(f'{100 * v:.1f}' for v in s['test_acc'])} | "
              f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f} | {s['epoch_ms']:.1f} | "
              f"{s['total_s']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
