"""Int handles naming host objects (a ``Graph``, a ``WeightedCSR``) for hector's custom ops.

A custom operator's schema takes tensors and scalars, not Python objects, so an op names the
graph it runs on by an int.  The handle is memoised on the object (:func:`new_mark`) and the
table maps it back weakly: mini-batch training makes a graph per batch, and a freed one's
entry goes with it, so the table is as large as the live objects.  Handles are never reused.

Eagerly a mark is trusted only if the table maps it back to this very object: a deep copy or
an unpickled object carries a copy of its original's mark and gets a handle of its own.
Under ``torch.compile`` the mark is read as it is: dynamo cannot trace the weak table, and it
guards on the mark's value, so a different object recompiles rather than reusing a handle.

A traced handle must be a constant, never a SymInt: the fake implementations look the object
up to size their outputs, and a symbolic int names none.  Dynamo makes an int symbolic once
it has seen two values of it at one place (automatic dynamic shapes), and places repeat: a
layer compiled on a second graph reads the same attribute path of its argument; where dynamo
keys that state by code object alone, not by closure too (pytorch#173512), all layers whose
``forward`` one decorator wraps share it; ``dynamic=True`` makes ints symbolic from the
start.  So the mark also holds the handle's digits, and traced code reads the handle as
``int`` of them: dynamo never makes a string symbolic, so it guards on the string's value
and folds ``int`` into a constant (:func:`traced_handle`).  For the same reason an object
first named under tracing is registered outside the trace (:func:`register_untraced`: a
graph break) by a statement of its own before the op call (:meth:`HandleTable.prepare`),
which then reads the new mark: a handle returned across the break would reach the resumed
frame as a local, made symbolic the same way.
"""
from __future__ import annotations
import itertools
import weakref
from typing import Callable
import torch


def new_mark(handle: int) -> tuple:
    """What is memoised on an object for ``handle``: the int (read eagerly) and its digits
    (read under tracing: :func:`traced_handle`)."""
    return (handle, str(handle))


def traced_handle(mark: tuple) -> int:
    """The handle of ``mark`` as traced code reads it: parsed from its digits, so dynamo
    guards on a string and passes the ops a constant int (module docstring)."""
    return int(mark[1])


@torch.compiler.disable
def register_untraced(register: Callable, *args) -> None:
    """``register(*args)`` run eagerly from traced code (a graph break): it makes a handle
    and memoises its mark, which the caller then reads with :func:`traced_handle`."""
    register(*args)


class HandleTable:
    def __init__(self, attr: str, what: str):
        self._attr, self._what = attr, what
        self._objects: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
        self._next = itertools.count(1)

    def handle(self, obj) -> int:
        """The int naming ``obj`` (made and memoised on ``obj`` on first use)."""
        mark = getattr(obj, self._attr, None)
        if torch.compiler.is_compiling():
            if mark is None:        # (op call sites prepare() first: this is a fallback)
                register_untraced(self._register, obj)
                mark = getattr(obj, self._attr)
            return traced_handle(mark)
        if mark is not None and self._objects.get(mark[0]) is obj:
            return mark[0]
        return self._register(obj)

    def prepare(self, obj) -> None:
        """Under ``torch.compile``: ``obj``'s handle made now, outside the trace, if it has
        none.  A statement of the frame that then passes :meth:`handle` to an op: the graph
        break it makes returns nothing to that frame, so the handle is read from its mark,
        a constant (module docstring); eagerly nothing."""
        if torch.compiler.is_compiling() and getattr(obj, self._attr, None) is None:
            register_untraced(self._register, obj)

    def _register(self, obj) -> int:
        handle = next(self._next)
        object.__setattr__(obj, self._attr, new_mark(handle))   # frozen dataclasses too
        self._objects[handle] = obj
        return handle

    def get(self, handle: int):
        """The live object named by ``handle``; a clear error if it is unknown or freed."""
        try:
            obj = self._objects.get(handle)
        except TypeError:         # (a SymInt is unhashable)
            raise TypeError(f"hector: a {self._what} handle must be a plain int, got "
                            f"{type(handle).__name__} {handle} (traced code reads a handle "
                            "with handles.traced_handle)") from None
        if obj is None:
            raise RuntimeError(f"hector: {self._what} handle {handle} is unknown or its "
                               f"{self._what} was freed")
        return obj

    def __len__(self) -> int:
        return len(self._objects)
