"""Mini-batch training for ``hector train --batch-size B --fanout 25,20``: the loader over the
training nodes, one epoch of batches, sampled inference, and the estimate that decides when
full-graph training would not fit on the device."""
from __future__ import annotations

import os
import time
from typing import List, Optional

import torch
import torch.nn.functional as F

from ..loader import NeighborLoader

DEFAULT_BATCH_SIZE = 1024
DEFAULT_FANOUT = (25, 20)
#: Batches built ahead by the loader's thread by default (``--prefetch``): none.  On an H200
#: two made synthetic mag epochs shorter but small batches' epochs many times longer: those
#: are Python-bound on both threads, which then queue for the GIL (docs/perf-notes.md,
#: "Mini-batches", 2026-11-25).  So it stays opt-in.
DEFAULT_PREFETCH = 0
#: Fraction of the free memory full-graph training may plan to use.
HEADROOM = 0.7


def parse_fanout(text) -> List[int]:
    """``"25,20"`` -> ``[25, 20]`` (one fan-out per layer, PyG's order: the first hop around
    the seeds first; -1 = every neighbour)."""
    if isinstance(text, (list, tuple)):
        values = list(text)
    else:
        try:
            values = [int(v) for v in str(text).split(",")]
        except ValueError:
            raise ValueError(f"--fanout must be comma-separated ints (e.g. 25,20), got {text!r}")
    if len(values) != 2 or any(v < -1 for v in values):
        raise ValueError(f"--fanout needs one int >= -1 per layer of the 2-layer models, got "
                         f"{text!r}")
    return values


def free_bytes(device: torch.device) -> Optional[int]:
    """Free memory on ``device`` (CUDA: the driver's count; CPU: available physical memory
    where the OS says; None when unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def fits(need: int, device: torch.device):
    """``(fits?, free bytes)``: whether ``need`` bytes (``hector.train.memory``'s estimate of
    a full-graph step) stay within ``HEADROOM`` of the free memory on ``device`` (unknown
    free memory: yes)."""
    free = free_bytes(device)
    return (free is None or need <= HEADROOM * free), free


def make_loader(graph, nodes, cfg: dict, rank: int = 0, world: int = 1,
                static: bool = False) -> NeighborLoader:
    """The training loader: shuffled each epoch (the same order on every rank), rank
    ``rank`` sampling its ``1 / world`` share of the seeds, every rank the same number of
    batches (so the gradient all-reduces of DistributedDataParallel pair up); ``static``:
    into static-capacity buffers, for a captured step."""
    return NeighborLoader(graph, cfg["fanout"], input_nodes=nodes, batch_size=cfg["batch_size"],
                          shuffle=True, seed=cfg["seed"], num_parts=world, part=rank,
                          prefetch=0 if static else cfg.get("prefetch", 0), static=static)


class BatchClock:
    """Where a mini-batch epoch's time goes, per batch: waiting for the loader (``sample``:
    neighbour sampling and the blocks' ``Graph`` builds, or only the wait when the loader
    prefetches), slicing the batch's features and labels (``gather``), and the training step
    (``compute``: forward, loss, backward, optimizer step, the first-step planning of the new
    blocks included).

    On CUDA each boundary is an event recorded on the current stream and read once, after the
    epoch's closing sync, so measuring adds no sync: a phase's time is then the stream's time
    between its boundaries, which is the host's time where the GPU keeps up (small, host-bound
    batches) and the GPU's where it does not.  On the CPU, ``perf_counter``."""

    PHASES = ("sample", "gather", "compute")

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []             # per batch [start, sampled, gathered, stepped]

    def mark(self, new_batch: bool = False):
        if self.cuda:
            now = torch.cuda.Event(enable_timing=True)
            now.record()
        else:
            now = time.perf_counter()
        if new_batch:
            self.marks.append([now])
        else:
            self.marks[-1].append(now)

    def _between(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def seconds(self) -> dict:
        """Total seconds of each phase over the batches marked (the events must have
        completed: call after a sync) and the batch count."""
        totals = dict.fromkeys(self.PHASES, 0.0)
        for m in self.marks:
            for name, a, b in zip(self.PHASES, m, m[1:]):
                totals[name] += self._between(a, b)
        return dict(totals, batches=len(self.marks))


def train_step(model, opt, batch, x_b, y_b) -> torch.Tensor:
    """One optimizer step on ``batch`` (``x_b``, ``y_b``: its first block's features and its
    seeds' labels); the loss.  ``model`` may be ``RowSparseDDP``, whose node tables are then
    averaged over the ranks by the rows the batches read."""
    opt.zero_grad(set_to_none=True)
    logits = model(x_b, batch.blocks, n_id=batch.n_id)
    loss = F.cross_entropy(logits.float(), y_b)
    loss.backward()
    if hasattr(model, "sync_rows"):
        # The union's exact rows (one host read), not padded to the loader's bound: mag's
        # bound is 5x a batch's real nodes, and the padded sync measured slower on two H200s
        # (RGCN 7.82 s per epoch against 6.95; the read waits only where the mask's
        # all-reduce has already made the ranks meet).
        model.sync_rows(batch.n_id)
    opt.step()
    return loss


def train_epoch(model, opt, loader, x, y, clock: Optional[BatchClock] = None,
                progress=None) -> float:
    """One pass over ``loader``'s batches, one optimizer step per batch; mean loss.  The loss
    is summed on the device and read once, after the last batch: a read per batch would stall
    the host until the GPU finished that batch, every batch.  ``clock`` (a ``BatchClock``)
    records each batch's phases; ``progress`` (a tqdm bar) advances once per batch."""
    total, seen = torch.zeros((), dtype=torch.float64, device=y.device), 0
    batches = iter(loader)
    while True:
        if clock is not None:
            clock.mark(new_batch=True)
        batch = next(batches, None)
        if batch is None:
            if clock is not None:
                clock.marks.pop()         # the loader's end is no batch
            break
        if clock is not None:
            clock.mark()
        x_b = None if x is None else x.index_select(0, batch.n_id)
        y_b = y[batch.seed]
        if clock is not None:
            clock.mark()
        loss = train_step(model, opt, batch, x_b, y_b)
        if clock is not None:
            clock.mark()
        total += loss.detach() * batch.batch_size
        seen += batch.batch_size
        if progress is not None:
            progress.update(1)
    return total.item() / max(seen, 1)


def captured_epoch(step, clock: Optional[BatchClock] = None, progress=None) -> float:
    """:func:`train_epoch` with a :class:`~hector.train.captured.CapturedStep`: per batch, its
    seeds copied in and one graph replayed (sampling and gathers happen inside the step, so
    the clock's ``sample`` and ``gather`` phases are only the seeds' slicing); mean loss,
    read once after the last batch.  Each batch's seeds are made where an overlapped step
    samples them (:meth:`~hector.train.captured.CapturedStep.seed_batches`), so the next
    batch's sampling need not wait for this one's step."""
    total = torch.zeros((), dtype=torch.float64, device=step.seeds.device)
    seen = torch.zeros((), dtype=torch.int64, device=step.seeds.device)
    for seeds, count in step.seed_batches():
        if clock is not None:
            clock.mark(new_batch=True)
            clock.mark()
            clock.mark()
        loss = step.step(seeds, count)
        if clock is not None:
            clock.mark()
        total += loss * count
        seen += count
        if progress is not None:
            progress.update(1)
    return (total / seen.clamp(min=1)).item()


@torch.no_grad()
def predict_sampled(model, graph, x, nodes: torch.Tensor, cfg: dict, num_classes: int):
    """Logits of ``nodes`` by sampled inference (the training fan-outs, fixed seed); rows of
    other nodes are zero.  For graphs whose full-graph forward would not fit."""
    out = torch.zeros(graph.num_nodes, num_classes, device=nodes.device)
    loader = NeighborLoader(graph, cfg["fanout"], input_nodes=nodes, batch_size=cfg["batch_size"],
                            seed=cfg["seed"], prefetch=cfg.get("prefetch", 0))
    for batch in loader:
        x_b = None if x is None else x.index_select(0, batch.n_id)
        out[batch.seed] = model(x_b, batch.blocks, n_id=batch.n_id).float()
    return out
