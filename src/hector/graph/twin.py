"""Blocks twinned into buffers of their own, and the copies that refill the twins.

An overlapped mini-batch step (:class:`hector.train.captured.CapturedStep`) samples and
builds the next batch's blocks while the GPU still runs the current batch's step.  The step's
CUDA graph reads one fixed set of buffers, so the new blocks are built into another set and
copied into the step's once the step before is done with them: a few launches (one copy per
dtype) instead of the sampler's and the blocks' several hundred kernels on the step's path.

:func:`twin` makes the step's set: the same objects (graphs, their index records, device
bounds, capacities), every tensor cloned.  Of what a graph derives on use, the derivations
with a recipe (:data:`hector.graph.graph.RECIPES`: a GAT block's twin with self loops, the
traversal CSRs, the attention's derived graphs, HGT's one-type view) are twinned too; the
rest is left out, and the step derives it from the twin's own arrays.  An object it does
not know raises: a tensor shared between the two sets would be read by the step while the
next batch rewrites it.

:func:`prederive` makes on a new batch's blocks the recipe derivations that the blocks of an
earlier step hold: the overlapped step runs it with the sampling, so those derivations'
kernels leave the step's stream and the refill copies their results like the blocks'.
"""
from __future__ import annotations

import dataclasses
from typing import List, Tuple

import torch

from .graph import Graph, recipe_name

#: Values a twin shares with its original: nothing in them is ever written.
_SHARED = (int, float, bool, str, type(None), torch.device, torch.dtype)
#: A graph's entries the twin starts empty: derived structures (rebuilt on first use, from
#: the twin's arrays; but those with a recipe), its copies on other devices, the custom
#: ops' handle mark.
_FRESH = ("_derived", "_device_copies", "_attention_op_handle")


class Refill:
    """Copies every original tensor into its twin: one ``torch._foreach_copy_`` per dtype."""

    def __init__(self, pairs: List[Tuple[torch.Tensor, torch.Tensor]]):
        groups: dict = {}
        for dst, src in pairs:
            d, s = groups.setdefault(dst.dtype, ([], []))
            d.append(dst)
            s.append(src)
        self.groups = list(groups.values())
        self.pairs = len(pairs)

    @torch.no_grad()
    def __call__(self) -> None:
        for dsts, srcs in self.groups:
            torch._foreach_copy_(dsts, srcs)


def twin(obj) -> Tuple[object, Refill]:
    """(``obj`` with every tensor it reaches cloned, the :class:`Refill` that copies the
    originals' values into those clones).  ``obj``: graphs, the index records in them
    (dataclasses), lists, tuples and dicts of those, tensors, plain values."""
    memo: dict = {}
    pairs: list = []
    return _twin(obj, memo, pairs), Refill(pairs)


def _twin(v, memo: dict, pairs: list):
    if id(v) in memo:
        return memo[id(v)]
    if isinstance(v, torch.Tensor):
        out = v.clone()
        pairs.append((out, v))
    elif isinstance(v, Graph):
        out = object.__new__(type(v))
        memo[id(v)] = out                    # (before its fields: they may name it)
        out.__dict__.update({k: _twin(x, memo, pairs) for k, x in v.__dict__.items()
                             if k not in _FRESH})
        out._derived = {k: _twin(x, memo, pairs) for k, x in v._derived.items()
                        if recipe_name(k) is not None}
        out._device_copies = {v.device: out}
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        out = dataclasses.replace(v, **{f.name: _twin(getattr(v, f.name), memo, pairs)
                                        for f in dataclasses.fields(v) if f.init})
    elif type(v) in (list, tuple):
        out = type(v)(_twin(x, memo, pairs) for x in v)
    elif type(v) is dict:
        out = {k: _twin(x, memo, pairs) for k, x in v.items()}
    elif isinstance(v, _SHARED):
        out = v
    else:
        raise TypeError(f"twin: cannot make a separate copy of a {type(v).__name__}")
    memo[id(v)] = out
    return out


def prederive(obj, like) -> None:
    """Make on every graph in ``obj`` (graphs, lists, tuples) the recipe derivations that the
    graph in the same place of ``like`` holds, and so on into the derived graphs: what a
    step on ``like`` derived, made ahead for a step on ``obj``.  Places that differ in kind
    are left alone."""
    if isinstance(obj, Graph) and isinstance(like, Graph):
        for key, value in list(like._derived.items()):
            if recipe_name(key) is not None:
                prederive(obj.derive(key), value)
    elif type(obj) in (list, tuple) and type(like) is type(obj) and len(obj) == len(like):
        for o, k in zip(obj, like):
            prederive(o, k)
