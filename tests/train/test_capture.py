"""``hector.train.capture_step`` and ``hector train``'s captured step.  The CPU tests check the
arguments, the choice to capture, the eager fallback and the sync-free epoch bookkeeping; the
GPU tests (skipped without CUDA) check that replaying the captured step trains exactly as
eager steps do, for every model, with dropout drawing a fresh mask on every replay."""
import argparse
import copy
import io
import re

import pytest
import torch
import torch.nn.functional as F

import hector.nn
from hector.graph import Graph
from hector.train import capture_step, configure, train
from hector.train.defaults import MODELS
from hector.train.loop import _capture_wanted

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


class Wrapped(torch.nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.conv = hector.nn.GATConv(8, 4, heads=2, dropout=dropout)

    def forward(self, x, graph):
        return self.conv(x, graph)


def _problem(device):
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 30, (2, 120), generator=g)
    graph = Graph(ei, num_nodes=30).to(device)
    x = torch.randn(30, 8, generator=g).to(device)
    y = torch.randint(0, 8, (30,), generator=g).to(device)
    return graph, x, y


def _parser():
    p = argparse.ArgumentParser()
    configure(p)
    return p


@pytest.mark.parametrize("model", MODELS)
def test_every_model_is_captured_on_cuda_in_fp32(model):
    """The choice only (no CUDA needed): every model, dropout or not, is captured on a CUDA
    device; bf16, --no-capture and the CPU are not (bf16 with a note saying why)."""
    p = _parser()
    base = ["--model", model, "--dataset", "synthetic:cora", "--device", "cpu"]
    cfg = dict(model=model, dtype="fp32")
    cuda_dev = torch.device("cuda")
    out = io.StringIO()
    assert _capture_wanted(p.parse_args(base + ["--dropout", "0.5"]), cfg, cuda_dev, out)
    assert out.getvalue() == ""
    assert not _capture_wanted(p.parse_args(base + ["--no-capture"]), cfg, cuda_dev, out)
    assert not _capture_wanted(p.parse_args(base), cfg, torch.device("cpu"), out)
    assert out.getvalue() == ""
    assert not _capture_wanted(p.parse_args(base), dict(cfg, dtype="bf16"), cuda_dev, out)
    assert "--dtype bf16" in out.getvalue()


@pytest.mark.parametrize("model", MODELS)
def test_minibatch_capture_choice(model):
    """Mini-batches: the attention models on a graph of one node type and one relation and
    the relational models on any graph are captured on CUDA; the attention models on a
    relational graph are not, with a note (a full-graph step of several processes neither)."""
    from hector.train.loop import CAPTURE_MINIBATCH_MODELS, ONE_RELATION_MODELS
    from hector import Graph
    p = _parser()
    args = p.parse_args(["--model", model, "--dataset", "synthetic:cora", "--device", "cpu"])
    cfg, cuda_dev = dict(model=model, dtype="fp32"), torch.device("cuda")
    plain = Graph(torch.tensor([[0, 1], [1, 2]]))
    relational = Graph(torch.tensor([[0, 1], [1, 2]]), edge_type=torch.tensor([0, 1]))
    out = io.StringIO()
    assert _capture_wanted(args, cfg, cuda_dev, out, plain) == (model in CAPTURE_MINIBATCH_MODELS)
    assert (out.getvalue() == "") == (model in CAPTURE_MINIBATCH_MODELS)
    assert _capture_wanted(args, cfg, cuda_dev, out, relational) == (
        model in CAPTURE_MINIBATCH_MODELS and model not in ONE_RELATION_MODELS)
    assert set(CAPTURE_MINIBATCH_MODELS) == set(MODELS)
    # several processes: the mini-batch step is captured, the full-graph one not yet
    assert _capture_wanted(args, cfg, cuda_dev, out, plain, world=2) == (
        model in CAPTURE_MINIBATCH_MODELS)
    full = io.StringIO()
    assert not _capture_wanted(args, cfg, cuda_dev, full, None, world=2)
    assert "--devices 2" in full.getvalue()
    assert not _capture_wanted(args, cfg, torch.device("cpu"), out, plain)


@pytest.mark.parametrize("change, exc, match", [
    (dict(model="not a module"), TypeError, "model"),
    (dict(optimizer=object()), TypeError, "optimizer"),
    (dict(loss_fn=3), TypeError, "loss_fn"),
])
def test_capture_step_bad_arguments_name_the_argument(change, exc, match):
    model = Wrapped()
    args = dict(model=model, optimizer=torch.optim.Adam(model.parameters()),
                loss_fn=lambda out: out.sum())
    args.update(change)
    with pytest.raises(exc, match=match):
        capture_step(args["model"], args["optimizer"], args["loss_fn"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_capture_step_refuses_without_cuda():
    model = Wrapped()
    with pytest.raises(ValueError, match="CUDA"):
        capture_step(model, torch.optim.Adam(model.parameters()), lambda out: out.sum())


@pytest.fixture
def small_synthetic(monkeypatch):
    from hector import datasets
    load = datasets.load
    monkeypatch.setattr(datasets, "load", lambda name, root=None, **kw: load(
        name, root=root, **{**kw, "scale": 0.05}))


def test_no_capture_flag_and_cpu_run_reports_eager(small_synthetic):
    p = _parser()
    argv = ["--model", "gat", "--dataset", "synthetic:cora", "--hidden", "2", "--heads", "1",
            "--epochs", "2", "--no-progress"]
    assert p.parse_args(argv).no_capture is False
    assert p.parse_args(argv + ["--no-capture"]).no_capture is True
    out = io.StringIO()
    result = train(p.parse_args(argv), out=out)
    assert result["captured"] is False and result["step_time"] > 0
    assert " captured=no " in out.getvalue()


def test_epoch_time_is_split_into_step_and_eval(small_synthetic):
    out = io.StringIO()
    r = train(_parser().parse_args(["--model", "gat", "--dataset", "synthetic:cora", "--hidden",
                                    "2", "--heads", "1", "--epochs", "4", "--no-progress"]),
              out=out)
    assert r["step_time"] > 0 and r["eval_time"] > 0
    # an epoch is its step, its evaluation and the host work between epochs
    assert r["epoch_time"] >= 0.9 * (r["step_time"] + r["eval_time"])
    line = [l for l in out.getvalue().splitlines() if l.startswith("RESULT")][0]
    for key in ("epoch_time", "step_time", "eval_time"):
        assert f" {key}=" in line and f"{r[key] * 1e3:.3f}ms" in line


@pytest.mark.parametrize("model", ["gat", "rgcn", "hgt"])
def test_steady_epochs_between_log_points_read_nothing_on_the_host(small_synthetic, model):
    """What a captured epoch needs, checked on the CPU: from the third epoch to the next log
    point, hector's code reads no tensor on the host (on CUDA each read is a sync): the step,
    the evaluation and the device-side model selection.  The reads come back at the log point
    (the one sync per --log-every epochs)."""
    import contextlib
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))
    from test_host_syncs import host_reads
    from hector.train import loop
    watch, seen, at_report = contextlib.ExitStack(), [], []
    real_start, real_report = loop.PhaseClock.start, loop._report

    def start(clock):
        if len(clock.marks) == 2:            # the third epoch begins: watch from here
            seen.append(watch.enter_context(host_reads()))
        real_start(clock)

    def report(*args, **kwargs):
        watch.close()                         # stop watching before the host looks
        with host_reads() as reads:
            out = real_report(*args, **kwargs)
        at_report.append(reads)
        return out
    loop.PhaseClock.start, loop._report = start, report
    try:
        dataset = "synthetic:aifb" if model == "hgt" else "synthetic:cora"
        train(_parser().parse_args(["--model", model, "--dataset", dataset, "--hidden", "4",
                                    "--heads", "1", "--epochs", "8", "--log-every", "8",
                                    "--no-progress"]), out=io.StringIO())
    finally:
        loop.PhaseClock.start, loop._report = real_start, real_report
        watch.close()
    assert len(seen) == 1 and seen[0] == [], seen     # epochs 3..8, up to the log point
    assert at_report[-1], "the log point reads the recorded metrics"


@pytest.mark.parametrize("model, lr", [("gat", "0.05"), ("rgcn", "0.2")])
def test_looking_every_k_epochs_selects_and_stops_as_looking_every_epoch(small_synthetic,
                                                                           model, lr):
    """The host reads the device-side metrics only every --log-every epochs; early stopping
    and the best model must come out exactly as when it looks every epoch (the selection
    freezes on the device when patience runs out)."""
    argv = ["--model", model, "--dataset", "synthetic:cora", "--hidden", "4", "--heads", "1",
            "--epochs", "60", "--patience", "3", "--lr", lr, "--no-progress"]
    every = train(_parser().parse_args(argv + ["--log-every", "1"]), out=io.StringIO())
    sparse = train(_parser().parse_args(argv + ["--log-every", "7"]), out=io.StringIO())
    assert every["epochs"] < 60                      # it did stop early
    for key in ("epochs", "best_epoch", "test_acc", "val_acc", "train_acc"):
        assert sparse[key] == every[key], key


def _eager_steps(model, opt, loss_fn, inputs, n):
    losses = []
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(*inputs))
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return torch.stack(losses)


@cuda
def test_captured_step_trains_like_eager():
    graph, x, y = _problem("cuda")
    loss_fn = lambda out: F.cross_entropy(out, y)     # noqa: E731
    torch.manual_seed(0)
    eager = Wrapped().cuda()
    captured = copy.deepcopy(eager)
    want = _eager_steps(eager, torch.optim.Adam(eager.parameters(), lr=0.01, capturable=True),
                        loss_fn, (x, graph), 5)
    opt = torch.optim.Adam(captured.parameters(), lr=0.01, capturable=True)
    step = capture_step(captured, opt, loss_fn, x, graph)
    got = torch.stack([step().clone() for _ in range(5)])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(captured.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@cuda
def test_captured_attention_dropout_draws_a_fresh_mask_every_replay():
    """lr 0: the parameters never change, so replays differ only by their dropout masks."""
    graph, x, y = _problem("cuda")
    torch.manual_seed(0)
    model = Wrapped(dropout=0.5).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    step = capture_step(model, opt, lambda out: F.cross_entropy(out, y), x, graph)
    losses = torch.stack([step().clone() for _ in range(4)])
    assert len(set(losses.tolist())) == 4, losses
    # and it is still the same random stream as eager steps from the same generator state
    torch.manual_seed(0)
    eager = Wrapped(dropout=0.5).cuda()
    torch.cuda.manual_seed_all(1)
    step = capture_step(eager, torch.optim.SGD(eager.parameters(), lr=0.0),
                        lambda out: F.cross_entropy(out, y), x, graph)
    got = torch.stack([step().clone() for _ in range(3)])
    torch.cuda.manual_seed_all(1)
    want = _eager_steps(eager, torch.optim.SGD(eager.parameters(), lr=0.0),
                        lambda out: F.cross_entropy(out, y), (x, graph), 3)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@cuda
def test_capture_step_refuses_a_non_capturable_adam():
    graph, x, y = _problem("cuda")
    model = Wrapped().cuda()
    with pytest.raises(ValueError, match="capturable"):
        capture_step(model, torch.optim.Adam(model.parameters()), lambda out: out.sum(), x,
                     graph)


def _logged_losses(text):
    return [float(v) for v in re.findall(r"^epoch\s+\d+\s+loss ([0-9.]+)", text, re.M)]


@cuda
@pytest.mark.parametrize("model, dataset", [
    ("gat", "synthetic:cora"), ("agnn", "synthetic:cora"), ("transformer", "synthetic:cora"),
    ("rgcn", "synthetic:aifb"), ("rgat", "synthetic:aifb"), ("hgt", "synthetic:aifb")])
def test_hector_train_captures_every_model_and_trains_like_eager(model, dataset):
    argv = ["--model", model, "--dataset", dataset, "--epochs", "8", "--dropout", "0",
            "--device", "cuda", "--no-progress", "--log-every", "1"]
    out, eager_out = io.StringIO(), io.StringIO()
    captured = train(_parser().parse_args(argv), out=out)
    eager = train(_parser().parse_args(argv + ["--no-capture"]), out=eager_out)
    assert captured["captured"] and not eager["captured"]
    assert "note:" not in out.getvalue()
    got, want = _logged_losses(out.getvalue()), _logged_losses(eager_out.getvalue())
    assert len(got) == len(want) == 8
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=2e-3, atol=2e-4)
    assert abs(captured["test_acc"] - eager["test_acc"]) < 0.02


@cuda
def test_hector_train_captures_with_dropout_and_the_steady_epoch_does_not_sync():
    """Default GAT settings (dropout 0.6 on features and attention) are captured; after the
    first epochs, an epoch (step replay + evaluation replay) makes no host sync: run under
    torch.cuda.set_sync_debug_mode("error") between two log points."""
    from hector.train import loop
    argv = ["--model", "gat", "--dataset", "synthetic:cora", "--epochs", "30",
            "--device", "cuda", "--no-progress", "--log-every", "15"]
    real_report = loop._report

    def strict_report(sel, clock, first, last, *rest):   # the host's only look per interval
        torch.cuda.set_sync_debug_mode(0)
        out = real_report(sel, clock, first, last, *rest)
        if last < 30:                      # strict up to the last epoch, not after the loop
            torch.cuda.set_sync_debug_mode("error")
        return out
    loop._report = strict_report
    log = io.StringIO()
    try:
        r = train(_parser().parse_args(argv), out=log)
    finally:
        loop._report = real_report
        torch.cuda.set_sync_debug_mode(0)
    # synthetic:cora's features carry little of the labels (eager's test accuracy stays near
    # chance in 30 epochs too); the captured steps must still lower the training loss.
    losses = _logged_losses(log.getvalue())
    assert r["captured"] and r["epochs"] == 30 and len(losses) == 3
    assert losses[-1] < 0.9 * losses[0]
