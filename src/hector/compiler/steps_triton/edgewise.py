"""The generated ``edgewise`` kernel (:func:`hector.kernels.edgewise.op.edgewise`) as the
Triton steps call it: a ``traversal`` step whose body is neither movements nor a plain edge
softmax (:func:`run_edgewise`; ``lower_traversal.edgewise_lowering`` built its program), and an IR
expression the runtime builds itself (:func:`_program`, :func:`run_edgewise_body`: the
attention steps' per-edge keys times ``p_r`` and edge-folded scores).  Each operand is read
through its access scheme inside the kernel; the index arrays the programs read are built
once per graph (:func:`edgewise_array`).  The kernel has no autograd: while torch autograd
records, the same IR runs as torch ops.
"""
from __future__ import annotations

import functools
from typing import List

import torch

from ...kernels.edgewise.op import edgewise
from ..ir import Value
from ..lower_traversal import edgewise_lowering
from ..steps_torch import GraphIndex, eval_body


def edgewise_array(ix: GraphIndex, key: tuple) -> torch.Tensor:
    """An index array an ``edgewise`` program reads (see
    :class:`~hector.compiler.plan.EdgewiseLowering`), built once per graph: the CSR grouping
    ``many`` rows by their ``one`` row is a stable sort of the movement index."""
    if key[0] == "move":
        return ix.move(*key[1:])
    if key[0] == "relation":
        return ix.relation(key[1])
    if key[0] == "node_type":
        return ix.node_type()
    memo = ("edgewise_csr",) + key[1:]
    if memo not in ix.memo:
        ix.memo[memo] = ix.grouped(*key[1:])
    return ix.memo[memo][0 if key[0] == "csr_ptr" else 1]


def _edgewise_input(ix: GraphIndex, inputs: List[torch.Tensor], x) -> torch.Tensor:
    if isinstance(x, int):
        return inputs[x]
    return ix.counts(*x[1:])      # ("counts", one, many, end): a mean's divisor per row


def _promoted(tensors: List[torch.Tensor]) -> torch.dtype:
    """The dtype torch ops would give the statements' result (bf16 rows times an fp32
    operand is fp32), so both backends store the same precision."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        if t.dtype != dtype:
            dtype = _promote(dtype, t.dtype)
    return dtype


@functools.lru_cache(maxsize=None)
def _promote(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """``torch.promote_types``, memoised: it is a dispatched operator (~microseconds of host
    time each), asked the same few questions by every edgewise step of every call."""
    return torch.promote_types(a, b)


def run_edgewise(step, inputs: List[torch.Tensor], ix: GraphIndex) -> torch.Tensor:
    """A traversal step on the generated ``edgewise`` kernel: its statements fused, every
    operand read through its access scheme inside the kernel.  The kernel has no autograd:
    when torch autograd records (``autodiff='torch'``), the step runs as torch ops."""
    ew = step.spec.edgewise
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return eval_body(step.body, inputs, ix)
    ins = [_edgewise_input(ix, inputs, x) for x in ew.inputs]
    out = edgewise(ew.program, ins, [edgewise_array(ix, k) for k in ew.arrays],
                   ix.rows[ew.rows], _promoted(ins), backend="triton")
    return out.reshape((out.shape[0],) + tuple(step.output.shape))


def _program(body: Value):
    """(``body``, its edgewise lowering): what :func:`run_edgewise_body` runs."""
    lowered, why = edgewise_lowering(body)
    if lowered is None:
        raise ValueError(f"edgewise: cannot lower {body!r}: {why}")
    return body, lowered


def run_edgewise_body(program, tensors: List[torch.Tensor], ix: GraphIndex) -> torch.Tensor:
    """An IR expression the runtime builds itself (``program``: from :func:`_program`, its
    ``arg`` i bound to ``tensors[i]``) on the edgewise kernel; with torch ops while torch
    autograd records (the kernel has no autograd of its own)."""
    body, ew = program
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return eval_body(body, tensors, ix)
    out = edgewise(ew.program, [_edgewise_input(ix, tensors, x) for x in ew.inputs],
                   [edgewise_array(ix, k) for k in ew.arrays], ix.rows[ew.rows],
                   _promoted(tensors), backend="triton")
    return out.reshape((out.shape[0],) + tuple(body.shape))
