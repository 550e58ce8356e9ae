"""Readable listing of an IR: one SSA-style line per value, arguments first.

    %3 = linear(%1, %2 heads=2) : edge[2, 4]
"""
from __future__ import annotations

from typing import Dict, Sequence

from .ir import WEIGHT, Value, toposort

_HIDDEN = ("norm",)


def _fmt_attr(k, v) -> str:
    if isinstance(v, Value):
        return f"{k}=<{v.op}>"
    if isinstance(v, float):
        return f"{k}={v:.6g}"
    return f"{k}={v}"


def format_value(v: Value, names: Dict[Value, str]) -> str:
    args = [names[a] for a in v.args]
    attrs = [_fmt_attr(k, x) for k, x in v.attrs
             if k not in ("per", "body") and not (k in _HIDDEN and x is None)]
    kind = v.kind if v.kind != WEIGHT else f"weight/{v.per or 'shared'}"
    inner = ", ".join(args + attrs)
    return f"{names[v]} = {v.op}({inner}) : {kind}{list(v.shape)}"


def format_ir(outputs: Sequence[Value], title: str = "") -> str:
    """The whole IR reachable from ``outputs``; kernel nodes (after fusion) list their body
    indented below them."""
    lines = [f"# {title}"] if title else []
    names: Dict[Value, str] = {}
    for i, v in enumerate(toposort(outputs)):
        names[v] = f"%{i}"
        lines.append(format_value(v, names))
        body = v.attr("body")
        if isinstance(body, Value):
            sub: Dict[Value, str] = {}
            for j, b in enumerate(toposort([body])):
                sub[b] = f"  .{j}"
                lines.append("    " + format_value(b, sub).replace("  .", "."))
    lines.append("return " + ", ".join(names[o] for o in outputs))
    return "\n".join(lines)
