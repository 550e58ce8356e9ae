"""The training loop behind ``hector train``: full-batch node classification."""
from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from typing import Optional

import torch
import torch.nn.functional as F

from .. import datasets
from ..graph import Graph
from ..checks import check_device_option
from . import checkpoint, distributed, minibatch
from .capture import attention_dropout_layers, capture_step
from .defaults import MODELS, defaults as model_defaults
from .models import build

DTYPES = ("fp32", "bf16")
_NO_MINIBATCH_RESUME = ("--resume with mini-batches (--batch-size, --devices) is not supported "
                        "yet: the loader's generators are not checkpointed")
_OVERRIDES = ("epochs", "lr", "weight_decay", "hidden", "heads", "dropout", "patience")


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
    devices = getattr(args, "devices", None)
    devices = 1 if devices is None else devices
    _check_positive("devices", devices)
    if device.type == "cuda" and devices > torch.cuda.device_count() and not distributed.under_torchrun():
        raise ValueError(f"--devices {devices}: only {torch.cuda.device_count()} CUDA devices here")
    cfg.update(model=model, dataset=key, seed=int(getattr(args, "seed", 0) or 0), dtype=dtype,
               device=str(device), backend=backend, log_every=log_every, batch_size=batch_size,
               fanout=minibatch.parse_fanout(fanout if fanout is not None
                                             else minibatch.DEFAULT_FANOUT),
               devices=devices)
    return cfg


def settings_line(cfg: dict, root=None) -> str:
    """The run's settings, printed first, so a log says what produced it."""
    keys = ("model", "dataset", "epochs", "lr", "weight_decay", "hidden", "heads", "dropout",
            "patience", "num_bases", "first_layer", "dtype", "device", "backend", "seed")
    threads = f" cpu_threads={torch.get_num_threads()}" if cfg["device"] == "cpu" else ""
    batches = (f" batch_size={cfg['batch_size']} fanout={','.join(map(str, cfg['fanout']))}"
               f" devices={cfg['devices']}" if cfg.get("batch_size") or cfg.get("devices", 1) > 1
               else "")
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
    if idx is None or idx.numel() == 0:
        return float("nan")
    return float((logits[idx].argmax(-1) == y[idx]).float().mean())


def _clone_state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(args, out=None) -> dict:
    """Run one training as ``hector train`` does; print progress and the RESULT line to
    ``out`` (stdout); return the result as a dict."""
    # Tiny late-training gradients turn into denormals, which make CPU kernels ~7x slower.
    # Flushing them is a process-wide switch: on for this run only (torch's default is off).
    torch.set_flush_denormal(True)
    try:
        return _train(args, out)
    finally:
        torch.set_flush_denormal(False)


#: Models whose training step can be captured (their layers take a prebuilt Graph).
CAPTURE_MODELS = ("gat", "agnn", "transformer")


def _capture_wanted(args, cfg, device, model, out) -> bool:
    """Capture the step on CUDA unless ``--no-capture``; models or settings that cannot be
    captured yet train eagerly, with a note saying why."""
    if device.type != "cuda" or getattr(args, "no_capture", False):
        return False
    why = None
    if cfg["model"] not in CAPTURE_MODELS:
        why = f"model {cfg['model']} (capture supports {', '.join(CAPTURE_MODELS)})"
    elif cfg["dtype"] != "fp32":
        why = f"--dtype {cfg['dtype']}"
    elif attention_dropout_layers(model):
        why = ("attention dropout (its mask would repeat every step); "
               "set --dropout 0 to capture")
    if why:
        print(f"note: training step not captured: {why}; --no-capture silences this",
              file=out)
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
    print(settings_line(cfg, getattr(args, "root", None)), file=out, flush=True)
    torch.manual_seed(cfg["seed"])
    if device.type == "cuda":
        torch.cuda.manual_seed_all(cfg["seed"])

    data = datasets.load(cfg["dataset"], root=getattr(args, "root", None)).to(device)
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

    # Mini-batches when asked for, with several processes, or when full-graph training
    # would not fit (then inference is sampled too).
    sampled_eval = False
    if cfg["batch_size"] is None and ctx.world == 1:
        fits, need, free = minibatch.fits_full_graph(data, cfg, device)
        if not fits:
            cfg["batch_size"], sampled_eval = minibatch.DEFAULT_BATCH_SIZE, True
            print(f"full-graph training needs about {need / 2**30:.1f} GiB, more than "
                  f"{minibatch.HEADROOM:.0%} of the {free / 2**30:.1f} GiB free on {device}: "
                  f"training by mini-batches (--batch-size {cfg['batch_size']} --fanout "
                  f"{','.join(map(str, cfg['fanout']))}) with sampled inference", file=out)
    if cfg["batch_size"] is None:
        cfg["batch_size"] = minibatch.DEFAULT_BATCH_SIZE if ctx.world > 1 else None
    loader = (None if cfg["batch_size"] is None else
              minibatch.make_loader(data.graph, train_idx, cfg, ctx.rank, ctx.world))

    torch.manual_seed(cfg["seed"])
    model = build(cfg["model"], data, cfg, backend=cfg["backend"]).to(device)
    if cfg["dtype"] == "bf16":
        model = model.to(torch.bfloat16)
        x = None if x is None else x.to(torch.bfloat16)
    net = (distributed.wrap(model, device, unused_parameters=cfg["model"] == "rgat")
           if ctx.world > 1 else model)   # what trains
    # CUDA-graph capture of the full-graph step (one process, no mini-batches).
    capture = loader is None and ctx.world == 1 and _capture_wanted(args, cfg, device, model, out)
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                           capturable=capture)
    eval_nodes = torch.cat([i for i in (train_idx, val_idx, test_idx) if i is not None])

    def predict():
        if sampled_eval:
            return minibatch.predict_sampled(model, data.graph, x, eval_nodes, cfg,
                                             data.num_classes)
        return model(x, edge_index, edge_type).float()

    start_epoch, best = 1, dict(val_acc=-1.0, val_loss=math.inf, epoch=0, state=None)
    bad_epochs, loss_floor = 0, math.inf
    if ck is not None and loader is not None:    # switched to mini-batches above
        raise ValueError(_NO_MINIBATCH_RESUME)
    if ck is not None:
        start_epoch, best, bad_epochs, loss_floor = checkpoint.restore(ck, resume, model, opt)
        print(f"resumed from {resume} at epoch {ck['epoch']}", file=out)
    ckpt_path = getattr(args, "checkpoint", None) if ctx.main else None

    def save(epoch):
        checkpoint.save(ckpt_path, model=model.state_dict(), optimizer=opt.state_dict(),
                        epoch=epoch, best=best, bad_epochs=bad_epochs, loss_floor=loss_floor,
                        rng=torch.get_rng_state(), config=dict(cfg))

    epochs, patience = cfg["epochs"], cfg["patience"]
    last_epoch, train_time, stopped = start_epoch - 1, 0.0, False
    epoch_times = []
    bar = tqdm(range(start_epoch, epochs + 1), desc=f"{cfg['model']}/{cfg['dataset']}",
               unit="epoch", file=sys.stderr, leave=False,
               disable=getattr(args, "no_progress", False) or None)
    step = None
    if capture:
        # The captured step reads a prebuilt Graph: a raw edge_index would be looked up in
        # the graph cache (a device sync) inside the capture.
        graph = Graph(edge_index, num_nodes=data.num_nodes)
        model.train()
        step = capture_step(model, opt, lambda logits: F.cross_entropy(
            logits[train_idx].float(), y[train_idx]), x, graph)
        edge_index = graph
    step_times = []
    for epoch in bar:
        t0 = time.perf_counter()
        net.train()
        if loader is not None:
            loss = minibatch.train_epoch(net, opt, loader, x, y)
        elif step is not None:
            loss = step()
        else:
            opt.zero_grad(set_to_none=True)
            with _autocast(cfg):
                logits = model(x, edge_index, edge_type)
            loss = F.cross_entropy(logits[train_idx].float(), y[train_idx])
            loss.backward()
            opt.step()
            loss = loss.item()
        _sync(device)
        step_times.append(time.perf_counter() - t0)
        net.eval()
        with torch.no_grad(), _autocast(cfg):
            logits = predict()
        _sync(device)
        dt = time.perf_counter() - t0
        train_time += dt
        epoch_times.append(dt)
        train_acc = _accuracy(logits, y, train_idx)
        msg = (f"epoch {epoch:4d}  loss {loss:.4f}  train_acc {train_acc:.4f}")
        if has_val:
            val_loss = float(F.cross_entropy(logits[val_idx], y[val_idx]))
            val_acc = _accuracy(logits, y, val_idx)
            msg += f"  val_loss {val_loss:.4f}  val_acc {val_acc:.4f}"
            # GAT's criterion: keep the best validation accuracy (ties: lower loss); count
            # patience while neither validation accuracy nor loss improves.
            if val_acc > best["val_acc"] or (val_acc == best["val_acc"]
                                             and val_loss < best["val_loss"]):
                best = dict(val_acc=val_acc, val_loss=val_loss, epoch=epoch,
                            state=_clone_state(model))
            if val_acc >= best["val_acc"] or val_loss < loss_floor:
                bad_epochs = 0
            else:
                bad_epochs += 1
            loss_floor = min(loss_floor, val_loss)
        msg += f"  time {dt:.3f}s"
        bar.set_postfix(loss=f"{loss:.3f}", acc=f"{train_acc:.3f}")
        last_epoch = epoch
        if has_val and patience is not None and bad_epochs >= patience:
            stopped = True
        if epoch % cfg["log_every"] == 0 or epoch == epochs or epoch == start_epoch or stopped:
            tqdm.write(msg, file=out)
        if ckpt_path:
            save(epoch)
        if stopped:
            tqdm.write(early_stop_message(epoch, bad_epochs, patience, best, loss_floor), file=out)
            break
    bar.close()

    if has_val and best["state"] is not None:
        model.load_state_dict(best["state"])
    model.eval()
    with torch.no_grad(), _autocast(cfg):
        logits = predict()
    result = dict(model=cfg["model"], dataset=cfg["dataset"],
                  test_acc=_accuracy(logits, y, test_idx),
                  train_acc=_accuracy(logits, y, train_idx),
                  val_acc=_accuracy(logits, y, val_idx) if has_val else None,
                  best_epoch=best["epoch"] if has_val else last_epoch,
                  epochs=last_epoch, seed=cfg["seed"], device=cfg["device"], dtype=cfg["dtype"],
                  backend=cfg["backend"], train_time=train_time,
                  batch_size=cfg["batch_size"], devices=ctx.world,
                  # the median leaves out the first epoch's one-off work (kernel compilation)
                  epoch_time=statistics.median(epoch_times) if epoch_times else None,
                  # forward, loss, backward and optimizer step only (no evaluation)
                  step_time=statistics.median(step_times) if step_times else None,
                  captured=step is not None,
                  total_time=time.perf_counter() - t_start)
    line = (f"RESULT model={result['model']} dataset={result['dataset']} "
            f"test_acc={result['test_acc']:.4f} train_acc={result['train_acc']:.4f} "
            + (f"val_acc={result['val_acc']:.4f} " if has_val else "")
            + f"best_epoch={result['best_epoch']} epochs={result['epochs']} seed={result['seed']} "
            f"device={result['device']} dtype={result['dtype']} backend={result['backend']} "
            + (f"batch_size={cfg['batch_size']} fanout={','.join(map(str, cfg['fanout']))} "
               f"devices={ctx.world} " if cfg["batch_size"] else "")
            + (f"epoch_time={result['epoch_time'] * 1e3:.2f}ms "
               f"step_time={result['step_time'] * 1e3:.3f}ms "
               f"captured={'yes' if result['captured'] else 'no'} " if epoch_times else "")
            + f"train_time_s={result['train_time']:.2f} total_time_s={result['total_time']:.2f}")
    print(line, file=out, flush=True)
    return result
