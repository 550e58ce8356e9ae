"""The training loop behind ``hector train``: full-batch node classification."""
from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
import warnings
from typing import Optional

import torch
import torch.nn.functional as F

from .. import datasets
from ..checks import check_device_option, check_output_file
from ..loader import NeighborLoader
from . import checkpoint, distributed, memory, minibatch
from .capture import capture_graph, capture_step
from .captured import CapturedInference, CapturedStep
from .defaults import MODELS, defaults as model_defaults
from .linkpred import LINK_ONLY, train_link
from .models import build
from .selection import Selection, accuracy

DTYPES = ("fp32", "bf16")
_NO_MINIBATCH_RESUME = ("--resume with mini-batches (--batch-size, --devices) is not supported "
                        "yet: the loader's generators are not checkpointed")
_OVERRIDES = ("epochs", "lr", "weight_decay", "hidden", "heads", "dropout", "patience")
#: Models built on homogeneous layers: one edge set, one node set.
HOMOGENEOUS = ("gat", "agnn", "transformer")


class IgnoredRelationsWarning(UserWarning):
    """A homogeneous model (gat, agnn, transformer) trained on a graph with several relations
    or node types: it treats every edge and every node alike."""


def warn_if_relations_ignored(model: str, data) -> None:
    """Say so when ``model`` cannot see the relations or node types ``data`` has: the run is
    legitimate (a homogeneous baseline) but its accuracy is not that of a relational model."""
    types = len(data.node_type_names or ())
    if model not in HOMOGENEOUS or (data.num_relations <= 1 and types <= 1):
        return
    what = f"{data.num_relations} relations" + (f" and {types} node types" if types > 1 else "")
    warnings.warn(f"--model {model} is a homogeneous layer: it ignores the {what} of "
                  f"{data.name} and treats every edge alike (rgcn, rgat and hgt use them)",
                  IgnoredRelationsWarning, stacklevel=2)


def _check_positive(name: str, value, kind=int, allow_zero=False) -> None:
    ok = isinstance(value, kind) and (value >= 0 if allow_zero else value > 0)
    if kind is float:
        ok = isinstance(value, (int, float)) and math.isfinite(value) and (
            value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f"--{name.replace('_', '-')} must be "
                         f"{'>= 0' if allow_zero else '> 0'}, got {value!r}")


def resolve_config(args) -> dict:
    """Validate the options and merge them over the (model, dataset family) defaults."""
    model, dataset = args.model, args.dataset
    for key in LINK_ONLY:
        if getattr(args, key, None) is not None:
            raise ValueError(f"--{key.replace('_', '-')} applies to --task link only")
    if model not in MODELS:
        raise ValueError(f"--model must be one of {', '.join(MODELS)}, got {model!r}")
    key = str(dataset).lower().replace("_", "-")
    known = datasets.names()
    if not (key in known or key.startswith("synthetic:")):
        raise ValueError(f"--dataset: unknown dataset {dataset!r}; known: "
                         f"{', '.join(n for n in known if not n.startswith('synthetic:'))}, "
                         "or synthetic:<profile>")
    cfg = model_defaults(model, key)
    for name in _OVERRIDES:
        v = getattr(args, name, None)
        if v is not None:
            cfg[name] = v
    for name in ("epochs", "hidden", "heads"):
        _check_positive(name, cfg[name])
    if cfg["patience"] is not None:
        _check_positive("patience", cfg["patience"])
    _check_positive("lr", cfg["lr"], float)
    _check_positive("weight_decay", cfg["weight_decay"], float, allow_zero=True)
    if not (0.0 <= cfg["dropout"] < 1.0):
        raise ValueError(f"--dropout must be in [0, 1), got {cfg['dropout']!r}")
    dtype = getattr(args, "dtype", "fp32") or "fp32"
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    log_every = getattr(args, "log_every", 10)
    _check_positive("log_every", log_every)
    device = check_device_option(getattr(args, "device", "cpu") or "cpu")
    backend = getattr(args, "backend", None) or ("torch" if device.type == "cpu" else "auto")
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"--backend must be auto, torch or triton, got {backend!r}")
    batch_size = getattr(args, "batch_size", None)
    if batch_size is not None:
        _check_positive("batch_size", batch_size)
    fanout = getattr(args, "fanout", None)
    prefetch = getattr(args, "prefetch", None)
    if prefetch is None:
        prefetch = minibatch.DEFAULT_PREFETCH
    _check_positive("prefetch", prefetch, allow_zero=True)
    devices = getattr(args, "devices", None)
    devices = 1 if devices is None else devices
    _check_positive("devices", devices)
    if device.type == "cuda" and devices > torch.cuda.device_count() and not distributed.under_torchrun():
        raise ValueError(f"--devices {devices}: only {torch.cuda.device_count()} CUDA devices here")
    cfg.update(model=model, dataset=key, seed=int(getattr(args, "seed", 0) or 0), dtype=dtype,
               device=str(device), backend=backend, log_every=log_every, batch_size=batch_size,
               fanout=minibatch.parse_fanout(fanout if fanout is not None
                                             else minibatch.DEFAULT_FANOUT),
               devices=devices, prefetch=prefetch)
    return cfg


def settings_line(cfg: dict, root=None) -> str:
    """The run's settings, printed first, so a log says what produced it."""
    keys = ("model", "dataset", "epochs", "lr", "weight_decay", "hidden", "heads", "dropout",
            "patience", "num_bases", "first_layer", "dtype", "device", "backend", "seed")
    threads = f" cpu_threads={torch.get_num_threads()}" if cfg["device"] == "cpu" else ""
    batches = (f" batch_size={cfg['batch_size']} fanout={','.join(map(str, cfg['fanout']))}"
               f" devices={cfg['devices']} prefetch={cfg.get('prefetch', 0)}"
               if cfg.get("batch_size") or cfg.get("devices", 1) > 1 else "")
    return ("settings " + " ".join(f"{k}={cfg[k]}" for k in keys) + batches + threads
            + (f" root={root}" if root else ""))


def early_stop_message(epoch: int, bad_epochs: int, patience: int, best: dict,
                       loss_floor: float) -> str:
    """What patience counts: consecutive epochs in which validation accuracy stayed below its
    best and validation loss did not go below its lowest (either one resets the count; the
    best model, restored at the end, is the best-accuracy one)."""
    return (f"early stop at epoch {epoch}: {bad_epochs} epochs in a row ({epoch - bad_epochs + 1}"
            f"-{epoch}; --patience {patience}) without reaching the best validation accuracy ({best['val_acc']:.4f}, "
            f"model of epoch {best['epoch']}) or lowering the validation loss (lowest "
            f"{loss_floor:.4f}); testing the model of epoch {best['epoch']}")


def _autocast(cfg):
    # bf16 runs the model in bf16 (parameters and features cast, see ``train``) rather than
    # under torch.autocast: autocast leaves some per-layer products in fp32 next to bf16
    # linears, and hector's fused attention requires one dtype for all its inputs.
    return contextlib.nullcontext()


def _accuracy(logits, y, idx) -> float:
    return float(accuracy(logits, y, idx))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseClock:
    """When each epoch started, finished its step and ended: CUDA events on the GPU (recorded
    in stream order and read after a later sync, so timing adds no sync of its own),
    ``perf_counter`` on the CPU (where the ops are synchronous)."""

    def __init__(self, device, first_epoch: int):
        self.cuda, self.first = device.type == "cuda", first_epoch
        self.marks: list = []          # per epoch [start, step done, end]

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self):
        self.marks.append([self._now()])

    def mid(self):
        self.marks[-1].append(self._now())

    def end(self):
        self.marks[-1].append(self._now())

    def _between(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def epoch_seconds(self, epoch: int) -> float:
        """Start to end of ``epoch`` (its events must have completed)."""
        start, _, end = self.marks[epoch - self.first]
        return self._between(start, end)

    def seconds(self):
        """(epoch, step, eval) seconds per epoch after the first (call after a sync); an
        epoch runs from its start to the next one's, so host work between them counts."""
        m = self.marks
        epochs = [self._between(m[i][0], m[i + 1][0] if i + 1 < len(m) else m[i][2])
                  for i in range(len(m))]
        steps = [self._between(a, b) for a, b, _ in m]
        evals = [self._between(b, c) for _, b, c in m]
        return epochs[1:] or epochs, steps[1:] or steps, evals[1:] or evals


def make_optimizer(model: torch.nn.Module, cfg: dict, device: torch.device,
                   capture: bool = False) -> torch.optim.Adam:
    """``hector train``'s Adam: on CUDA torch's fused implementation (one kernel per
    parameter group instead of ~10 multi-tensor passes, which a featureless first layer's
    node tables make a large part of a mini-batch's time: docs/perf-notes.md),
    ``capturable`` when the step is captured (its step count lives on the device, and the
    fused kernel reads it there inside the graph).  ``capture`` counts on CUDA only (there is
    nothing to capture elsewhere, and torch's capturable Adam refuses CPU parameters)."""
    cuda = device.type == "cuda"
    return torch.optim.Adam(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                            capturable=capture and cuda, fused=True if cuda else None)


def train(args, out=None) -> dict:
    """Run one training as ``hector train`` does; print progress and the RESULT line to
    ``out`` (stdout); return the result as a dict."""
    # Tiny late-training gradients turn into denormals, which make CPU kernels ~7x slower.
    # Flushing them is a process-wide switch: on for this run only (torch's default is off).
    torch.set_flush_denormal(True)
    try:
        if getattr(args, "task", "node") == "link":
            return train_link(args, out)
        return _train(args, out)
    finally:
        torch.set_flush_denormal(False)


#: Models whose full-graph training step can be captured: all of them (each takes the
#: prebuilt Graph of ``Net.graph_of``; attention dropout draws its seed on the device).
CAPTURE_MODELS = MODELS
#: Models whose mini-batch step can be captured (one CUDA graph replayed per batch, on
#: capacity blocks): the attention layers on graphs of one node type and one relation, the
#: relational ones on any (relational capacity blocks: segment bounds on the device).
CAPTURE_MINIBATCH_MODELS = MODELS
#: Of those, the ones whose blocks must hold one node type and one relation.
ONE_RELATION_MODELS = ("gat", "agnn", "transformer")


def _capture_wanted(args, cfg, device, out, graph=None, world: int = 1) -> bool:
    """Capture the step on CUDA unless ``--no-capture``: the full-graph step, or with
    ``graph`` (the sampled graph) the mini-batch step.  Models or settings that cannot be
    captured yet train eagerly, with a note saying why."""
    if device.type != "cuda" or getattr(args, "no_capture", False):
        return False
    what, models = ("training step", CAPTURE_MODELS) if graph is None else (
        "mini-batch step", CAPTURE_MINIBATCH_MODELS)
    why = None
    if world > 1 and graph is None:
        why = f"--devices {world} (the full-graph step: one process only so far)"
    elif cfg["model"] not in models:
        why = f"model {cfg['model']} (capture supports {', '.join(models)})"
    elif graph is not None and cfg["model"] in ONE_RELATION_MODELS and (
            graph.num_node_types != 1 or graph.num_relations != 1):
        why = f"model {cfg['model']} on a graph of several node types or relations"
    elif cfg["dtype"] != "fp32":
        why = f"--dtype {cfg['dtype']}"
    if why:
        print(f"note: {what} not captured: {why}; --no-capture silences this", file=out)
        return False
    return True


def _train(args, out=None) -> dict:
    """Run one training as ``hector train`` does; print progress and the RESULT line to
    ``out`` (stdout); return the result as a dict."""
    from tqdm import tqdm

    out = out or sys.stdout
    t_start = time.perf_counter()
    cfg = resolve_config(args)
    device = torch.device(cfg["device"])
    ctx = distributed.context()
    if ctx.world > 1:
        if device.type == "cuda":
            device = torch.device("cuda", ctx.local_rank)
            cfg["device"] = str(device)
        if not ctx.main:          # one process reports
            out = open(os.devnull, "w")
    resume = getattr(args, "resume", None)
    if resume and (cfg["batch_size"] is not None or ctx.world > 1):
        raise ValueError(_NO_MINIBATCH_RESUME)
    # read and check the checkpoint before the (possibly slow) dataset load
    ck = checkpoint.load(resume, device, cfg) if resume else None
    if getattr(args, "checkpoint", None) and ctx.main:   # (the first save is an epoch away)
        check_output_file(args.checkpoint, "--checkpoint", create_folders=True)
    print(settings_line(cfg, getattr(args, "root", None)), file=out, flush=True)
    torch.manual_seed(cfg["seed"])
    if device.type == "cuda":
        torch.cuda.manual_seed_all(cfg["seed"])

    data = datasets.load(cfg["dataset"], root=getattr(args, "root", None)).to(device)
    if ctx.main:
        warn_if_relations_ignored(cfg["model"], data)
    if data.y is None or data.train_idx is None or data.test_idx is None or not data.num_classes:
        raise ValueError(f"--dataset {cfg['dataset']}: no node labels with train/test splits; "
                         "hector train does node classification only")
    y = data.y.long()
    train_idx, val_idx, test_idx = data.train_idx, data.val_idx, data.test_idx
    has_val = val_idx is not None and val_idx.numel() > 0
    x = None if data.x is None else data.x.float()
    if x is not None and cfg["normalize_features"] and bool((x >= 0).all()):
        # Row-normalise bag-of-words features, as the GAT/GCN papers (and PyG's
        # NormalizeFeatures) do for Planetoid.
        x = x / x.sum(1, keepdim=True).clamp(min=1e-12)
    edge_index, edge_type = data.edge_index, data.edge_type

    torch.manual_seed(cfg["seed"])
    model = build(cfg["model"], data, cfg, backend=cfg["backend"]).to(device)
    if cfg["dtype"] == "bf16":
        model = model.to(torch.bfloat16)
        x = None if x is None else x.to(torch.bfloat16)
    # Full-graph training reads one prebuilt Graph: no step looks a graph up in a cache (a
    # device read) or splits edges by relation; a captured step needs exactly that.
    graph = None
    # Mini-batches when asked for, with several processes, or when full-graph training
    # would not fit (then inference is sampled too): estimated from the layers' own plans
    # on the full graph before any step runs (hector.train.memory).
    sampled_eval = False
    if cfg["batch_size"] is None and ctx.world == 1:
        graph = model.graph_of(edge_index, edge_type, data.num_nodes)
        need = memory.full_graph_bytes(
            model, graph, 0 if x is None else int(x.shape[1]),
            cfg["hidden"] * max(cfg["heads"], 1))
        fits, free = minibatch.fits(need, device)
        if not fits:
            graph, cfg["batch_size"], sampled_eval = None, minibatch.DEFAULT_BATCH_SIZE, True
            print(f"full-graph training needs about {need / 2**30:.1f} GiB, more than "
                  f"{minibatch.HEADROOM:.0%} of the {free / 2**30:.1f} GiB free on {device}: "
                  f"training by mini-batches (--batch-size {cfg['batch_size']} --fanout "
                  f"{','.join(map(str, cfg['fanout']))}) with sampled inference", file=out)
    if cfg["batch_size"] is None:
        cfg["batch_size"] = minibatch.DEFAULT_BATCH_SIZE if ctx.world > 1 else None
    batch_capture = (cfg["batch_size"] is not None and _capture_wanted(
        args, cfg, device, out, data.graph, ctx.world))
    loader = None
    if cfg["batch_size"] is not None:
        try:
            loader = minibatch.make_loader(data.graph, train_idx, cfg, ctx.rank, ctx.world,
                                           static=batch_capture)
        except ValueError as err:       # static buffers that would not fit: eager batches
            if not batch_capture:
                raise
            print(f"note: mini-batch step not captured: {err}", file=out)
            batch_capture = False
            loader = minibatch.make_loader(data.graph, train_idx, cfg, ctx.rank, ctx.world)
    net = (distributed.wrap(model, device, unused_parameters=cfg["model"] == "rgat")
           if ctx.world > 1 else model)   # what trains
    if loader is None:
        edge_index, edge_type = (graph if graph is not None else
                                 model.graph_of(edge_index, edge_type, data.num_nodes)), None
    # CUDA-graph capture of the full-graph step (one process, no mini-batches).
    capture = loader is None and ctx.world == 1 and _capture_wanted(args, cfg, device, out)
    opt = make_optimizer(model, cfg, device, capture or batch_capture)
    # (blocks on capacities fitted to the batches seen: the worst case is mostly padding)
    batch_step = CapturedStep(net, opt, loader, x, y, fit=True) if batch_capture else None
    eval_nodes = torch.cat([i for i in (train_idx, val_idx, test_idx) if i is not None])
    # Sampled evaluation replays one graph per batch too when the training step does.
    sampled_infer = None
    if sampled_eval and batch_capture:
        try:
            sampled_infer = CapturedInference(model, NeighborLoader(
                data.graph, cfg["fanout"], input_nodes=eval_nodes, batch_size=cfg["batch_size"],
                seed=cfg["seed"], static=True), x, data.num_classes)
        except ValueError as err:       # static buffers that would not fit: eager batches
            print(f"note: sampled evaluation not captured: {err}", file=out)

    def predict():
        if sampled_infer is not None:
            return sampled_infer()
        if sampled_eval:
            return minibatch.predict_sampled(model, data.graph, x, eval_nodes, cfg,
                                             data.num_classes)
        return model(x, edge_index, edge_type).float()

    start_epoch, best = 1, None
    bad_epochs, loss_floor = 0, math.inf
    if ck is not None and loader is not None:    # switched to mini-batches above
        raise ValueError(_NO_MINIBATCH_RESUME)
    if ck is not None:
        start_epoch, best, bad_epochs, loss_floor = checkpoint.restore(ck, resume, model, opt)
        print(f"resumed from {resume} at epoch {ck['epoch']}", file=out)
    ckpt_path = getattr(args, "checkpoint", None) if ctx.main else None
    epochs, patience = cfg["epochs"], cfg["patience"]
    sel = Selection(model, y, train_idx, val_idx, epochs, patience, start_epoch, best,
                    bad_epochs, loss_floor)

    def save(epoch):
        checkpoint.save(ckpt_path, model=model.state_dict(), optimizer=opt.state_dict(),
                        epoch=epoch, best=sel.best(), bad_epochs=int(sel.bad),
                        loss_floor=float(sel.loss_floor), rng=torch.get_rng_state(),
                        config=dict(cfg))

    def evaluate(loss):
        net.eval()
        with torch.no_grad(), _autocast(cfg):
            logits = predict()
        sel.update(loss, logits)

    step = eval_graph = None
    if capture:
        model.train()
        step = capture_step(model, opt, lambda logits: F.cross_entropy(
            logits[train_idx].float(), y[train_idx]), x, edge_index)
        # The evaluation (forward, metrics, model selection) is a second graph reading the
        # step's loss: a steady-state epoch is two replays and no host sync.
        snap = sel.snapshot()
        eval_graph, _ = capture_graph(lambda: evaluate(step.loss), reset=lambda: sel.restore(snap))
    clock = PhaseClock(device, start_epoch)
    splits: dict = {}      # mini-batch epochs: seconds per phase (``BatchClock.seconds``)
    no_progress = getattr(args, "no_progress", False) or None
    last_epoch, stopped, logged = start_epoch - 1, False, start_epoch
    bar = tqdm(range(start_epoch, epochs + 1), desc=f"{cfg['model']}/{cfg['dataset']}",
               unit="epoch", file=sys.stderr, leave=False,
               disable=no_progress)
    t_train = time.perf_counter()
    for epoch in bar:
        clock.start()
        net.train()
        if loader is not None:
            bclock = minibatch.BatchClock(device)
            with tqdm(total=len(loader), desc=f"epoch {epoch}", unit="batch", file=sys.stderr,
                      leave=False, disable=no_progress) as batch_bar:
                loss = torch.tensor(
                    minibatch.captured_epoch(batch_step, bclock, batch_bar)
                    if batch_step is not None else
                    minibatch.train_epoch(net, opt, loader, x, y, bclock, batch_bar),
                    device=device)
            splits[epoch] = bclock.seconds()   # train_epoch's loss read was the sync
        elif step is not None:
            loss = step()
        else:
            opt.zero_grad(set_to_none=True)
            with _autocast(cfg):
                logits = model(x, edge_index, edge_type)
            loss = F.cross_entropy(logits[train_idx].float(), y[train_idx])
            loss.backward()
            opt.step()
        clock.mid()
        if eval_graph is not None:
            eval_graph.replay()
        else:
            evaluate(loss.detach())
        clock.end()
        last_epoch = epoch
        # The host looks at the recorded metrics only here (one sync): log lines, the
        # progress bar, early stopping, checkpoints.
        if ckpt_path or epoch % cfg["log_every"] == 0 or epoch == epochs or epoch == start_epoch:
            last_epoch, stopped = _report(sel, clock, logged, epoch, cfg, bar, out, splits)
            logged = epoch + 1
            if ckpt_path:
                save(last_epoch)
            if stopped:
                break
    bar.close()
    _sync(device)
    train_time = time.perf_counter() - t_train

    best = sel.best()
    if sel.has_val and best["state"] is not None:
        model.load_state_dict(best["state"])
    model.eval()
    with torch.no_grad(), _autocast(cfg):
        logits = predict()
    has_val = sel.has_val
    epoch_times, step_times, eval_times = clock.seconds()
    result = dict(model=cfg["model"], dataset=cfg["dataset"],
                  test_acc=_accuracy(logits, y, test_idx),
                  train_acc=_accuracy(logits, y, train_idx),
                  val_acc=_accuracy(logits, y, val_idx) if has_val else None,
                  best_epoch=best["epoch"] if has_val else last_epoch,
                  epochs=last_epoch, seed=cfg["seed"], device=cfg["device"], dtype=cfg["dtype"],
                  backend=cfg["backend"], train_time=train_time,
                  batch_size=cfg["batch_size"], devices=ctx.world,
                  # medians leave out the first epoch's one-off work (kernel compilation);
                  # an epoch runs from its start to the next one's (logging included)
                  epoch_time=_median(epoch_times),
                  # forward, loss, backward and optimizer step only
                  step_time=_median(step_times),
                  # the evaluation forward, metrics and model selection
                  eval_time=_median(eval_times),
                  captured=step is not None or batch_step is not None,
                  # batches that outgrew the fitted capacities (each ran eagerly)
                  capacity_growths=batch_step.grown if batch_step is not None else None,
                  # mini-batch epochs: ms per batch of each phase (median over the epochs
                  # after the first, which compiles kernels)
                  batch_ms=_batch_ms(splits),
                  total_time=time.perf_counter() - t_start)
    line = (f"RESULT model={result['model']} dataset={result['dataset']} "
            f"test_acc={result['test_acc']:.4f} train_acc={result['train_acc']:.4f} "
            + (f"val_acc={result['val_acc']:.4f} " if has_val else "")
            + f"best_epoch={result['best_epoch']} epochs={result['epochs']} seed={result['seed']} "
            f"device={result['device']} dtype={result['dtype']} backend={result['backend']} "
            + (f"batch_size={cfg['batch_size']} fanout={','.join(map(str, cfg['fanout']))} "
               f"devices={ctx.world} " if cfg["batch_size"] else "")
            + (f"epoch_time={result['epoch_time'] * 1e3:.3f}ms "
               f"step_time={result['step_time'] * 1e3:.3f}ms "
               f"eval_time={result['eval_time'] * 1e3:.3f}ms "
               f"captured={'yes' if result['captured'] else 'no'} " if epoch_times else "")
            + (f"capacity_growths={result['capacity_growths']} "
               if result["capacity_growths"] is not None else "")
            + "".join(f"{k}_ms={v:.3f} " for k, v in (result["batch_ms"] or {}).items())
            + f"train_time_s={result['train_time']:.2f} total_time_s={result['total_time']:.2f}")
    print(line, file=out, flush=True)
    return result


def _median(values):
    return statistics.median(values) if values else None


def _per_batch_ms(split: dict) -> dict:
    n = max(split["batches"], 1)
    return {k: 1e3 * split[k] / n for k in minibatch.BatchClock.PHASES}


def _batch_ms(splits: dict) -> Optional[dict]:
    """Median over the epochs after the first (all of them if only one) of each phase's
    ms per batch; None without mini-batch epochs."""
    if not splits:
        return None
    rows = [_per_batch_ms(splits[e]) for e in sorted(splits)]
    rows = rows[1:] or rows
    return {k: statistics.median(r[k] for r in rows) for k in minibatch.BatchClock.PHASES}


def _report(sel: Selection, clock: "PhaseClock", first: int, last: int, cfg: dict, bar,
            out, splits: Optional[dict] = None) -> tuple:
    """Print the log lines of epochs ``first..last`` from the recorded metrics (one sync)
    and find an early stop among them; ``(last epoch that counts, stopped)``."""
    from tqdm import tqdm
    patience = cfg["patience"]
    for row in sel.read(first, last):
        epoch = row["epoch"]
        msg = f"epoch {epoch:4d}  loss {row['loss']:.4f}  train_acc {row['train_acc']:.4f}"
        if sel.has_val:
            msg += f"  val_loss {row['val_loss']:.4f}  val_acc {row['val_acc']:.4f}"
        msg += f"  time {clock.epoch_seconds(epoch):.3f}s"
        if splits and epoch in splits:
            per = _per_batch_ms(splits[epoch])
            msg += (f"  ({splits[epoch]['batches']} batches, ms each: sample {per['sample']:.2f}"
                    f" gather {per['gather']:.2f} compute {per['compute']:.2f})")
        stopped = sel.has_val and patience is not None and row["bad_epochs"] >= patience
        if (epoch % cfg["log_every"] == 0 or epoch == cfg["epochs"] or epoch == clock.first
                or stopped):
            tqdm.write(msg, file=out)
        bar.set_postfix(loss=f"{row['loss']:.3f}", acc=f"{row['train_acc']:.3f}")
        if stopped:
            best = sel.best()
            tqdm.write(early_stop_message(epoch, int(row["bad_epochs"]), patience, best,
                                          float(sel.loss_floor)), file=out)
            return epoch, True
    return last, False
