"""``edge_attention``: the fused attention op, public entry of this kernel family.  It validates
its inputs (every check before any kernel runs) and dispatches to a backend: the generated
Triton kernels (:mod:`.custom_ops`) on CUDA or under ``TRITON_INTERPRET=1``, plain PyTorch
(:mod:`.reference`) otherwise."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ... import checks as C
from ...device import choose_backend
from ...graph import Graph
from .custom_ops import edge_attention_triton
from .plan import AttentionPlan, side_rows
from .reference import edge_attention_torch
from .spec import AttentionSpec, shared_heads

STRATEGIES = ("auto", "node", "edge")


def edge_attention(graph, v: torch.Tensor, q: Optional[torch.Tensor] = None,
                   k: Optional[torch.Tensor] = None, a_src: Optional[torch.Tensor] = None,
                   a_dst: Optional[torch.Tensor] = None, *, scale: float = 1.0,
                   negative_slope: Optional[float] = None, dropout: float = 0.0,
                   training: bool = False, seed=None, strategy: str = "auto",
                   backend: str = "auto", schedule=None, spec: Optional[AttentionSpec] = None,
                   plan: Optional[AttentionPlan] = None,
                   bias: Optional[torch.Tensor] = None,
                   k_norm: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""Fused graph attention (score, edge softmax, aggregation) over the incoming edges of
    every node; one op behind GAT, AGNN, TransformerConv and relational attention.

    Per head :math:`h` and edge :math:`u \to v`:

    .. math::
        s_{uv} = \sigma\big(\text{scale}\,\langle q_v, k_u\rangle + a^{src}_u + a^{dst}_v\big),
        \quad \alpha_{uv} = \operatorname{softmax}_{u \in N(v)} s_{uv},
        \quad o_v = \sum_{u \in N(v)} \alpha_{uv}\, m_u

    where each score term is present only when its tensor is given and :math:`\sigma` is
    ``leaky_relu(., negative_slope)`` (identity when ``negative_slope`` is None).  A node
    without incoming edges gets 0.

    Args:
        graph: a :class:`hector.Graph`.
        v: ``[N, H, Dv]`` messages :math:`m_u`.
        q, k: ``[N, H, Dk]`` queries (destination side) and keys (source side); both or neither.
            k and v may be one row per node read by every head (``x.unsqueeze(1).expand(N,
            H, D)``, head stride 0): the Triton kernels then gather that row once per edge
            instead of a copy with a row per head (a key shared by the heads); their
            gradients come back per head and sum over the expand.
        a_src, a_dst: ``[N, H]`` additive per-node score terms (GAT's attention logits).
        scale: factor of the q.k term (``1/sqrt(Dk)`` for a transformer).
        negative_slope: leaky_relu slope applied to the score, or None.
        dropout: probability of dropping an attention weight (only when ``training``); the
            mask is a hash of (``seed``, canonical edge id, head), identical on both backends.
        training: apply dropout.
        seed: dropout seed: an int, or a one-element integer tensor on ``v``'s device.  Default:
            a fresh seed drawn *on the device* from torch's generator for ``v``'s device
            (reproducible under ``torch.manual_seed``; no host sync; inside a captured CUDA
            graph the draw is replayed too, so every replay drops a fresh mask).
        strategy: 'auto' | 'node' | 'edge' (Triton schedule; see ``plan.choose_strategy``).
        backend: 'auto' | 'torch' | 'triton'.
        schedule: a ``hector.kernels.attention.spec.Schedule`` pinning tile sizes and strategy
            (tests); None: the heuristic's tiles, whose edge tile and warps the autotuner
            refines on CUDA (once per shape bucket; ``HECTOR_AUTOTUNE=0`` keeps the heuristic).
        spec, plan: the :class:`~.spec.AttentionSpec` of this call and the
            :class:`~.plan.AttentionPlan` (schedules) for ``graph``, when the caller decided
            them already (the compiler's lowering and its per-graph cache): the Triton path
            launches these objects instead of deriving its own.  ``spec`` must describe the
            given tensors; ``plan`` excludes ``schedule`` and must have been made for ``graph``.
        bias: ``[H, Dv]`` (or ``[H * Dv]``) added to every output row, a node without
            incoming edges included (a layer's output bias: the Triton kernels add it as they
            store the row instead of a separate pass over the output); or ``[N, H, Dv]``,
            one row added to each output row (a layer's skip term; any row stride, so a
            column slice of a joint projection is read in place; its gradient is the
            output's).
        k_norm: ``[N]`` float32, a promise that ``k`` is ``v`` normalised row by row, ``k[u] =
            v[u] / k_norm[u]`` (AGNN's keys ``x / |x|`` with ``v = x``; needs ``k`` of
            ``v``'s shape): the Triton kernels then gather each edge's ``v`` row once and
            form its key from it instead of gathering ``k`` too (half the bytes per edge);
            ``k`` still carries the gradient of the keys.  The torch backend reads ``k``.
            The promise is checked with ``HECTOR_DEBUG=1`` (a pass over the data).
    Returns:
        ``[N, H, Dv]`` in ``v.dtype`` (accumulated in float32), plus ``bias`` if given.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a hector.Graph, got {type(graph).__name__}")
    _check_inputs(graph, v, q, k, a_src, a_dst)
    _check_k_norm(k_norm, v, k)
    bias = _check_bias(bias, v, side_rows(graph, "dst"))
    scale, negative_slope, dropout = _check_scalars(scale, negative_slope, dropout, training, seed)
    _check_seed(seed, v)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    backend = choose_backend(backend, v, "v")
    p = dropout if training else 0.0
    _check_decided(spec, plan, schedule, v, q, a_src, a_dst, negative_slope, p, k, k_norm)
    if p > 0 and seed is None:
        seed = draw_seed(v.device)
    if backend == "torch":
        out = edge_attention_torch(graph, v, q, k, a_src, a_dst, scale, negative_slope, p, seed)
        return out if bias is None else out + bias
    return edge_attention_triton(graph, v, q, k, a_src, a_dst, scale, negative_slope, p, seed,
                                 strategy, schedule, spec=spec, plan=plan, bias=bias,
                                 k_norm=k_norm)


def _check_k_norm(k_norm: Optional[torch.Tensor], v: torch.Tensor, k) -> None:
    """``k_norm`` is None or ``[N]`` float32 on ``v``'s device, with a ``k`` of ``v``'s
    shape and one row per head (not shared by the heads); with ``HECTOR_DEBUG=1`` also that
    ``k`` is ``v`` divided by it."""
    if k_norm is None:
        return
    if not isinstance(k_norm, torch.Tensor):
        raise TypeError(f"k_norm must be a tensor, got {type(k_norm).__name__}")
    if k is None:
        raise ValueError("k_norm describes k (k = v / k_norm row by row); k was not given")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k_norm needs k of v's shape {tuple(v.shape)} (Dk = Dv), got "
                         f"{tuple(k.shape)}")
    if shared_heads(v, k):
        raise ValueError("k_norm needs k and v with a row per head; these are shared by "
                         "the heads (head stride 0)")
    if k_norm.dim() != 1 or k_norm.shape[0] != v.shape[0]:
        raise ValueError(f"k_norm must have shape [num_nodes] = [{v.shape[0]}], got "
                         f"{tuple(k_norm.shape)}")
    if k_norm.dtype != torch.float32:
        raise TypeError(f"k_norm must be float32, got {k_norm.dtype}")
    if k_norm.device != v.device:
        raise ValueError(f"k_norm is on {k_norm.device} but v is on {v.device}")
    if C.debug_enabled():
        want = (v.float() / k_norm[:, None, None]).to(k.dtype)
        tol = 1e-5 if k.dtype == torch.float32 else 1e-2
        if not torch.allclose(k, want, rtol=tol, atol=tol):
            raise ValueError("k_norm: k is not v divided row by row by k_norm")


def _check_bias(bias: Optional[torch.Tensor], v: torch.Tensor,
                rows: int) -> Optional[torch.Tensor]:
    """``bias`` as ``[H, Dv]`` (per column) or ``[rows, H, Dv]`` (row-wise, as given: any
    row stride), after checking its shape, dtype and device against ``v`` and the output's
    ``rows``."""
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a tensor, got {type(bias).__name__}")
    heads, dim_v = v.shape[1], v.shape[2]
    if tuple(bias.shape) not in ((heads, dim_v), (heads * dim_v,), (rows, heads, dim_v)):
        raise ValueError(f"bias must have shape [heads, Dv] = [{heads}, {dim_v}], "
                         f"[{heads * dim_v}] or [rows, heads, Dv] = [{rows}, {heads}, "
                         f"{dim_v}], got {tuple(bias.shape)}")
    if bias.dtype != v.dtype:
        raise TypeError(f"bias has dtype {bias.dtype} but v has {v.dtype}")
    if bias.device != v.device:
        raise ValueError(f"bias is on {bias.device} but v is on {v.device}")
    return bias if bias.dim() == 3 else bias.reshape(heads, dim_v)


def _check_decided(spec, plan, schedule, v, q, a_src, a_dst, negative_slope, p, k=None,
                   k_norm=None) -> None:
    """A caller-made spec must be the one these inputs give (else the kernels would be
    rendered for other score terms or shapes); a plan replaces ``schedule``."""
    if spec is not None:
        if not isinstance(spec, AttentionSpec):
            raise TypeError(f"spec must be an AttentionSpec, got {type(spec).__name__}")
        want = AttentionSpec.of(v, q, a_src, a_dst, negative_slope, has_dropout=p > 0, k=k,
                                k_norm=k_norm)
        if spec != want:
            raise ValueError(f"spec {spec} does not describe the given tensors ({want})")
    if plan is not None:
        if not isinstance(plan, AttentionPlan):
            raise TypeError(f"plan must be an AttentionPlan, got {type(plan).__name__}")
        if schedule is not None:
            raise ValueError("plan and schedule were both given; pass one of them")


def _check_inputs(graph, v, q, k, a_src, a_dst) -> None:
    n, dev = graph.num_nodes, graph.device
    C.check_features(v, "v", n, "graph.num_nodes", dev)
    if v.dim() != 3:
        raise ValueError(f"v must have shape [num_nodes, heads, Dv], got {tuple(v.shape)}")
    heads = v.shape[1]
    if heads < 1 or v.shape[2] < 1:
        raise ValueError(f"v must have at least one head and one feature, got {tuple(v.shape)}")
    if (q is None) != (k is None):
        given, missing = ("q", "k") if k is None else ("k", "q")
        raise ValueError(f"{given} was given without {missing}; the q.k score term needs both")
    for name, t, ndim in (("q", q, 3), ("k", k, 3), ("a_src", a_src, 2), ("a_dst", a_dst, 2)):
        if t is None:
            continue
        C.check_features(t, name, n, "graph.num_nodes", dev)
        want = "[num_nodes, heads, Dk]" if ndim == 3 else "[num_nodes, heads]"
        if t.dim() != ndim or t.shape[1] != heads:
            raise ValueError(f"{name} must have shape {want} with heads={heads} (from v), "
                             f"got {tuple(t.shape)}")
        if t.dtype != v.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but v has {v.dtype}; "
                            "all feature tensors must share one dtype")
    if q is not None and (q.shape[2] != k.shape[2] or q.shape[2] < 1):
        raise ValueError(f"q and k must have the same Dk >= 1, got q {tuple(q.shape)} and "
                         f"k {tuple(k.shape)}")


def _check_scalars(scale, negative_slope, dropout, training, seed):
    def number(x, name):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise TypeError(f"{name} must be a finite number, got {x!r}")
        return float(x)
    scale = number(scale, "scale")
    if negative_slope is not None:
        negative_slope = number(negative_slope, "negative_slope")
    dropout = number(dropout, "dropout")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if not isinstance(training, bool):
        raise TypeError(f"training must be a bool, got {type(training).__name__}")
    return scale, negative_slope, dropout


def _check_seed(seed, v: torch.Tensor) -> None:
    if seed is None:
        return
    if not isinstance(seed, torch.Tensor):
        C.check_count(seed, "seed")
        return
    if seed.numel() != 1 or seed.dtype.is_floating_point or seed.dtype.is_complex \
            or seed.dtype == torch.bool:
        raise TypeError(f"seed as a tensor must hold one integer, got {seed.numel()} "
                        f"element(s) of {seed.dtype}")
    if seed.device != v.device:
        raise ValueError(f"seed is on {seed.device} but v is on {v.device}")


def draw_seed(device) -> torch.Tensor:
    """A fresh dropout seed as a one-element int64 tensor drawn on ``device`` by torch's
    generator there.  A host-drawn int would be frozen into a captured CUDA graph (one mask
    replayed forever); torch's CUDA generator is graph-safe (each replay advances its philox
    offset), so the draw is recorded and redone by every replay."""
    return torch.randint(0, 2 ** 31 - 1, (1,), device=device, dtype=torch.int64)
