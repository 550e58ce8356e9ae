"""Int handles naming host objects (a ``Graph``, a ``WeightedCSR``) for hector's custom ops.

A custom operator's schema takes tensors and scalars, not Python objects, so an op names the
graph it runs on by an int.  The handle is memoised on the object as ``(handle,)`` and the
table maps it back weakly: mini-batch training makes a graph per batch, and a freed one's
entry goes with it, so the table is as large as the live objects.  Handles are never reused.

Eagerly a mark is trusted only if the table maps it back to this very object: a deep copy or
an unpickled object carries a copy of its original's mark and gets a handle of its own.
Under ``torch.compile`` the mark is read as it is: dynamo cannot trace the weak table, and it
guards on the mark's value, so a different object recompiles rather than reusing a handle.
"""
from __future__ import annotations
import itertools
import weakref
import torch


class HandleTable:
    def __init__(self, attr: str, what: str):
        self._attr, self._what = attr, what
        self._objects: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
        self._next = itertools.count(1)

    def handle(self, obj) -> int:
        """The int naming ``obj`` (made and memoised on ``obj`` on first use)."""
        mark = getattr(obj, self._attr, None)
        if mark is not None and (torch.compiler.is_compiling()
                                 or self._objects.get(mark[0]) is obj):
            return mark[0]
        handle = next(self._next)
        object.__setattr__(obj, self._attr, (handle,))   # frozen dataclasses too
        self._objects[handle] = obj
        return handle

    def get(self, handle: int):
        """The live object named by ``handle``; a clear error if it is unknown or freed."""
        obj = self._objects.get(handle)
        if obj is None:
            raise RuntimeError(f"hector: {self._what} handle {handle} is unknown or its "
                               f"{self._what} was freed")
        return obj

    def __len__(self) -> int:
        return len(self._objects)
