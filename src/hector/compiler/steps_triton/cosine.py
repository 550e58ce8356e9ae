"""``cosine`` steps -> ``hector::cosine_qk`` (q, k and each row's norm of AGNN's cosine score,
``ir.cosine_qk``) and ``hector::cosine_qk_backward`` (dx and dbeta, ``ir.cosine_qk_bwd``),
one kernel each on the Triton backend; the same math in torch ops on the torch backend
(``cosine_qk_torch``, ``cosine_qk_backward_torch``: its reference).  A step returns its
outputs by role, which ``select`` steps read."""
from __future__ import annotations

from typing import Dict, List

import torch

from ...kernels.attention.cosine import (cosine_qk_backward_op, cosine_qk_backward_torch,
                                         cosine_qk_op, cosine_qk_torch)
from ...kernels.eager import call
from ..ir import Op
from ..steps_torch import GraphIndex, per_argument


def _beta(args: List[torch.Tensor], at: int, x: torch.Tensor, ix: GraphIndex) -> torch.Tensor:
    """The step's beta as the ops take it (one element of x's dtype), or a kept 1 where the
    operator has none (``q = k``)."""
    if len(args) > at:
        return args[at].reshape(1).to(x.dtype)
    key = ("cosine_one", x.dtype, x.device)
    if key not in ix.memo:
        ix.memo[key] = torch.ones(1, dtype=x.dtype, device=x.device)
    return ix.memo[key]


def run_cosine(step, inputs: List[torch.Tensor], ix: GraphIndex,
               backend: str) -> Dict[str, torch.Tensor]:
    """A cosine step's outputs by role: ``q``, ``k`` (x's ``[rows, 1, D]``) and ``norm``
    (``[rows, 1, 1]``, fp32 on Triton), or the gradients ``x`` and, with a beta, ``beta``
    (beta's alone where the step was narrowed to it: ``ir.narrow``)."""
    body = step.body
    args = per_argument(body, inputs)
    if body.op == Op.COSINE_QK:
        x = args[0]
        flat = x.flatten(1)
        beta = _beta(args, 1, x, ix)
        q, k, norm = (call(cosine_qk_op, flat.contiguous(), beta) if backend == "triton"
                      else cosine_qk_torch(flat, beta))
        return {"q": q.view(x.shape), "k": k.view(x.shape), "norm": norm.view(-1, 1, 1)}
    if "x" not in body.attr("needs"):       # (ir.narrow) beta's alone: <dq, k>, one launch
        dq, k, beta = args
        return {"beta": torch.dot(dq.reshape(-1), k.reshape(-1)).reshape(beta.shape)}
    dq, dk, x, norm = (t.flatten(1) for t in args[:4])
    beta = _beta(args, 5, x, ix)
    if backend == "triton":
        dx, dbeta = call(cosine_qk_backward_op, dq.contiguous(), dk.contiguous(),
                         x.contiguous(), norm.reshape(-1).contiguous(), beta)
    else:
        dx, dbeta = cosine_qk_backward_torch(dq, dk, x, norm.reshape(-1), beta)
    out = {"x": dx.view(args[2].shape)}
    if len(args) > 5:
        out["beta"] = dbeta.reshape(args[5].shape)
    return out
