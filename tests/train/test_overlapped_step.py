"""The overlapped captured step (``CapturedStep(overlap=True)``) on the CPU, with CUDA graphs
and streams stood in: a graph's capture runs its function (standing for the first replay),
a later replay runs it again and copies its results into the tensors the capture returned,
as a real replay rewrites them in place.  What this checks is the step's own logic: the
sampling-and-blocks graph, the twin the step's graph reads and its refill, the sizes read
after the build on fitted capacities, the eager step on grown capacities and the graphs
captured again after it, the seeds fed on the sampling stream.  The same losses and
parameters as the plain eager steps, batch after batch.  The CUDA run of the same is in
``test_captured_step.py``."""
import contextlib
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from hector import Graph
from hector.loader import NeighborLoader
from hector.train import captured
from hector.train.captured import CapturedStep
from hector.train.minibatch import captured_epoch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loader"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_captured_step import TwoLayers, graph_with_loops, relational_net  # noqa: E402
from test_neighbor_loader import hetero_graph  # noqa: E402


def _copy_into(dst, src):
    """``src``'s tensors copied into ``dst``'s, walking both alike."""
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, Graph):
        for k, v in vars(dst).items():
            if k not in ("_derived", "_device_copies", "_attention_op_handle"):
                _copy_into(v, vars(src)[k])
    elif dataclasses.is_dataclass(dst):
        for f in dataclasses.fields(dst):
            _copy_into(getattr(dst, f.name), getattr(src, f.name))
    elif isinstance(dst, (list, tuple)):
        for a, b in zip(dst, src):
            _copy_into(a, b)
    elif isinstance(dst, dict):
        for k in dst:
            _copy_into(dst[k], src[k])


class _Graph:
    def __init__(self, fn, out, before):
        self.fn, self.out, self.before, self.replays = fn, out, before, 0

    def replay(self):
        self.replays += 1
        if self.replays > 1:           # (the capture ran the first)
            self.before()
            _copy_into(self.out, self.fn())


class _Stream:
    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass


class _Event:
    def record(self, stream=None):
        pass


def _stand_in(monkeypatch, step_of):
    main = _Stream()
    monkeypatch.setattr(captured, "_capture_choice", lambda loader, capture: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: main)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def fresh_step():
        # A step's capture starts from no gradients, so each replay writes fresh ones; and a
        # real replay derives the blocks' structures (CSRs by source, the twin with self
        # loops) anew from the refilled arrays: here they are derived again.
        step = step_of()
        step.optimizer.zero_grad(set_to_none=True)
        for block in step._twin[0]:
            block._derived.clear()

    def fake_captured(loader, fn):
        out = fn()
        return _Graph(fn, out, fresh_step if loader is None else lambda: None), out
    monkeypatch.setattr(captured, "_captured", fake_captured)


def _run(make_model, graph, x, y, fit, overlapped, monkeypatch, epoch, inputs=None):
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = NeighborLoader(graph, [3, 2], input_nodes=inputs, batch_size=12, shuffle=True,
                            seed=5, static=True)
    if overlapped:
        with monkeypatch.context() as m:
            _stand_in(m, lambda: step)
            step = CapturedStep(model, opt, loader, x, y, fit=fit, margin=1.0, overlap=True)
            if epoch:
                losses = [captured_epoch(step)]
            else:
                losses = [float(step.step(s, c)) for s, c in loader.seed_batches()]
            assert step.replays > 0
            assert step.replays + step.eager_steps == len(loader)
            if fit:
                assert step.grown > 0      # (margin 1: some batch outgrew the capacities)
    else:
        step = CapturedStep(model, opt, loader, x, y, capture=False, fit=fit, margin=1.0)
        if epoch:
            losses = [captured_epoch(step)]
        else:
            losses = [float(step.step(s, c)) for s, c in loader.seed_batches()]
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("kind,fit,epoch", [("gat", False, False), ("gat", True, True),
                                            ("rgcn", True, False), ("rgat", False, True)])
def test_overlapped_steps_train_like_eager_ones(kind, fit, epoch, monkeypatch):
    if kind == "gat":
        graph = graph_with_loops(num_nodes=120, num_edges=900)
        make, inputs = (lambda: TwoLayers("gat", "torch")), None
    else:
        graph = hetero_graph()
        make = lambda: relational_net(kind, graph, False)        # noqa: E731
        inputs = torch.arange(graph.num_nodes)[graph.node_type.long() == 1]
    x = torch.randn(graph.num_nodes, 6)
    y = torch.randint(0, 3, (graph.num_nodes,))
    ref = _run(make, graph, x, y, fit, False, monkeypatch, epoch, inputs)
    got = _run(make, graph, x, y, fit, True, monkeypatch, epoch, inputs)
    torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(got[1], ref[1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_overlap_needs_a_captured_step():
    graph = graph_with_loops()
    model = TwoLayers("gat", "torch")
    x, y = torch.randn(graph.num_nodes, 6), torch.zeros(graph.num_nodes, dtype=torch.long)
    loader = NeighborLoader(graph, [2], batch_size=4, static=True)
    with pytest.raises(ValueError, match="overlap=True needs a captured step"):
        CapturedStep(model, torch.optim.Adam(model.parameters()), loader, x, y, overlap=True)
    assert not CapturedStep(model, torch.optim.Adam(model.parameters()), loader, x, y).overlap


def test_a_captured_step_overlaps_unless_told_not_to(monkeypatch):
    graph = graph_with_loops()
    model = TwoLayers("gat", "torch")
    x, y = torch.randn(graph.num_nodes, 6), torch.zeros(graph.num_nodes, dtype=torch.long)
    loader = NeighborLoader(graph, [2], batch_size=4, static=True)

    def make():
        return CapturedStep(model, torch.optim.Adam(model.parameters()), loader, x, y)
    monkeypatch.setattr(captured, "_capture_choice", lambda loader, capture: True)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    assert make().overlap
    monkeypatch.setenv("HECTOR_OVERLAP", "0")
    assert not make().overlap
