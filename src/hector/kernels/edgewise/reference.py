"""An edge-wise program evaluated with plain torch ops (CPU, and the kernel tests' reference)."""
from __future__ import annotations

from typing import Dict, Sequence

import torch
import torch.nn.functional as F

from ..activations import gelu_grad
from ..ptr import rows_of_entries
from ..traversal.reference import edge_softmax_torch
from .spec import EdgewiseSpec, Node

_UNARY = {
    "neg": lambda x, a: -x, "exp": lambda x, a: torch.exp(x),
    "sigmoid": lambda x, a: torch.sigmoid(x), "tanh": lambda x, a: torch.tanh(x),
    "gelu": lambda x, a: F.gelu(x), "relu": lambda x, a: torch.relu(x),
    "leaky_relu": lambda x, a: F.leaky_relu(x, a["slope"]),
    "scale": lambda x, a: x * a["factor"],
    "leaky_relu_grad": lambda x, a: torch.where(x > 0, torch.ones_like(x),
                                                torch.full_like(x, a["slope"])),
    "gelu_grad": lambda x, a: gelu_grad(x),
}


def edgewise_torch(spec: EdgewiseSpec, inputs: Sequence[torch.Tensor],
                   arrays: Sequence[torch.Tensor], out_rows: int,
                   dtype: torch.dtype) -> torch.Tensor:
    arrays = [a.long() for a in arrays]
    own = torch.arange(out_rows, device=arrays[0].device if arrays else inputs[0].device)
    root = spec.root
    if spec.form != "softmax":
        return _eval(root, inputs, arrays, {"own": own}, {}).to(dtype)
    ptr, perm = arrays[root.attr("ptr")], arrays[root.attr("perm")]
    seg = rows_of_entries(ptr)
    s = _eval(root.args[0], inputs, arrays, {"own": own, "entry": perm}, {})
    s = s.expand((s.shape[0],) + root.shape)
    alpha = edge_softmax_torch(seg, ptr.numel() - 1, s)
    return s.new_empty((out_rows,) + root.shape).index_copy(0, perm, alpha).to(dtype)


def _rows(r: Node, arrays, ctx) -> torch.Tensor:
    if r.op in ("own", "entry"):
        return ctx[r.op]
    return arrays[r.attr("array")].index_select(0, _rows(r.args[0], arrays, ctx))


def _eval(n: Node, inputs, arrays, ctx: Dict[str, torch.Tensor], memo) -> torch.Tensor:
    key = (n, id(ctx))
    if key in memo:
        return memo[key]
    memo.setdefault("contexts", []).append(ctx)   # alive, so no later context reuses its id
    op, a = n.op, dict(n.attrs)
    ev = lambda x: _eval(x, inputs, arrays, ctx, memo)   # noqa: E731
    if op == "load":
        t = inputs[a["input"]]
        out = t.reshape(t.shape[0], *n.shape).index_select(0, _rows(n.args[0], arrays, ctx))
    elif op == "weight":
        t = inputs[a["input"]].reshape(-1, *n.shape)
        sel = n.args[0]
        out = t[:1] if sel.op == "zero" else t.index_select(0, _rows(sel, arrays, ctx))
    elif op in _UNARY:
        out = _UNARY[op](ev(n.args[0]), a)
    elif op in ("add", "sub", "mul", "div"):
        x, y = ev(n.args[0]), ev(n.args[1])
        out = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[op](x, y)
    elif op == "dot":
        out = (ev(n.args[0]) * ev(n.args[1])).sum(-1, keepdim=True)
    elif op == "reduce_to":
        out = ev(n.args[0])
        for axis, size in ((1, n.shape[0]), (2, n.shape[1])):
            if size == 1 and out.shape[axis] != 1:
                out = out.sum(axis, keepdim=True)
    elif op == "expand":
        x = ev(n.args[0])
        out = x.expand((x.shape[0],) + n.shape)
    elif op == "scatter":
        ptr, perm = arrays[a["ptr"]], arrays[a["perm"]]
        own = ctx["own"]
        x = _eval(n.args[0], inputs, arrays, {"own": own, "entry": perm}, memo).float()
        x = x.expand((x.shape[0],) + n.shape)
        seg = rows_of_entries(ptr)
        out = x.new_zeros((ptr.numel() - 1,) + n.shape).index_add(0, seg, x)
        if a.get("mean"):
            out = out / (ptr[1:] - ptr[:-1]).clamp(min=1).view(-1, 1, 1)
        out = out.index_select(0, own)
    else:
        raise ValueError(f"edgewise: no rule for {op!r}")
    out = out.float()
    memo[key] = out
    return out
