"""Calling hector's custom operators from eager code without the dispatcher's Python layers.

Every kernel is a ``torch.library.custom_op`` so that torch.compile, fake tensors, dispatch
modes and autograd see one opaque node per launch.  In plain eager code none of that is
needed, yet a call still pays for it: the op's autograd wrapper, the redispatch and the
output checks are about 60 us of Python per call without grad and 200 us with it on a CPU
core -- next to a 10 us kernel, the largest cost of a new mini-batch's step (tens of op calls
per training step, none of them captured).

:func:`call` runs the op's own Python body directly when that is the same thing: nothing is
being traced or compiled, no dispatch mode or functorch transform is active, every tensor is
a plain ``torch.Tensor`` or parameter, and no gradient would be recorded (grad mode off, or no input
requires grad: inside the compiled plans' own autograd function, in a backward, in
inference).  Otherwise it calls the op as before.  The kernels launched are the same either
way, so results are bitwise equal (a test checks it).
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

#: Tensor types whose calls need no dispatcher (a Parameter is a plain tensor that autograd
#: treats as a leaf; subclasses with their own dispatch, fake and functional tensors are not).
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_TRANSFORMS = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def _plain(args, grad: bool) -> bool:
    """Whether every tensor in ``args`` (lists one level deep) is a plain tensor that
    records no gradient."""
    for a in args:
        if isinstance(a, (list, tuple)):
            if not _plain(a, grad):
                return False
        elif isinstance(a, torch.Tensor):
            if type(a) not in _PLAIN or (grad and a.requires_grad):
                return False
    return True


def direct(args, kwargs=None) -> bool:
    """Whether :func:`call` may skip the dispatcher for these arguments (module docstring)."""
    grad = torch.is_grad_enabled()
    return (not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None
            and not _TRANSFORMS() and _plain(args, grad)
            and (not kwargs or _plain(tuple(kwargs.values()), grad)))


def call(op, *args, **kwargs):
    """``op(*args, **kwargs)`` for a ``torch.library.custom_op`` ``op``: its Python body
    directly where that is equivalent (:func:`direct`), the dispatched op otherwise."""
    body = getattr(op, "_init_fn", None)
    if body is not None and direct(args, kwargs):
        return body(*args, **kwargs)
    return op(*args, **kwargs)
