"""Launch counts of a layer call, countable on any device: every operator that reaches the
dispatcher below autograd (an aten op is one kernel on a GPU, or none for a view; a
``hector::`` op is one opaque custom operator that launches its own one to four Triton
kernels).  Counted with a ``TorchDispatchMode``, separately for the forward and the backward
of one training step.  On CUDA, ``scripts/gpu_capture_check.py`` counts real kernels with the
profiler."""
from __future__ import annotations

from collections import Counter
from typing import Callable, Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ..device import interpreting

#: aten ops that launch nothing (metadata only).
_NO_KERNEL = {"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t",
              "squeeze", "unsqueeze", "slice", "select", "alias", "as_strided", "detach",
              "split", "split_with_sizes", "unbind", "empty", "empty_like", "new_empty",
              "empty_strided", "lift_fresh", "_to_copy_noop"}


class OpCounter(TorchDispatchMode):
    """Counts dispatched operators by name, ``hector::`` custom ops as one each.  Under
    Triton's interpreter a kernel launched outside a custom op (the traversal family) counts
    as one ``triton::<kernel>`` launch; the interpreter's own tensor copies inside it are not
    launches and are not counted."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self._unpatch = None
        self.inside_op = False

    def __enter__(self):
        if interpreting():
            from triton.runtime.interpreter import GridExecutor   # only under the interpreter
            real, ops, counter = GridExecutor.__call__, self.ops, self

            def launch(executor, *args, **kwargs):
                if not counter.inside_op:          # a custom op's kernels count as the op
                    ops[f"triton::{getattr(executor.fn, '__name__', 'kernel')}"] += 1
                with _disable_current_modes():
                    return real(executor, *args, **kwargs)
            GridExecutor.__call__ = launch
            self._unpatch = lambda: setattr(GridExecutor, "__call__", real)
        return super().__enter__()

    def __exit__(self, *exc):
        if self._unpatch is not None:
            self._unpatch()
            self._unpatch = None
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        name = f"{func.namespace}::{packet.__name__}"
        if func.namespace == "hector" or packet.__name__ not in _NO_KERNEL:
            self.ops[name] += 1
        if func.namespace != "hector":
            return func(*args, **(kwargs or {}))
        self.inside_op = True
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.inside_op = False


def count_step(forward: Callable[[], torch.Tensor]) -> Dict[str, Counter]:
    """{'forward': ops, 'backward': ops} of ``forward()`` and a backward of its sum."""
    with OpCounter() as fwd:
        out = forward()
        loss = out.sum()
    with OpCounter() as bwd:
        loss.backward()
    return {"forward": fwd.ops, "backward": bwd.ops}


def total(ops: Counter) -> int:
    return sum(ops.values())
