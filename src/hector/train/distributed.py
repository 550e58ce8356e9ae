"""Several processes for ``hector train --devices N``: ``torch.distributed`` (NCCL on CUDA,
gloo on the CPU) and ``DistributedDataParallel``, one process per device.

``hector train --devices N`` spawns the N processes itself; under ``torchrun`` (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` in the environment) each process joins the group torchrun
set up instead, and ``--devices`` is ignored.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Dict

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class Context:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def context() -> Context:
    """This process's place in the group (rank 0 of 1 without torch.distributed)."""
    if dist.is_available() and dist.is_initialized():
        return Context(dist.get_rank(), dist.get_world_size(),
                       int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    return Context()


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init(device: torch.device, rank: int = None, world: int = None) -> Context:
    """Join the process group: from torchrun's environment, or as ``rank`` of ``world``
    (``MASTER_ADDR``/``MASTER_PORT`` set by :func:`spawn`)."""
    if not dist.is_initialized():
        if rank is None:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        if device.type == "cuda":
            torch.cuda.set_device(local)
        dist.init_process_group(backend_for(device), rank=rank, world_size=world)
    return context()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, world: int, *args) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` processes on this host."""
    import torch.multiprocessing as mp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(fn, args=(world,) + tuple(args), nprocs=world, join=True)


def share_cpu(world: int) -> int:
    """Give this process its ``1 / world`` share of the CPU threads (at least one), unless
    ``OMP_NUM_THREADS`` says otherwise; returns the count.  For processes that
    :func:`spawn` starts on one host with ``--device cpu``: each keeping torch's default (every
    core) oversubscribes the cores, and gloo's all-reduces then wait on descheduled threads
    (2 processes on 2 cores: 10.9 s per RGCN AIFB mini-batch epoch, 2.7 s with one thread
    each).  torchrun sets ``OMP_NUM_THREADS=1`` itself."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, torch.get_num_threads() // world))
    return torch.get_num_threads()


class RowSparseDDP(DDP):
    """``DistributedDataParallel`` that all-reduces node-indexed tables (an embedding
    table, the featureless RGCN layer's weights: parameters with one row per node of the
    graph) by the rows some rank's batch touched, not whole.

    A mini-batch reads the rows of its sampled nodes only, so every other row of such a
    table's gradient is zero on every rank.  DDP would all-reduce the whole table each
    step: on synthetic mag the featureless RGCN's 592 MiB (2.0 ms on two H200s) for a
    batch touching a small part of the rows.  Here DDP skips the tables
    (``_set_params_and_buffers_to_ignore_for_model``) and :meth:`sync_rows`, called
    after ``backward``, all-reduces a mask of the rows touched (one byte per row), then
    only the union's gradient rows, averaged as DDP averages (sum / world).  Rows outside
    the union are zero on every rank, so the result is DDP's."""

    def __init__(self, module, tables: Dict[str, int], **kwargs):
        type(self)._set_params_and_buffers_to_ignore_for_model(module, list(tables))
        super().__init__(module, **kwargs)
        params = dict(module.named_parameters())
        self._tables = [(params[n], d) for n, d in tables.items()]
        rows = {p.shape[d] for p, d in self._tables}
        if len(rows) != 1:
            raise ValueError(f"node tables of different row counts: {sorted(rows)}")
        self._num_rows = rows.pop()
        for p, _ in self._tables:          # DDP's start-up broadcast skips them
            dist.broadcast(p.data, 0)

    def sync_rows(self, n_id: torch.Tensor) -> None:
        """Average the tables' gradients over the ranks; ``n_id``: this rank's batch's
        global node ids (every row its forward read).  The union's rows are read back to
        the host once, after the mask's all-reduce has made the ranks meet anyway.  (A
        variant without that read, padded to ``world x NeighborLoader.max_nodes`` rows, was
        measured slower on two H200s: on synthetic mag that bound is ~5x the rows two
        batches touch; docs/perf-notes.md, "Several GPUs", 2026-11-28.)"""
        device = self._tables[0][0].device
        mask = torch.zeros(self._num_rows, dtype=torch.uint8, device=device)
        # (index_fill_, not ``mask[n_id] = 1``: that assignment synchronised on CUDA, seen by
        # scripts/ddp_step_profile.py --count-syncs, after DDP's all-reduces had started)
        mask.index_fill_(0, n_id, 1)
        dist.all_reduce(mask, op=dist.ReduceOp.MAX)
        rows = mask.nonzero().squeeze(1)
        parts = []
        for p, d in self._tables:
            if p.grad is None:            # a table this step did not reach
                p.grad = torch.zeros_like(p)
            parts.append(p.grad.index_select(d, rows))
        for (p, d), part in zip(self._tables, rank_means(parts)):
            p.grad.index_copy_(d, rows, part)


def rank_means(tensors) -> list:
    """Each tensor's mean over the ranks (new tensors of the same shapes), the whole list
    in one all-reduce of their concatenation."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat.div_(dist.get_world_size())
    sizes = [t.numel() for t in tensors]
    return [part.view(t.shape) for t, part in zip(tensors, flat.split(sizes))]


def average_gradients(ddp: DDP, n_id: torch.Tensor) -> None:
    """What ``ddp``'s backward hooks and :meth:`RowSparseDDP.sync_rows` do, for a step that
    ran ``ddp.module`` directly (a captured mini-batch step: the graph holds the forward and
    backward, and the all-reduces run after each replay, outside it): every gradient
    averaged over the ranks, the dense ones in one flat all-reduce, node tables by the rows
    the ranks' batches touched (``n_id``: this rank's batch's node ids).  Parameters no rank
    reached keep no gradient (the model's structure decides which, the same on every
    rank)."""
    tables = {id(p) for p, _ in getattr(ddp, "_tables", [])}
    dense = [p for p in ddp.module.parameters()
             if p.grad is not None and id(p) not in tables]
    if dense:
        for p, mean in zip(dense, rank_means([p.grad for p in dense])):
            p.grad.copy_(mean)
    if tables:
        ddp.sync_rows(n_id)


def wrap(model: torch.nn.Module, device: torch.device, unused_parameters: bool = False):
    """``DistributedDataParallel`` around ``model``.  ``unused_parameters``: the model has
    parameters its forward never reads (RGAT keeps PyG's ``mod`` weights), which DDP must
    then look for every step.  A model whose ``node_tables()`` names parameters with one row
    per graph node gets :class:`RowSparseDDP` (call its ``sync_rows(n_id)`` after each
    backward: ``hector.train.minibatch.train_step`` does)."""
    ids = [device.index] if device.type == "cuda" else None
    # gradient_as_bucket_view: the gradients are views into DDP's all-reduce buckets, so no
    # copy into the buckets before the all-reduce and none back after it.
    kwargs = dict(device_ids=ids, find_unused_parameters=unused_parameters,
                  gradient_as_bucket_view=True)
    tables = model.node_tables() if hasattr(model, "node_tables") else {}
    if tables:
        return RowSparseDDP(model, tables, **kwargs)
    return DDP(model, **kwargs)


def shutdown() -> None:
    """Leave the process group.  On the normal path every rank meets at a barrier first:
    destroying the group while a peer is still finishing its last collective can hang that
    peer (pytorch/pytorch#75097; seen once in this project's 2-process gloo test).  While an
    exception propagates (called from a ``finally``) there is no barrier: the peer may never
    arrive."""
    if dist.is_available() and dist.is_initialized():
        if sys.exc_info()[0] is None:
            dist.barrier()
            # Let gloo's worker thread finish destroying the barrier's work (which drops
            # Python tensors of earlier all-reduces, so it needs the GIL) before the group
            # can be destroyed: ~ProcessGroupGloo joins that thread while the destroying
            # thread holds the GIL (a DDP reducer freed at exit), a deadlock seen twice in
            # 2-process gloo tests on a loaded 2-core machine (py-spy: the main
            # thread in ~ProcessGroupGloo -> thread::join, the worker in
            # ~AsyncBarrierWork waiting for the GIL).  Sleeping releases the GIL.
            time.sleep(0.05)
        dist.destroy_process_group()
