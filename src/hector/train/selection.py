"""Per-epoch metrics, best-model selection and early-stopping patience of ``hector train``,
computed on the device with no host synchronisation, so that an epoch (step + evaluation) can
run ahead of the host and be captured whole as CUDA graphs; the host reads the recorded
history once per log interval (``read``).

The rule is GAT's: keep the model of the best validation accuracy (ties: the lower validation
loss); patience counts consecutive epochs in which validation accuracy stayed below its best
and validation loss did not go below its lowest.  Once patience runs out the selection
freezes (``stopped``): epochs the loop runs before it next looks change nothing that is
reported.
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch
import torch.nn.functional as F

#: Columns of ``Selection.history``.
COLUMNS = ("loss", "train_acc", "val_loss", "val_acc", "bad_epochs")


def accuracy(logits, y, idx) -> torch.Tensor:
    """Accuracy on ``idx`` as a 0-d device tensor (NaN without nodes)."""
    if idx is None or idx.numel() == 0:
        return torch.full((), float("nan"), device=logits.device)
    return (logits[idx].argmax(-1) == y[idx]).float().mean()


class Selection:
    """Device state of one training run: see the module docstring.  ``update`` takes device
    tensors and launches only device work (recordable in a CUDA graph); ``read`` syncs."""

    def __init__(self, model: torch.nn.Module, y, train_idx, val_idx, epochs: int,
                 patience: Optional[int], start_epoch: int = 1, best: Optional[dict] = None,
                 bad_epochs: int = 0, loss_floor: float = math.inf):
        self.model, self.y, self.train_idx, self.val_idx = model, y, train_idx, val_idx
        self.has_val = val_idx is not None and val_idx.numel() > 0
        self.patience = patience
        dev = y.device
        f32 = dict(dtype=torch.float32, device=dev)
        best = best or dict(val_acc=-1.0, val_loss=math.inf, epoch=0, state=None)
        self.epoch = torch.tensor(start_epoch - 1, dtype=torch.int64, device=dev)
        self.best_acc = torch.tensor(float(best["val_acc"]), **f32)
        self.best_loss = torch.tensor(float(best["val_loss"]), **f32)
        self.best_epoch = torch.tensor(int(best["epoch"]), dtype=torch.int64, device=dev)
        self.loss_floor = torch.tensor(float(loss_floor), **f32)
        self.bad = torch.tensor(int(bad_epochs), dtype=torch.int64, device=dev)
        self.stopped = torch.zeros((), dtype=torch.bool, device=dev)
        # Row e: the metrics of epoch e (NaN until run).
        self.history = torch.full((epochs + 1, len(COLUMNS)), float("nan"), **f32)
        self.names = list(model.state_dict().keys()) if self.has_val else []
        saved = best.get("state")
        self.best_state: List[torch.Tensor] = [
            (saved[k] if saved is not None else v).detach().clone()
            for k, v in model.state_dict().items()] if self.has_val else []

    def _tensors(self) -> List[torch.Tensor]:
        return [self.epoch, self.best_acc, self.best_loss, self.best_epoch, self.loss_floor,
                self.bad, self.stopped, self.history, *self.best_state]

    def snapshot(self) -> List[torch.Tensor]:
        return [t.clone() for t in self._tensors()]

    def restore(self, snap: List[torch.Tensor]) -> None:
        """Back to a ``snapshot``, in place (a captured graph holds these addresses)."""
        with torch.no_grad():
            for t, s in zip(self._tensors(), snap):
                t.copy_(s)

    @torch.no_grad()
    def update(self, loss: torch.Tensor, logits: torch.Tensor) -> None:
        """Record epoch ``epoch + 1``: its training ``loss`` (0-d) and the metrics of the
        evaluation ``logits``; update the best model and the patience count."""
        self.epoch.add_(1)
        nan = torch.full((), float("nan"), device=logits.device)
        train_acc = accuracy(logits, self.y, self.train_idx)
        val_loss = val_acc = nan
        if self.has_val:
            val_loss = F.cross_entropy(logits[self.val_idx], self.y[self.val_idx])
            val_acc = accuracy(logits, self.y, self.val_idx)
            live = ~self.stopped
            improved = live & ((val_acc > self.best_acc) | ((val_acc == self.best_acc)
                                                            & (val_loss < self.best_loss)))
            self.best_acc.copy_(torch.where(improved, val_acc, self.best_acc))
            self.best_loss.copy_(torch.where(improved, val_loss, self.best_loss))
            self.best_epoch.copy_(torch.where(improved, self.epoch, self.best_epoch))
            for b, v in zip(self.best_state, self.model.state_dict().values()):
                b.copy_(torch.where(improved, v, b))
            calm = (val_acc >= self.best_acc) | (val_loss < self.loss_floor)
            self.bad.copy_(torch.where(live, torch.where(calm, 0, self.bad + 1), self.bad))
            self.loss_floor.copy_(torch.where(live, torch.minimum(self.loss_floor, val_loss),
                                              self.loss_floor))
            if self.patience is not None:
                self.stopped.logical_or_(self.bad >= self.patience)
        row = torch.stack([loss.detach().float().reshape(()), train_acc, val_loss, val_acc,
                           self.bad.float()])
        self.history.index_copy_(0, self.epoch.reshape(1), row[None])

    def read(self, first: int, last: int) -> List[dict]:
        """The recorded metrics of epochs ``first..last`` (one device sync)."""
        rows = self.history[first:last + 1].cpu().tolist()
        return [dict(zip(COLUMNS, r), epoch=first + i) for i, r in enumerate(rows)]

    def best(self) -> dict:
        """The best model so far as ``hector train`` checkpoints it (syncs)."""
        return dict(val_acc=float(self.best_acc), val_loss=float(self.best_loss),
                    epoch=int(self.best_epoch),
                    state=(dict(zip(self.names, (t.clone() for t in self.best_state)))
                           if self.has_val and int(self.best_epoch) > 0 else None))
