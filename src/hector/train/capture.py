"""A full-batch training step (forward, loss, backward, optimizer step) captured once as a CUDA
graph and replayed: a full-batch GNN trains the same graph every epoch, so every launch of the
step can be recorded once and replayed with one call (no per-kernel host work).

Example::

    model = hector.train.models.build("gat", data, cfg).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.005, capturable=True)
    step = hector.train.capture_step(
        model, opt, lambda out: F.cross_entropy(out[train_idx], y[train_idx]), x, graph)
    for epoch in range(200):
        loss = step()            # replays the graph; ``loss`` is a device tensor, no sync

The inputs are captured by address: the same tensors are read on every replay (copy new
values into them to change them).  Pass a prebuilt ``hector.Graph`` (a raw ``edge_index`` works
too: its Graph is built during the warm-up).

Randomness is replayed fresh: torch's dropout and hector's attention dropout (whose seed is
drawn on the device, ``hector.kernels.attention.op.draw_seed``) use torch's CUDA generator,
which CUDA graphs advance on every replay, so each replayed step drops a new mask, and a run
is reproducible under ``torch.manual_seed``.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from ..compiler.warm import warm_graphs

WARMUP_STEPS = 3


def _check(model, optimizer, loss_fn, inputs) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if not torch.cuda.is_available():
        raise ValueError("capture_step needs CUDA (a CUDA graph); train eagerly on the CPU")
    params = [p for p in model.parameters()]
    if not params or any(p.device.type != "cuda" for p in params):
        raise ValueError("model: every parameter must be on a CUDA device for capture_step")
    for group in optimizer.param_groups:
        if "capturable" in group and not group["capturable"]:
            raise ValueError("optimizer must be built with capturable=True (e.g. "
                             "torch.optim.Adam(..., capturable=True)) to be captured")
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.device.type != "cuda":
            raise ValueError(f"inputs[{i}] is on {t.device}; captured inputs must be on CUDA")


def _one_step(model, optimizer, loss_fn, inputs):
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(*inputs))
    loss.backward()
    optimizer.step()
    return loss


def _reset_optimizer_state(optimizer, before: dict) -> None:
    """Undo the warm-up's updates of the optimizer's state *in place* (the captured graph
    records the addresses of these tensors): back to the saved values, zeros where the state
    did not exist yet (a fresh Adam state is zeros with step 0)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            saved = before.get(p)
            for key, t in optimizer.state.get(p, {}).items():
                if isinstance(t, torch.Tensor):
                    if saved is not None and key in saved:
                        t.copy_(saved[key])
                    else:
                        t.zero_()


def capture_graph(fn: Callable[[], object], warmup: int = WARMUP_STEPS,
                  reset: Optional[Callable[[], None]] = None):
    """``(graph, out)``: ``fn`` run ``warmup`` times on a side stream (lazy state: kernel
    compilation, autotuning, hector's plans and caches), then ``reset()`` (put back what the
    warm-up changed), then one call of ``fn`` captured as a ``torch.cuda.CUDAGraph``; ``out``
    is that call's result, living in the graph's memory and overwritten by each replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    # (the layers' own warm-call graphs are not made: this graph records their kernels)
    with warm_graphs(False):
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        if reset is not None:
            reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
    return graph, out


def capture_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: Callable[[torch.Tensor], torch.Tensor], *inputs,
                 warmup: int = WARMUP_STEPS) -> Callable[[], torch.Tensor]:
    """Capture ``optimizer.step()`` after ``loss_fn(model(*inputs)).backward()`` as one CUDA
    graph; returns ``step()``, which replays it and returns the loss (a device tensor
    overwritten by the next replay).

    ``warmup`` eager steps run first on a side stream (lazy state: the optimizer's moments,
    kernel compilation and autotuning, hector's plans and caches), then the parameters, the
    optimizer state and the RNG are put back, so the first replay is the first real step and
    a run matches eager training step for step (within fp tolerance).  ``step.loss`` is the
    loss tensor every replay writes (what a second captured graph may read).
    """
    _check(model, optimizer, loss_fn, inputs)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup must be an int >= 1, got {warmup!r}")
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state = {p: {k: v.detach().clone() for k, v in s.items() if isinstance(v, torch.Tensor)}
             for p, s in optimizer.state.items()}
    rng = torch.cuda.get_rng_state_all(), torch.get_rng_state()

    def reset() -> None:
        with torch.no_grad():
            for k, v in model.state_dict().items():
                v.copy_(params[k])
            _reset_optimizer_state(optimizer, state)
        torch.cuda.set_rng_state_all(rng[0])
        torch.set_rng_state(rng[1])
        optimizer.zero_grad(set_to_none=True)   # backward allocates .grad in the graph's pool
    graph, loss = capture_graph(lambda: _one_step(model, optimizer, loss_fn, inputs),
                                warmup, reset)

    def step() -> torch.Tensor:
        graph.replay()
        return loss
    step.graph, step.loss = graph, loss
    return step


__all__: Sequence[str] = ("capture_step", "capture_graph")
