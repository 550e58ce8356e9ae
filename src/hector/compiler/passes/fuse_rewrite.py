"""The fuse pass's name (the pass its decisions are logged under) and the helpers its
whole-graph rewrites share: which values are read once, and a rewrite carrying an earlier
one's memo over (``fuse_attention._fold_bias``, ``fuse_gemm._split_scatter_sums``)."""
from __future__ import annotations

from collections import Counter
from typing import Dict

from ..ir import Value, rewrite, toposort

NAME = "fuse"


def _read_once(outputs):
    """``alone(v)``: ``v`` is read by one operator of ``outputs``' graph and is not an
    output."""
    consumers = Counter(a for v in toposort(outputs) for a in set(v.args))
    is_output = set(outputs)
    return lambda v: consumers[v] == 1 and v not in is_output


def _rewrite_after(outputs, fn, memo: Dict[Value, Value]):
    """``rewrite(outputs, fn, original=True)``, with ``memo`` (original value -> its
    replacement by an earlier rewrite) updated to map to the new values."""
    again: Dict[Value, Value] = {}
    out = rewrite(outputs, fn, again, original=True)
    for k, v in memo.items():
        memo[k] = again.get(v, v)
    return out
