"""Sampling on a CUDA stream of its own (``NeighborLoader(sample_stream=True)``, the default
on CUDA).

Sampling reads sizes back to the host (how many candidates a hop has, how many unique
nodes): each read waits for the work queued on its stream.  On the stream the training step
runs on, that is the previous step's tail (the optimizer, and with several GPUs the gradient
all-reduce, which waits for the slowest rank): the host would sit idle until the device
drained, every batch.  On a side stream the reads wait for the sampling kernels alone, so
the host samples the next batch while the device finishes the last step, and a rank that
finished early samples instead of waiting for its peers.

The consumer's stream waits for the side stream (a device-side dependency) before each batch
is handed over, and every tensor of the batch is marked as used by the consumer's stream
(``Tensor.record_stream``), so the caching allocator does not give its memory to later
sampling while the consumer's work on it may still be queued.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator

import torch

_END = object()


def tensors_of(obj, seen=None) -> Iterator[torch.Tensor]:
    """Every tensor reachable from ``obj`` through lists, tuples, dicts, dataclass fields and
    the attributes of hector's own objects (a ``Batch``, its ``Graph`` blocks and their index
    structures); each object visited once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from tensors_of(item, seen)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from tensors_of(item, seen)
    elif dataclasses.is_dataclass(obj) or type(obj).__module__.startswith("hector."):
        for item in getattr(obj, "__dict__", {}).values():
            yield from tensors_of(item, seen)


def on_side_stream(source: Iterable, stream: "torch.cuda.Stream") -> Iterator:
    """The items of ``source``, each produced with ``stream`` as the current stream and
    handed over to the stream current when iteration started."""
    consumer = torch.cuda.current_stream(stream.device)
    stream.wait_stream(consumer)        # what sampling reads (the graph's index, the seeds)
    items = iter(source)
    while True:
        with torch.cuda.stream(stream):
            item = next(items, _END)
        if item is _END:
            return
        consumer.wait_stream(stream)
        for t in tensors_of(item):
            if t.is_cuda:
                t.record_stream(consumer)
        yield item
