"""``hector.train.selection.Selection``: model selection and patience kept on the device."""
import math

import torch

from hector.train.selection import Selection

Y = torch.tensor([0, 1, 2, 3])


def logits_with(correct: int) -> torch.Tensor:
    """Confident logits with the first ``correct`` nodes right and the others wrong."""
    pred = torch.tensor([y if i < correct else (y + 1) % 4 for i, y in enumerate(Y.tolist())])
    return 4.0 * torch.nn.functional.one_hot(pred, 4).float()


def run(corrects, patience):
    model = torch.nn.Linear(1, 1)
    idx = torch.arange(4)
    sel = Selection(model, Y, idx, idx, epochs=len(corrects), patience=patience)
    for epoch, c in enumerate(corrects, start=1):
        with torch.no_grad():
            model.weight.fill_(epoch)       # marks which epoch's parameters are kept
        sel.update(torch.tensor(float(epoch)), logits_with(c))
    return sel


def test_best_model_is_the_best_validation_accuracy_epoch():
    sel = run([1, 3, 2, 2], patience=None)
    best = sel.best()
    assert best["epoch"] == 2 and best["val_acc"] == 0.75
    assert best["state"]["weight"].item() == 2
    rows = sel.read(1, 4)
    assert [r["val_acc"] for r in rows] == [0.25, 0.75, 0.5, 0.5]
    assert [r["loss"] for r in rows] == [1.0, 2.0, 3.0, 4.0]
    assert [r["bad_epochs"] for r in rows] == [0, 0, 1, 2]


def test_selection_freezes_once_patience_runs_out():
    # epochs 2-4 neither reach the best accuracy nor lower the loss: patience 3 runs out at
    # epoch 4; epoch 5 would be a new best but comes after the stop and must change nothing
    sel = run([2, 1, 1, 1, 4], patience=3)
    assert bool(sel.stopped)
    best = sel.best()
    assert best["epoch"] == 1 and best["val_acc"] == 0.5
    assert best["state"]["weight"].item() == 1
    assert [r["bad_epochs"] for r in sel.read(1, 5)] == [0, 1, 2, 3, 3]


def test_no_patience_never_stops_and_rows_not_run_are_nan():
    model = torch.nn.Linear(1, 1)
    idx = torch.arange(4)
    sel = Selection(model, Y, idx, idx, epochs=3, patience=None)
    sel.update(torch.tensor(0.5), logits_with(1))
    assert not bool(sel.stopped)
    assert math.isnan(sel.read(2, 2)[0]["loss"])


def test_snapshot_and_restore_undo_updates_in_place():
    model = torch.nn.Linear(1, 1)
    idx = torch.arange(4)
    sel = Selection(model, Y, idx, idx, epochs=3, patience=2)
    history = sel.history
    snap = sel.snapshot()
    sel.update(torch.tensor(1.0), logits_with(2))
    sel.restore(snap)
    assert sel.history is history and int(sel.epoch) == 0 and int(sel.best_epoch) == 0
    assert torch.isnan(sel.history).all() and float(sel.best_acc) == -1.0
