"""Calling hector's custom operators from eager code without the dispatcher's Python layers.

Every kernel is a ``torch.library.custom_op`` so that torch.compile, fake tensors, dispatch
modes and autograd see one opaque node per launch.  In plain eager code none of that is
needed, yet a call still pays for it: the op's autograd wrapper, the redispatch and the
output checks are about 60 us of Python per call without grad and 200 us with it on a CPU
core -- next to a 10 us kernel, the largest cost of a new mini-batch's step (tens of op calls
per training step, none of them captured).

:func:`call` runs the op's own Python body directly when that is the same thing: nothing is
being traced or compiled, no dispatch mode or functorch transform is active, every tensor is
a plain ``torch.Tensor`` or parameter, and no gradient would be recorded (grad mode off, or no
input requires grad: inside the compiled plans' own autograd function, in a backward, in
inference).  Where a gradient is recorded (the attention layers' eager calls), it runs the
body inside an ``autograd.Function`` made of the op's registered formula, as torch.library's
wrapper would after its dispatch.  Otherwise it calls the op as before.  The kernels launched
are the same either way, so results are bitwise equal (tests check it).
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


def _untraced() -> bool:
    """Nothing would see the op: not compiling, no dispatch mode, no functorch transform."""
    return (not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None
            and not _TRANSFORMS())


def direct(args, kwargs=None) -> bool:
    """Whether :func:`call` may skip the dispatcher for these arguments (module docstring)."""
    grad = torch.is_grad_enabled()
    return (_untraced() and _plain(args, grad)
            and (not kwargs or _plain(tuple(kwargs.values()), grad)))


def call(op, *args, **kwargs):
    """``op(*args, **kwargs)`` for a ``torch.library.custom_op`` ``op``: its Python body
    directly where that is equivalent (:func:`direct`); where a gradient is recorded, the
    op's own autograd formula around its body (:func:`_recorded`); the dispatched op
    otherwise."""
    body = getattr(op, "_init_fn", None)
    if body is None:
        return op(*args, **kwargs)
    if direct(args, kwargs):
        return body(*args, **kwargs)
    if (torch.is_grad_enabled() and _untraced() and _plain(args, False)
            and (not kwargs or _plain(tuple(kwargs.values()), False))):
        fn = _recorded(op)
        full = _positional(op, args, kwargs) if fn is not None else None
        if full is not None:
            return fn.apply(*full)
    return op(*args, **kwargs)


_FUNCTIONS: dict = {}


def _recorded(op):
    """An ``autograd.Function`` running ``op``'s body with the formula registered for it
    (``register_autograd``'s setup_context and backward), as torch.library's own wrapper does
    after its dispatch: about 20 us a call instead of 150-200.  None for an op without a
    formula or with tensor-list arguments (its backward returns lists there, which an
    ``autograd.Function`` cannot)."""
    if op not in _FUNCTIONS:
        setup, backward = op._setup_context_fn, op._backward_fn
        schema = op._opoverload._schema
        lists = any("Tensor" in str(a.type) and "List" in str(a.type)
                    for a in (*schema.arguments, *schema.returns))
        kw_only = any(a.kwarg_only for a in schema.arguments)
        if setup is None or backward is None or lists or kw_only:
            _FUNCTIONS[op] = None
        else:
            body = op._init_fn

            def forward(ctx, *args):
                out = body(*args)
                setup(ctx=ctx, inputs=args, output=out)
                return out
            _FUNCTIONS[op] = type(f"Eager_{schema.name.replace('::', '_')}",
                                  (torch.autograd.Function,),
                                  {"forward": staticmethod(forward),
                                   "backward": staticmethod(backward)})
    return _FUNCTIONS[op]


def _positional(op, args: tuple, kwargs: dict):
    """Every schema argument in order (defaults filled in, keywords placed), or None if a
    keyword names no argument."""
    if not kwargs and len(args) == len(op._opoverload._schema.arguments):
        return args
    kwargs, out = dict(kwargs), []
    for i, a in enumerate(op._opoverload._schema.arguments):
        if i < len(args):
            out.append(args[i])
        elif a.name in kwargs:
            out.append(kwargs.pop(a.name))
        elif a.has_default_value():
            out.append(a.default_value)
        else:
            return None
    return None if kwargs else tuple(out)
