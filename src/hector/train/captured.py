"""A mini-batch training step captured once as one CUDA graph and replayed for every batch:
sampling, the blocks, the feature and label gathers, forward, loss, backward and the
optimizer step, with no host work per batch beyond copying the seeds in and launching the
graph.

What makes one graph serve every batch: the loader samples into static-capacity buffers
(``NeighborLoader(static=True)``), the blocks are capacity blocks whose sizes are those
capacities (:mod:`hector.graph.capacity`), and the loss is the mean over the batch's valid
seeds, whose count lives in device memory.  A short last batch is padded; padding rows and
the blocks' sink nodes reach no valid seed, so they change neither the loss nor a gradient.

The first ``WARMUP`` batches run the same step eagerly (they compile and tune the kernels
for the capacities' shapes and create the optimizer's state); the next is captured and
replayed, and so is every later one.  The optimizer step is inside the graph when every
parameter group is ``capturable`` (``torch.optim.Adam(..., capturable=True)``), else it runs
eagerly after each replay.  A captured optimizer step keeps the hyper-parameters it was
captured with: a learning-rate schedule reaches it only through a tensor ``lr`` (torch.optim
accepts one), not by assigning a new float to ``param_groups``.

Fitted capacities (``fit=True``): the worst-case capacities are mostly padding on sparse
graphs (docs/perf-notes.md), and the step's kernels walk all of it.  With ``fit``, the
sampling is one graph and the rest of the step another, built on blocks of capacities
fitted to the batches seen (``Capacities.fitted``, a margin on top).
Between the two replays the batch's sizes are read back (one small read; the host then
waits for the sampling, not for the step): a batch the blocks would not hold grows the
capacities and runs eagerly on the new ones, and the next batch captures the step again
(:attr:`CapturedStep.grown` counts the growths).  Nothing is ever cut.

Overlapped (``overlap=True``, the default where the step is captured; ``HECTOR_OVERLAP=0``
turns it off): the batch's sampling and blocks are one graph, replayed on a stream of their
own, and the forward, backward and
optimizer step another, on the caller's stream.  The step's graph reads a twin of the
blocks (:mod:`hector.graph.twin`) refilled from the sampled ones by a few copies, so the
next batch is sampled and built while the GPU still runs this one's step: a batch costs the
longer of the two, not their sum.  What the step derives from its blocks through a recipe
(:func:`hector.graph.twin.prederive`: GAT's and AGNN's blocks with self loops, the
compiled layers' traversal CSRs and derived attention graphs, HGT's one-type view) is
built with the blocks, on the sampling stream.  With ``fit``, the blocks are built before
the batch's sizes are read (on capacities that may not hold it: the build stays in bounds
and a batch that does not fit runs eagerly on grown capacities, as above).  The overlap
needs the next batch's seeds made on the sampling stream: iterate
:meth:`CapturedStep.seed_batches` (as ``hector train``'s epoch does) or make them inside
:meth:`CapturedStep.feeding`; seeds made on the caller's stream are waited for, correct but
sequential.

:class:`CapturedInference` does the same for sampled inference: sampling, blocks, gather and
forward as one graph per batch, the logits written into the seeds' rows of one table.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ..graph.twin import prederive, twin
from .distributed import average_gradients

#: Eager steps before the capture (side-stream warm-up, as torch's CUDA-graph docs advise).
WARMUP = 2


def masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor,
                         count: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the first ``count`` rows (a 0-d device tensor)."""
    mask = torch.arange(logits.shape[0], device=logits.device) < count
    loss = F.cross_entropy(logits.float(), labels, reduction="none")
    return torch.where(mask, loss, 0.0).sum() / count.clamp(min=1)


def _capture_choice(loader, capture: Optional[bool]) -> bool:
    """Whether to capture (default: on CUDA), after checking the loader is static."""
    if loader.static is None:
        raise ValueError("loader must be a NeighborLoader(static=True)")
    on_cuda = loader.graph.device.type == "cuda"
    if capture and not on_cuda:
        raise ValueError("capture=True needs the graph on a CUDA device")
    return on_cuda if capture is None else bool(capture)


def _side_stream(fn):
    """``fn()`` on a side stream (eager steps among captured ones, as torch's CUDA-graph
    docs advise for warm-ups)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = fn()
    torch.cuda.current_stream().wait_stream(stream)
    return out


def _captured(loader, fn):
    """(``fn()`` captured as a CUDA graph, its result): the graph replays ``loader``'s
    sampling anew (its generator registered; ``loader`` None: the graph samples nothing)."""
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    if loader is not None and hasattr(g, "register_generator_state"):   # (the sampler's
        g.register_generator_state(loader.generator)                     # torch path)
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def overlap_by_default() -> bool:
    """Whether a captured step overlaps unless told (default yes; ``HECTOR_OVERLAP=0``: no)."""
    return os.environ.get("HECTOR_OVERLAP", "1") not in ("", "0")


def _recorded(stream) -> torch.cuda.Event:
    """An event recorded on ``stream`` now."""
    event = torch.cuda.Event()
    event.record(stream)
    return event


class CapturedStep:
    """``step(seeds, count)``: one optimizer step on the batch of ``seeds[:count]`` (as
    ``NeighborLoader.seed_batches`` yields them), returning its loss as a 0-d device tensor.

    Args:
        model: called as ``model(x_b, blocks, n_id=n_id)``, returning one row of logits per
            seed slot (``hector train``'s networks do).  A ``DistributedDataParallel`` (each
            rank with its share of the seeds: ``NeighborLoader(num_parts=, part=)``): its
            module runs the step, and the gradients are averaged over the ranks after it,
            outside the graph (:func:`hector.train.distributed.average_gradients`), before
            the optimizer's step.
        optimizer: its step runs inside the graph when every group is capturable (and the
            model is not distributed).
        loader: a ``NeighborLoader(static=True)`` (relations and node types: its blocks are
            relational capacity blocks, which RGCN and RGAT run on).
        x: node features (``None``: featureless, the model embeds ``n_id``); y: labels.
        loss: ``loss(logits, labels, count)``, default :func:`masked_cross_entropy`.
        capture: False runs every step eagerly (the same computation; the only choice on
            the CPU, the default there).
        fit: blocks of capacities fitted to the batches seen, grown when a batch needs more
            (see the module's docstring); ``margin``: their headroom (1.25: a quarter more
            than the largest batch seen).
        overlap: the next batch sampled and built while this one's step runs (see the
            module's docstring); default: on where the step is captured, unless
            ``HECTOR_OVERLAP=0``.
    """

    def __init__(self, model, optimizer, loader, x: Optional[torch.Tensor], y: torch.Tensor,
                 loss: Callable = masked_cross_entropy, capture: Optional[bool] = None,
                 fit: bool = False, margin: float = 1.25, overlap: Optional[bool] = None):
        graph = loader.graph
        self.capture = _capture_choice(loader, capture)
        if overlap and not self.capture:
            raise ValueError("overlap=True needs a captured step (capture on a CUDA graph)")
        self.overlap = (self.capture and overlap_by_default()) if overlap is None \
            else bool(overlap)
        #: The distributed wrapper (its module is what runs), or None.
        self.ddp = model if isinstance(model, DistributedDataParallel) else None
        self.model = model.module if self.ddp is not None else model
        self.optimizer, self.loader = optimizer, loader
        self.x, self.y, self.loss_fn = x, y, loss
        self.in_graph_optimizer = self.ddp is None and all(
            g.get("capturable", False) for g in optimizer.param_groups)
        dev = graph.device
        self.seeds = torch.zeros(loader.batch_size, dtype=torch.int64, device=dev)
        self.count = torch.zeros((), dtype=torch.int64, device=dev)
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.loss: Optional[torch.Tensor] = None
        self.steps = 0
        #: Eager steps and graph replays so far.
        self.eager_steps = self.replays = 0
        if not margin >= 1.0:
            raise ValueError(f"margin must be >= 1, got {margin}")
        self.fit, self.margin = bool(fit), float(margin)
        #: The fitted capacities (``fit``), and how many times a batch made them grow.
        self.caps = None
        self.grown = 0
        self._sampling: Optional[torch.cuda.CUDAGraph] = None
        self._sb = self._blocks = self._n_id = None
        # (overlap) The sampling stream, the sampling-and-blocks graph and its outputs, the
        # step's twin of them and its refill, and the event after which the sampled
        # buffers are free again (the twin has taken them).
        self._prep = torch.cuda.Stream() if self.overlap else None
        self._pgraph: Optional[torch.cuda.CUDAGraph] = None
        self._prepared = self._twin = self._refill = self._free = None
        self._fed = False

    def _fit_to(self, sb) -> bool:
        """(``fit``) Read the batch's sizes and grow the capacities if they do not hold it;
        whether they changed."""
        sizes = sb.sizes()
        if self.caps is not None and self.caps.holds(sizes):
            return False
        if self.caps is not None:
            self.grown += 1
        self.caps = self.loader.static.caps.fitted(sizes, self.margin, at_least=self.caps)
        return True

    def _prepare(self, sb=None) -> tuple:
        """(blocks, n_id, seeds, count) of the batch in ``self.seeds``: sampled unless
        ``sb`` is given, its sizes read first where the capacities are fitted."""
        if sb is None:
            sb = self.loader.static.sample(self.seeds, self.count)
            if self.fit:
                self._fit_to(sb)
        return self._build(sb) + (self.seeds, self.count)

    def _build(self, sb) -> tuple:
        caps = self.caps if self.fit else None
        return sb.capacity_blocks(self.loader.graph, caps), sb.n_id_of(caps)

    def _sample_and_build(self) -> tuple:
        """(sb, blocks, n_id): an overlapped step's first graph, on the capacities as they
        are (where they are fitted, the batch's sizes are read after it).  The blocks'
        derivations with a recipe that the last step's blocks hold (a GAT block's twin
        with self loops, the traversal CSRs, ...) are made here too, off the step's
        stream."""
        sb = self.loader.static.sample(self.seeds, self.count)
        blocks, n_id = self._build(sb)
        if self._blocks is not None:
            prederive(blocks, like=self._blocks)
        return sb, blocks, n_id

    def _forward_backward(self, sb=None, prepared=None) -> torch.Tensor:
        blocks, n_id, seeds, count = prepared if prepared is not None else self._prepare(sb)
        x_b = None if self.x is None else self.x.index_select(0, n_id)
        logits = self.model(x_b, blocks, n_id=n_id)
        loss = self.loss_fn(logits, self.y.index_select(0, seeds), count)
        loss.backward()
        # The captured blocks stay alive with the step: hector's ops name their graphs by
        # handles that live as long as the graph does.
        self._blocks, self._n_id = blocks, n_id
        return loss.detach()

    def _average(self) -> None:
        """(distributed) The gradients averaged over the ranks, outside any graph."""
        if self.ddp is not None:
            average_gradients(self.ddp, self._n_id)

    def _eager(self, sb=None) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._forward_backward(sb)
        self._average()
        self.optimizer.step()
        self.eager_steps += 1
        return loss

    def _step_graph(self, sb=None, prepared=None):
        """The step (on ``sb``'s buffers, or sampling too) as one graph; its loss."""
        loss = self._forward_backward(sb, prepared)
        if self.in_graph_optimizer:
            self.optimizer.step()
        return loss

    def _replay(self, sb=None, prepared=None) -> torch.Tensor:
        """The step's graph replayed, captured first if there is none yet (``prepared``:
        on those blocks, sampling nothing)."""
        if self.graph is None:
            self.optimizer.zero_grad(set_to_none=True)
            self.graph, self.loss = _captured(
                self.loader if prepared is None else None,
                lambda: self._step_graph(sb, prepared))
        self.graph.replay()
        if not self.in_graph_optimizer:
            self._average()
            self.optimizer.step()
        self.replays += 1
        return self.loss.clone()

    def _fitted_step(self) -> torch.Tensor:
        """A captured step with fitted capacities: the sampling replayed, the sizes read,
        then the step replayed, or (capacities grown) run eagerly and captured again next."""
        if self._sampling is None:
            self._sampling, self._sb = _captured(
                self.loader, lambda: self.loader.static.sample(self.seeds, self.count))
        self._sampling.replay()
        if self._fit_to(self._sb):
            self.graph = self._blocks = None      # (the old step's graph and memory go)
            return _side_stream(lambda: self._eager(self._sb))
        return self._replay(self._sb)

    @contextlib.contextmanager
    def feeding(self):
        """Make the next batch's seeds inside this block (``NeighborLoader.seed_batches``'
        next item) for an overlapped step: their kernels then run on the sampling stream,
        and the step samples them without waiting for the caller's stream, which still
        runs the previous batch's step.  A no-op where the step does not overlap."""
        if self._prep is None:
            yield
            return
        with torch.cuda.stream(self._prep):
            yield
        self._fed = True

    def seed_batches(self):
        """The loader's ``(seeds, count)`` batches (``NeighborLoader.seed_batches``), each
        made inside :meth:`feeding`: ``for seeds, count in step.seed_batches():
        step.step(seeds, count)`` overlaps every batch's sampling with the step before."""
        batches = self.loader.seed_batches()
        while True:
            with self.feeding():
                batch = next(batches, None)
            if batch is None:
                return
            yield batch

    def step(self, seeds: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """One optimizer step on ``seeds[:count]``; its loss, on the caller's stream."""
        if not isinstance(seeds, torch.Tensor) or seeds.shape != self.seeds.shape:
            raise ValueError(f"seeds must be a [batch_size={self.seeds.numel()}] tensor (pad a "
                             f"short batch; NeighborLoader.seed_batches does), got "
                             f"{getattr(seeds, 'shape', type(seeds).__name__)}")
        if not isinstance(count, torch.Tensor) or count.dim() != 0:
            raise ValueError("count must be a 0-d tensor (the batch's real seeds)")
        fed, self._fed = self._fed, False
        self.steps += 1
        if self.overlap and self.steps > WARMUP:
            return self._overlapped_step(seeds, count, fed)
        if fed:           # (seeds made on the sampling stream, used on this one)
            torch.cuda.current_stream().wait_stream(self._prep)
        self.seeds.copy_(seeds)
        self.count.copy_(count)
        if not self.capture:
            return self._eager()
        loss = (_side_stream(self._eager) if self.steps <= WARMUP else
                self._fitted_step() if self.fit else self._replay())
        if self._prep is not None:   # (the first overlapped step's sampling waits for this)
            self._free = _recorded(torch.cuda.current_stream())
        return loss

    def _overlapped_step(self, seeds, count, fed: bool) -> torch.Tensor:
        """The sampling-and-blocks graph replayed on the sampling stream (it may start while
        the caller's stream still runs the previous step), the sizes read there (``fit``),
        then the step's twin refilled and its graph replayed on the caller's stream."""
        main, prep = torch.cuda.current_stream(), self._prep
        if not fed:
            prep.wait_stream(main)
        if self._free is not None:          # (the twin has taken the last batch)
            prep.wait_event(self._free)
        with torch.cuda.stream(prep):
            self.seeds.copy_(seeds)
            self.count.copy_(count)
            if self._pgraph is None:
                self._pgraph, self._prepared = _captured(self.loader, self._sample_and_build)
            self._pgraph.replay()
            sb, blocks, n_id = self._prepared
            grown = self.fit and self._fit_to(sb)        # (reads the sizes: waits for prep)
        main.wait_stream(prep)
        if grown:   # (this batch on grown capacities, eagerly; both graphs captured again)
            self.graph = self._pgraph = self._prepared = self._twin = self._refill = None
            loss = _side_stream(lambda: self._eager(sb))
            self._free = _recorded(main)
            return loss
        if self.graph is None:
            self._twin, self._refill = twin((blocks, n_id, self.seeds, self.count))
        self._refill()
        self._free = _recorded(main)
        return self._replay(prepared=self._twin)


class CapturedInference:
    """Sampled inference with each batch one replayed CUDA graph: sampling, blocks, the
    feature gather and the forward, the batch's logits written into the seeds' rows of one
    output table.  What ``hector train`` evaluates with when the full graph's forward would
    not fit; ``__call__()`` returns the logits of the loader's input nodes (other rows zero),
    every call drawing the same neighbourhoods (the sampler's seed is restored first).

    Args:
        model: called as ``model(x_b, blocks, n_id=n_id)`` (in the mode of the calls: keep
            it in ``eval()``, as the captured graph keeps the mode it was captured in).
        loader: a ``NeighborLoader(static=True)`` over the nodes to predict.
        x: node features, or None (featureless); ``num_classes``: the logits' width.
        capture: as :class:`CapturedStep` (the CPU runs every batch eagerly).
    """

    def __init__(self, model, loader, x: Optional[torch.Tensor], num_classes: int,
                 capture: Optional[bool] = None):
        graph = loader.graph
        self.capture = _capture_choice(loader, capture)
        self.model, self.loader, self.x = model, loader, x
        dev, n = graph.device, graph.num_nodes
        self.seeds = torch.zeros(loader.batch_size, dtype=torch.int64, device=dev)
        self.count = torch.zeros((), dtype=torch.int64, device=dev)
        # One spare row past the nodes: a short batch's padded seed slots write there.
        self.out = torch.zeros(n + 1, num_classes, device=dev)
        self._slots = torch.arange(loader.batch_size, device=dev)
        # Where the sampler draws from a torch.Generator (the CPU without Triton's
        # interpreter) its state is the seed: both are restored before every call.
        self._seed0 = loader.static.seed.clone()
        self._state0 = loader.static.generator.get_state()
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.batches = self.replays = 0

    def _forward(self) -> None:
        sb = self.loader.static.sample(self.seeds, self.count)
        blocks = sb.capacity_blocks(self.loader.graph)
        n_id = sb.n_id
        x_b = None if self.x is None else self.x.index_select(0, n_id)
        logits = self.model(x_b, blocks, n_id=n_id).float()
        rows = torch.where(self._slots < self.count, self.seeds, self.out.shape[0] - 1)
        self.out.index_copy_(0, rows, logits)
        self._blocks = blocks      # (alive with the graph, as CapturedStep's)

    @torch.no_grad()
    def __call__(self) -> torch.Tensor:
        """``[num_nodes, num_classes]`` logits (a view of a buffer the next call rewrites)."""
        self.loader.static.seed.copy_(self._seed0)
        self.loader.static.generator.set_state(self._state0)
        self.out.zero_()
        for seeds, count in self.loader.seed_batches():
            self.seeds.copy_(seeds)
            self.count.copy_(count)
            self.batches += 1
            if not self.capture:
                self._forward()
            elif self.batches <= WARMUP:
                _side_stream(self._forward)
            else:
                if self.graph is None:
                    self.graph, _ = _captured(self.loader, self._forward)
                self.graph.replay()
                self.replays += 1
        return self.out[:-1]
