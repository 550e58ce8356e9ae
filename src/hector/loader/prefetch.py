"""Building the next mini-batches in a background thread while the caller computes on the current
one (``NeighborLoader(prefetch=k)``).

Sampling and block builds are torch ops, which release the GIL while they run, so a thread
overlaps them with the training step's own host work and kernels.  One thread produces the
batches in order, with the loader's own generators, so they are the batches an iteration
without prefetching yields.  The thread stops when the iteration ends, fails, or is dropped
(the consuming generator's ``finally`` runs when it is closed or collected).
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Iterable, Iterator, Optional

import torch

#: Name of the producing threads (tests look for live ones).
THREAD_NAME = "hector-loader-prefetch"
#: How often (seconds) a producer blocked on a full queue checks whether it should stop.
POLL_S = 0.05

_END = object()


def prefetched(source: Iterable, depth: int, device: Optional[torch.device] = None) -> Iterator:
    """The items of ``source``, produced by a thread at most ``depth`` items ahead; with a
    CUDA ``device``, the thread makes it its current device (a new thread starts on device 0,
    which is not the graph's on rank 1 of a multi-GPU run)."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(entry) -> bool:
        """Put ``entry`` unless told to stop first; whether it was put."""
        while not stop.is_set():
            try:
                items.put(entry, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        on_device = (torch.cuda.device(device) if device is not None and device.type == "cuda"
                     else contextlib.nullcontext())
        try:
            with on_device:
                for item in source:
                    if not offer((item, None)):
                        return
            offer((_END, None))
        except BaseException as err:        # handed to the consumer, raised there
            offer((None, err))

    worker = threading.Thread(target=produce, name=THREAD_NAME, daemon=True)
    worker.start()
    try:
        while True:
            item, err = items.get()
            if err is not None:
                raise err
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        worker.join()
