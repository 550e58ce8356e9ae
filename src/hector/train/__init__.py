"""``hector train``: train a two-layer node classifier built on ``hector.nn`` layers.

``configure(parser)`` adds the options to an argparse parser; ``run(args)`` trains and prints
a progress bar (stderr), a log line every ``--log-every`` epochs and one final line
``RESULT model=... dataset=... test_acc=<fraction> ... epoch_time=<ms> step_time=<ms>
eval_time=<ms> captured=yes|no train_time_s=<s> total_time_s=<s>``
(a ``settings ...`` line first says what the run uses).  The per-(model,
dataset family) defaults live in :mod:`hector.train.defaults`; every option overrides them.
"""
from __future__ import annotations

import argparse

from .defaults import DEFAULTS, MODELS
from .capture import capture_step
from .captured import CapturedInference, CapturedStep
from .loop import DTYPES, IgnoredRelationsWarning, resolve_config, train

__all__ = ["configure", "run", "train", "train_processes", "capture_step", "CapturedStep",
           "CapturedInference", "DEFAULTS", "MODELS", "resolve_config", "IgnoredRelationsWarning"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=("node", "link"), default="node",
                   help="node: node classification (default); link: knowledge-graph link "
                        "prediction (rgcn, rgat or hgt encoder, --decoder; filtered MRR and "
                        "Hits@1/3/10 on a triples dataset)")
    p.add_argument("--model", required=True, help=f"one of {', '.join(MODELS)}")
    p.add_argument("--dataset", required=True,
                   help="a dataset name (aifb, mutag, cora, citeseer, pubmed, ...)")
    p.add_argument("--root", help="local folder holding the dataset's files (default: download "
                                  "into $HECTOR_DATA, ~/.cache/hector)")
    p.add_argument("--epochs", type=int, help="maximum epochs (default: per model and dataset)")
    p.add_argument("--lr", type=float, help="Adam learning rate")
    p.add_argument("--weight-decay", type=float, help="Adam weight decay (L2)")
    p.add_argument("--hidden", type=int, help="hidden width (per head)")
    p.add_argument("--heads", type=int, help="attention heads of the first layer")
    p.add_argument("--dropout", type=float, help="dropout on inputs (and attention)")
    p.add_argument("--patience", type=int,
                   help="early stopping: stop after this many epochs in a row in which "
                        "validation accuracy stays below its best and validation loss does not "
                        "reach a new low (needs a validation split); the best-accuracy model "
                        "is tested")
    p.add_argument("--decoder", choices=("distmult", "transe", "complex"),
                   help="--task link: the triple scorer (default distmult, R-GCN's)")
    p.add_argument("--negatives", type=int,
                   help="--task link: negatives per training triple (default 1), each its "
                        "head or tail replaced by another entity")
    p.add_argument("--reg", type=float,
                   help="--task link: L2 penalty on entity rows and relations (default 0.01)")
    p.add_argument("--eval-every", type=int,
                   help="--task link: epochs between validation MRR evaluations (default 50)")
    p.add_argument("--num-blocks", type=int,
                   help="--task link: block-diagonal relation weights of this many blocks "
                        "(rgcn, rgat; R-GCN's setting; it must divide --hidden)")
    p.add_argument("--clip", type=float,
                   help="--task link: clip the gradients' total norm to this (default 1.0, "
                        "as PyG's R-GCN example; 0: no clipping)")
    p.add_argument("--edge-dropout", type=float,
                   help="--task link: each epoch the encoder passes messages over a random "
                        "(1 - this) of the training triples, both directions (R-GCN's edge "
                        "dropout; default 0; evaluation uses them all)")
    p.add_argument("--lr-decay", type=float,
                   help="--task link: multiply the learning rate by this at every evaluation "
                        "without a new best validation MRR (default 1: never)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--dtype", default="fp32", choices=DTYPES,
                   help="fp32 (default) or bf16 (parameters and features in bf16, loss in fp32)")
    p.add_argument("--backend", choices=("auto", "torch", "triton"),
                   help="layer backend (default: torch on cpu, auto on cuda)")
    p.add_argument("--checkpoint", help="save model, optimizer, epoch and best state here "
                                        "after every epoch (--task link: every evaluation)")
    p.add_argument("--resume", help="continue from a checkpoint written by --checkpoint")
    p.add_argument("--batch-size", type=int,
                   help="train by mini-batches of this many seed nodes with sampled "
                        "neighbourhoods (hector.loader); default: full graph, unless it would "
                        "not fit on the device")
    p.add_argument("--fanout", default=None,
                   help="neighbours sampled per layer, first hop first (default 25,20; -1: "
                        "all); --task link: the encoder on sampled neighbourhoods of each "
                        "batch's entities")
    p.add_argument("--prefetch", type=int, default=None,
                   help="mini-batches: build this many batches ahead in a background thread "
                        "(hector.loader's prefetch; default 0).  Helps large batches on CUDA "
                        "(synthetic mag, batch 1024: 10-17%% shorter epochs on an H200); hurts "
                        "small, Python-bound ones (the two threads queue for the GIL)")
    p.add_argument("--devices", type=int, default=1,
                   help="processes (one per GPU; with --device cpu, gloo processes sharing the "
                        "CPU threads unless OMP_NUM_THREADS is set) training "
                        "with DistributedDataParallel, each on its share of the seeds; "
                        "implies mini-batches.  Under torchrun the group comes from torchrun")
    p.add_argument("--log-every", type=int, default=10,
                   help="log line interval (epochs); metrics are kept on the device and read "
                        "by the host (one sync) only at these points, where early stopping "
                        "is also noticed (the selection itself freezes on the device)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-capture", action="store_true",
                   help="on CUDA, run the training step and the evaluation eagerly instead "
                        "of replaying them as captured CUDA graphs (the default for every "
                        "model in full-graph fp32 training, and for mini-batches)")


def run(args: argparse.Namespace) -> int:
    import torch
    from . import distributed
    if getattr(args, "task", "node") == "link" and ((args.devices or 1) > 1
                                                    or distributed.under_torchrun()):
        raise ValueError("--task link runs in one process (drop --devices / torchrun)")
    if distributed.under_torchrun():
        distributed.init(torch.device(args.device))
    elif (args.devices or 1) > 1:
        resolve_config(args)          # bad options fail here, once, not in N processes
        distributed.spawn(_worker, args.devices, args)
        return 0
    try:
        train(args)
    finally:
        distributed.shutdown()
    return 0


def train_processes(args: argparse.Namespace, out=None) -> dict:
    """``train(args)`` in ``args.devices`` processes, spawned as ``hector train --devices N``
    spawns them (in this process with one device); rank 0's log is written to ``out`` (stdout) once all have finished, and its
    result returned (the dict ``train`` returns).  For scripts that need the result, which
    ``run`` does not hand back."""
    import json
    import os
    import sys
    import tempfile
    from . import distributed
    resolve_config(args)              # bad options fail here, once, not in N processes
    if (args.devices or 1) == 1:
        return train(args, out=out)
    with tempfile.TemporaryDirectory(prefix="hector-train-") as tmp:
        log, result = os.path.join(tmp, "rank0.log"), os.path.join(tmp, "rank0.json")
        distributed.spawn(_worker, args.devices, args, log, result)
        with open(log) as f:
            (out or sys.stdout).write(f.read())
        with open(result) as f:
            return json.load(f)


def _worker(rank: int, world: int, args: argparse.Namespace, log: str = None,
            result: str = None) -> None:
    """One of ``world`` processes; with ``log`` and ``result`` (file paths), rank 0 prints its
    log into ``log`` and saves its result as JSON in ``result`` (see ``train_processes``)."""
    import contextlib
    import json
    import torch
    from . import distributed
    device = torch.device(args.device)
    if device.type == "cpu":
        distributed.share_cpu(world)
    distributed.init(device, rank, world)
    try:
        with (open(log, "w") if log and rank == 0 else contextlib.nullcontext()) as out:
            r = train(args, out=out)
        if result and rank == 0:
            with open(result, "w") as f:
                json.dump(r, f)
    finally:
        distributed.shutdown()
