"""Kernel launches of a layer call, separately for the forward and the backward of one
training step (``count_step``): what ``hector explain`` shows and tests/nn/test_launch_budget.py
pins.

Counted launches are

* every Triton kernel launch, inside a ``hector::`` custom op or not (a custom op launches
  one to four: a traversal, a combine pass, a row reduction): counted where Triton launches
  it -- ``JITFunction.run`` on a GPU, the interpreter's grid executor under
  ``TRITON_INTERPRET=1`` -- as ``triton::<kernel>``;
* every aten operator that reaches the dispatcher below autograd on the device's tensors
  (``aten::<op>``; views and allocations launch nothing and are left out; a CUDA aten op is
  about one kernel, cuBLAS may split a GEMM in two).  On the CPU, where nothing launches, the
  same operators are counted as the stand-in for the GPU kernels they would be.

The ``hector::`` custom operators are counted apart (``CallCounter.custom``): one entry per
op call, not a launch.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Dict, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ..device import interpreting

#: aten ops that launch nothing (metadata only, an allocation, or a question about dtypes:
#: ``promote_types`` / ``result_type`` take no tensor data and were counted on the CPU only).
_NO_KERNEL = {"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t",
              "squeeze", "unsqueeze", "slice", "select", "alias", "as_strided", "detach",
              "split", "split_with_sizes", "unbind", "empty", "empty_like", "new_empty",
              "empty_strided", "lift_fresh", "_to_copy_noop", "promote_types", "result_type"}


def _on_device(args, kwargs, out) -> bool:
    """Whether an op touches a non-CPU tensor (so it launches a kernel on a GPU)."""
    for value in (args, kwargs or {}, out):
        for t in torch.utils._pytree.tree_leaves(value):
            if isinstance(t, torch.Tensor) and t.device.type != "cpu":
                return True
    return False


class CallCounter(TorchDispatchMode):
    """Counts kernel launches by name (``launches``) and ``hector::`` custom op calls
    (``custom``) while active; see the module docstring."""

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.launches: Counter = Counter()
        self.custom: Counter = Counter()
        self._device_type = device_type
        self._unpatch = []

    def _patch(self, cls, attr: str, name_of) -> None:
        real, launches = getattr(cls, attr), self.launches

        def counted(obj, *args, **kwargs):
            launches[f"triton::{name_of(obj)}"] += 1
            with _disable_current_modes():     # the launcher's own tensor ops are not ops
                return real(obj, *args, **kwargs)
        setattr(cls, attr, counted)
        self._unpatch.append(lambda: setattr(cls, attr, real))

    def __enter__(self):
        self._depth = getattr(self, "_depth", 0) + 1
        if self._depth > 1:                 # re-entered around a custom op's own code
            return super().__enter__()
        if interpreting():
            from triton.runtime.interpreter import GridExecutor   # only under the interpreter
            self._patch(GridExecutor, "__call__",
                        lambda ex: getattr(ex.fn, "__name__", "kernel"))
        else:
            from triton.runtime.jit import JITFunction
            self._patch(JITFunction, "run", lambda fn: getattr(fn, "__name__", "kernel"))
        return super().__enter__()

    def __exit__(self, *exc):
        self._depth -= 1
        while self._unpatch and not self._depth:
            self._unpatch.pop()()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        if func.namespace == "hector":
            self.custom[f"hector::{packet.__name__}"] += 1
            impl = _python_impl(func)
            if impl is not None:
                # Run the op's Python body with this mode active again, so the aten work
                # inside it (allocations filled, index copies) is counted with its kernels.
                with self:
                    return impl(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        if packet.__name__ not in _NO_KERNEL and (
                self._device_type == "cpu" or _on_device(args, kwargs, out)):
            self.launches[f"{func.namespace}::{packet.__name__}"] += 1
        return out


def _python_impl(func):
    """The Python function behind a ``torch.library.custom_op`` (one for every device), or
    None where that cannot be told (then the op runs as dispatched, its inner aten work not
    counted)."""
    from torch._library import custom_ops
    opdef = custom_ops.OPDEFS.get(func._schema.name)
    if opdef is None or getattr(opdef, "_backend_fns", None):
        return None
    return getattr(opdef, "_init_fn", None)


def count_step(forward: Callable[[], torch.Tensor], device_type: str = "cpu",
               params: Iterable[torch.Tensor] = ()) -> Dict[str, Counter]:
    """Launches of ``forward()`` (``'forward'``) and of the backward of its sum
    (``'backward'``, the gradient seed included), and the custom op calls of each (``'forward_ops'``,
    ``'backward_ops'``).  Call ``forward`` once before: the first call plans, compiles and
    autotunes, which is not the steady state.  ``params`` (the layer's parameters and
    inputs) have their gradients dropped first, as a training step's
    ``zero_grad(set_to_none=True)`` does: else each gradient is counted as an ``add_`` into
    the previous one (HGT: 21 of its backward's launches were those)."""
    for p in params:
        p.grad = None
    with CallCounter(device_type) as fwd:
        out = forward()
    loss = out.sum()             # the loss is the caller's, not the layer's: not counted
    with CallCounter(device_type) as bwd:
        loss.backward()
    return {"forward": fwd.launches, "backward": bwd.launches,
            "forward_ops": fwd.custom, "backward_ops": bwd.custom}


def total(ops: Counter) -> int:
    return sum(ops.values())


def summary(ops: Counter) -> str:
    """``N kernels: triton T (name n, ...), aten A (name n, ...)``, most frequent first."""
    parts = []
    for prefix in ("triton", "aten"):
        mine = sorted(((k.split("::", 1)[1], n) for k, n in ops.items()
                       if k.startswith(prefix + "::")), key=lambda kv: (-kv[1], kv[0]))
        if mine:
            parts.append(f"{prefix} {sum(n for _, n in mine)} ("
                         + ", ".join(f"{k} {n}" for k, n in mine) + ")")
    other = sum(n for k, n in ops.items() if not k.startswith(("triton::", "aten::")))
    if other:
        parts.append(f"other {other}")
    return f"{total(ops)} kernels: " + ("; ".join(parts) or "none")
