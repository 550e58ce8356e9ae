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
from dataclasses import dataclass

import torch
import torch.distributed as dist


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


def wrap(model: torch.nn.Module, device: torch.device, unused_parameters: bool = False):
    """``DistributedDataParallel`` around ``model``.  ``unused_parameters``: the model has
    parameters its forward never reads (RGAT keeps PyG's ``mod`` weights), which DDP must
    then look for every step."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=ids, find_unused_parameters=unused_parameters)


def shutdown() -> None:
    """Leave the process group.  On the normal path every rank meets at a barrier first:
    destroying the group while a peer is still finishing its last collective can hang that
    peer (pytorch/pytorch#75097; seen once in this project's 2-process gloo test).  While an
    exception propagates (called from a ``finally``) there is no barrier: the peer may never
    arrive."""
    if dist.is_available() and dist.is_initialized():
        if sys.exc_info()[0] is None:
            dist.barrier()
        dist.destroy_process_group()
