"""``hector train --checkpoint`` / ``--resume`` files: what is saved, and a loader that turns
every way a file can be wrong (not a checkpoint, unsafe, truncated, from another run) into one
ValueError line naming ``--resume`` and the file.

Files are read with ``torch.load(weights_only=True)``: pickled objects other than tensors and
plain containers are refused, so a malicious file cannot run code; its refusal is reported as
such, never retried with ``weights_only=False``.
"""
from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import torch

#: Entries every checkpoint written by ``save`` holds.
KEYS = ("model", "optimizer", "epoch", "best", "bad_epochs", "loss_floor", "rng", "config")
#: Settings the saved model and its parameter shapes depend on: a resumed run must agree.
SHAPING = ("model", "dataset", "hidden", "heads", "num_bases", "first_layer", "dtype")
#: The same for ``--task link`` checkpoints (``hector.train.linkpred``).
LINK_KEYS = ("model", "optimizer", "epoch", "best", "bad_epochs", "rng", "config")
LINK_SHAPING = ("model", "dataset", "hidden", "heads", "num_bases", "num_blocks", "decoder")


def save(path, **state) -> None:
    """Write atomically (a temporary file, then rename): an interrupted save keeps the last."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def one_line(err: BaseException, limit: int = 300) -> str:
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def load(path, device, cfg: dict, keys=KEYS, shaping=SHAPING) -> dict:
    """The checkpoint at ``path`` for a run with settings ``cfg``; ValueError (one line)
    when it cannot be read safely, is not a ``hector train`` checkpoint (``keys``), is from
    the other task (``config["task"]``, node classification when absent) or is from a run
    whose model differs (``shaping``)."""
    where = f"--resume {path}"
    if not Path(path).is_file():
        raise ValueError(f"{where}: no such file")
    try:
        with warnings.catch_warnings():
            # torch warns about pickle protocols it did not write; the outcome is what counts
            warnings.simplefilter("ignore")
            ck = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"{where}: refused: the file holds pickled objects other than tensors "
                         "(it could run code when loaded); not loaded") from None
    except Exception as err:      # noqa: BLE001 -- any other file unpickles into any error
        # (a text file: KeyError or IndexError from the unpickler; truncated: EOFError, ...)
        raise ValueError(f"{where}: not a readable checkpoint (truncated or not written by "
                         f"torch.save: {one_line(err)})") from None
    if not isinstance(ck, dict) or not isinstance(ck.get("config"), dict):
        raise ValueError(f"{where}: not a hector train checkpoint (no 'config' entry)")
    task, want = ck["config"].get("task", "node"), cfg.get("task", "node")
    if task != want:
        raise ValueError(f"{where}: a --task {task} checkpoint, not --task {want}")
    missing = [k for k in keys if k not in ck]
    if missing:
        raise ValueError(f"{where}: not a hector train checkpoint (missing {', '.join(missing)})")
    for k in shaping:
        if ck["config"].get(k) != cfg.get(k):
            raise ValueError(f"{where}: the checkpoint is for {k}={ck['config'].get(k)!r}, "
                             f"not {cfg.get(k)!r}")
    return ck


def restore(ck: dict, path, model, opt) -> tuple:
    """Load the saved model, optimizer and random state into this run; return (first epoch
    to run, best, bad_epochs, loss_floor).  ValueError (one line) when they do not fit."""
    try:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--resume {path}: the saved model does not fit this run's model "
                         f"({one_line(err)})") from None
    try:
        out = (int(ck["epoch"]) + 1, dict(ck["best"]), int(ck["bad_epochs"]),
               float(ck["loss_floor"]))
        torch.set_rng_state(ck["rng"].cpu())
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"--resume {path}: damaged training state ({one_line(err)})") from None
    return out
