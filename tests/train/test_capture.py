"""``hector.train.capture_step`` and ``hector train``'s captured step.  The CPU tests check the
arguments and the eager fallback; the GPU tests (skipped without CUDA) check that replaying
the captured step trains exactly as eager steps do."""
import argparse
import copy
import io

import pytest
import torch
import torch.nn.functional as F

import hector.nn
from hector.graph import Graph
from hector.train import capture_step, configure, train
from hector.train.capture import attention_dropout_layers

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


def test_attention_dropout_layers_are_found():
    assert attention_dropout_layers(Wrapped(dropout=0.5)) == ["conv"]
    assert attention_dropout_layers(Wrapped(dropout=0.0)) == []


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


def test_no_capture_flag_and_cpu_run_reports_eager(monkeypatch):
    from hector import datasets
    load = datasets.load
    monkeypatch.setattr(datasets, "load", lambda name, root=None, **kw: load(
        name, root=root, **{**kw, "scale": 0.05}))
    p = argparse.ArgumentParser()
    configure(p)
    argv = ["--model", "gat", "--dataset", "synthetic:cora", "--hidden", "2", "--heads", "1",
            "--epochs", "2", "--no-progress"]
    assert p.parse_args(argv).no_capture is False
    assert p.parse_args(argv + ["--no-capture"]).no_capture is True
    out = io.StringIO()
    result = train(p.parse_args(argv), out=out)
    assert result["captured"] is False and result["step_time"] > 0
    assert " captured=no " in out.getvalue()


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
def test_capture_step_refuses_attention_dropout_and_non_capturable_adam():
    graph, x, y = _problem("cuda")
    model = Wrapped(dropout=0.5).cuda()
    with pytest.raises(ValueError, match="attention dropout"):
        capture_step(model, torch.optim.Adam(model.parameters(), capturable=True),
                     lambda out: out.sum(), x, graph)
    model = Wrapped().cuda()
    with pytest.raises(ValueError, match="capturable"):
        capture_step(model, torch.optim.Adam(model.parameters()), lambda out: out.sum(), x,
                     graph)


@cuda
def test_hector_train_captures_by_default_on_cuda():
    p = argparse.ArgumentParser()
    configure(p)
    argv = ["--model", "gat", "--dataset", "synthetic:cora", "--epochs", "3", "--dropout", "0",
            "--device", "cuda", "--no-progress"]
    out = io.StringIO()
    captured = train(p.parse_args(argv), out=out)
    eager = train(p.parse_args(argv + ["--no-capture"]), out=io.StringIO())
    assert captured["captured"] and not eager["captured"]
    assert abs(captured["test_acc"] - eager["test_acc"]) < 0.02
