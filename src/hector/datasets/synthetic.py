"""Synthetic graphs with the published statistics of the paper datasets.

``load("reddit")`` returns a :class:`~hector.datasets.base.Dataset` with Reddit's node and edge
counts, feature width, classes and split sizes, and a heavy-tailed degree distribution with super
nodes; ``load("mag")`` one with ogbn-mag's node types and relations, each relation between its
fixed (source type, destination type) with its published edge count.  The named statistics live in
``profiles.py`` (with their sources); this module only generates.

Model.  Every node type ``t`` with ``n`` nodes gets Zipf weights over ranks,
``w_k = (k + k0) ** -a`` (k = 0 .. n-1), mapped to node ids by a seeded random permutation (so hubs
are not all at id 0).  Each relation draws its source ids from its source type's weights and its
destination ids from its destination type's weights, independently, by inverse-CDF sampling
(the first cumulative weight above a uniform random, found through a guide table: O(E)
expected, vectorised, chunked to bound memory).  A node's expected in-degree is therefore
proportional to its weight, and ``a`` (and optionally ``k0``) is fitted per node type so that

- the expected largest in-degree equals the profile's ``max_degree`` (at scale != 1 the ratio
  max / mean in-degree is kept, so the scaled graph has the same skew and, because the mean is
  unchanged, the same largest degree), and
- when ``super_nodes`` is given, the expected number of nodes with in-degree >= 1000 equals it;
- otherwise ``a`` is the type's ``skew`` (default ``profiles.DEFAULT_SKEW``) and ``k0 = 1``.

Symmetric (undirected) profiles draw E/2 pairs and store both directions; reverse relations
(DGL's ``rev-*``) hold the flipped edges of their forward relation.  Edges are sampled with
replacement, so a few duplicate edges and self loops occur (as the kernels must handle anyway).

Determinism: each random stream (per node type permutation, per relation side, features, labels,
split) has its own ``torch.Generator`` on the target device, seeded from (seed, stream name), so
the same arguments give identical tensors on the same device, and e.g. ``feature_dim`` does not
change the edges.  CPU and GPU streams differ.
"""
from __future__ import annotations

import hashlib
import math
import numbers
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import profiles as _profiles
from .base import Dataset
from .profiles import SUPER_NODE_DEGREE, Profile

__all__ = ["load", "profiles", "get_profile", "degree_model", "Profile", "SUPER_NODE_DEGREE"]

#: endpoints drawn per chunk (bounds the temporaries: ~3 x 8 bytes x CHUNK)
CHUNK = 1 << 23
_MAX_EXPONENT = 8.0


def profiles() -> List[str]:
    """The names of the built-in profiles."""
    return list(_profiles.PROFILES)


def get_profile(name: Union[str, Profile]) -> Profile:
    """The profile object for ``name`` (a ``Profile`` is returned as is, after validation)."""
    if isinstance(name, Profile):
        return _profiles._check_profile(name)
    return _profiles.get(name)


# ---------------------------------------------------------------------------------------------
# Degree model
# ---------------------------------------------------------------------------------------------

def _power_sum(a: float, k0: float, n: int, head: int = 4096) -> float:
    """sum_{k=0}^{n-1} (k + k0) ** -a: exact over the first ``head`` terms, midpoint-rule integral
    for the rest (relative error far below 1e-6 for these smooth terms)."""
    m = min(n, head)
    s = float(np.sum((np.arange(m, dtype=np.float64) + k0) ** -a))
    if n > m:
        lo, hi = m - 0.5 + k0, n - 0.5 + k0
        if abs(a - 1.0) < 1e-12:
            s += math.log(hi / lo)
        else:
            s += (hi ** (1 - a) - lo ** (1 - a)) / (1 - a)
    return s


def _max_over_mean(a: float, k0: float, n: int) -> float:
    return n * k0 ** -a / _power_sum(a, k0, n)


def _fit_exponent(ratio: float, k0: float, n: int) -> float:
    """The ``a`` whose expected max / mean in-degree is ``ratio`` (bisection; it is increasing)."""
    if n <= 1 or ratio <= 1.0:
        return 0.0
    lo, hi = 0.0, _MAX_EXPONENT
    if _max_over_mean(hi, k0, n) <= ratio:
        return hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _max_over_mean(mid, k0, n) < ratio:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _expected_at_least(threshold: float, a: float, k0: float, n: int, in_edges: int) -> int:
    """Expected number of nodes whose expected in-degree is >= threshold."""
    if n == 0 or in_edges == 0:
        return 0
    if a == 0.0:
        return n if in_edges / n >= threshold else 0
    c = in_edges / _power_sum(a, k0, n)            # d_k = c * (k + k0) ** -a
    if c * k0 ** -a < threshold:
        return 0
    # last rank with d_k >= threshold: (threshold / c) ** (-1 / a) - k0, in logs, because a
    # nearly flat Zipf (a -> 0) makes the power overflow a float
    log_rank = -math.log(threshold / c) / a
    if log_rank >= math.log(n + k0 + 1.0):
        return n
    kmax = math.exp(log_rank) - k0
    return int(min(n, math.floor(kmax + 1e-9) + 1))


def _fit_offset(ratio: float, target: int, n: int, in_edges: int) -> Optional[Tuple[float, float]]:
    """(a, k0) with the given max/mean ratio and ``target`` expected super nodes, or None."""
    def count(log_k0: float) -> Tuple[int, float]:
        k0 = math.exp(log_k0)
        a = _fit_exponent(ratio, k0, n)
        return _expected_at_least(SUPER_NODE_DEGREE, a, k0, n, in_edges), a

    lo = math.log(1e-3)
    if count(lo)[0] > target:
        return None
    hi = lo                                        # walk up (x2) until the count reaches target
    while True:
        hi += math.log(2.0)
        c, a = count(hi)
        if c >= target:
            break
        if a >= _MAX_EXPONENT - 1e-6 or hi > math.log(max(n, 2)):
            return None                            # the ratio cannot hold with that many
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        c, _ = count(mid)
        if c < target:
            lo = mid
        else:
            hi = mid
    c, a = count(hi)
    return a, math.exp(hi)


@dataclass(frozen=True)
class _TypePlan:
    name: str
    count: int
    offset: int
    in_edges: int
    exponent: float
    k0: float
    max_degree_target: Optional[int]

    @property
    def mean_in_degree(self) -> float:
        return self.in_edges / self.count if self.count else 0.0

    @property
    def expected_max_in_degree(self) -> float:
        if self.count == 0 or self.in_edges == 0:
            return 0.0
        return self.in_edges * self.k0 ** -self.exponent / _power_sum(self.exponent, self.k0,
                                                                       self.count)

    @property
    def expected_super_nodes(self) -> int:
        return _expected_at_least(SUPER_NODE_DEGREE, self.exponent, self.k0, self.count,
                                  self.in_edges)


@dataclass(frozen=True)
class _Plan:
    types: Tuple[_TypePlan, ...]
    rel_counts: Tuple[int, ...]
    num_nodes: int
    num_edges: int


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


@lru_cache(maxsize=64)
def _plan(profile: Profile, scale: float) -> _Plan:
    counts = [max(1, _round(t.count * scale)) for t in profile.node_types]
    rel_counts: List[int] = []
    for r in profile.relations:
        if r.reverse_of is not None:
            rel_counts.append(rel_counts[r.reverse_of])
        elif profile.symmetric:
            rel_counts.append(2 * _round(r.count / 2 * scale))
        else:
            rel_counts.append(_round(r.count * scale))
    index = {t.name: i for i, t in enumerate(profile.node_types)}
    in_edges = [0] * len(counts)
    for r, c in zip(profile.relations, rel_counts):
        in_edges[index[r.dst]] += c
    types = []
    offset = 0
    for i, spec in enumerate(profile.node_types):
        n = counts[i]
        k0, a = 1.0, spec.skew if spec.skew is not None else _profiles.DEFAULT_SKEW
        full_in = profile.in_edges(spec.name)
        if spec.max_degree is not None and full_in > 0 and spec.count > 0:
            ratio = spec.max_degree / (full_in / spec.count)       # published max / mean
            fitted = None
            if spec.super_nodes:
                fitted = _fit_offset(ratio, _round(spec.super_nodes * scale), n, in_edges[i])
            if fitted is not None:
                a, k0 = fitted
            else:
                a = _fit_exponent(ratio, 1.0, n)
        types.append(_TypePlan(spec.name, n, offset, in_edges[i], a, k0, spec.max_degree))
        offset += n
    return _Plan(tuple(types), tuple(rel_counts), offset, sum(rel_counts))


def degree_model(profile: Union[str, Profile], scale: float = 1.0) -> List[Dict[str, object]]:
    """Per node type: scaled node count, in-edge count, the fitted Zipf exponent and offset, and
    the expected largest in-degree, mean in-degree and number of super nodes (>= 1000).  No
    generation: cheap even for the largest profiles."""
    prof = get_profile(profile)
    plan = _plan(prof, _check_scale(scale))
    return [dict(node_type=t.name, num_nodes=t.count, in_edges=t.in_edges, exponent=t.exponent,
                 offset=t.k0, max_degree_target=t.max_degree_target,
                 expected_max_in_degree=t.expected_max_in_degree,
                 mean_in_degree=t.mean_in_degree, expected_super_nodes=t.expected_super_nodes)
            for t in plan.types]


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------

def _check_scale(scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a positive number, got {type(scale).__name__} ({scale!r})")
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0.0:
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    return scale


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} ({seed!r})")
    seed = int(seed)
    if not 0 <= seed < 2 ** 63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    return seed


def _check_positive_int(value, name: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__} ({value!r})")
    if int(value) < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _check_device(device) -> torch.device:
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"device {device!r} is not a valid torch device: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

def _generator(seed: int, stream: str, device: torch.device) -> torch.Generator:
    digest = hashlib.blake2b(f"{seed}/{stream}".encode(), digest_size=8).digest()
    g = torch.Generator(device=device)
    g.manual_seed(int.from_bytes(digest, "little") & (2 ** 63 - 1))
    return g


class _Sampler:
    """Inverse-CDF sampler of one node type's global ids.

    A draw is ``ids[i]`` for the first ``i`` with ``cdf[i] > u``, ``u`` uniform in [0, 1) --
    what ``torch.searchsorted(cdf, u, right=True)`` computes -- done with a guide table
    (Chen & Asau 1974) to avoid the ~log2(n) dependent gathers of a binary search: ``u`` is
    drawn as ``(b + r) / n`` with a bucket ``b`` uniform in [0, n) and ``r`` uniform in [0, 1),
    ``guide[b]`` is the answer for ``u = b / n`` (a lower bound), and a few vectorised
    "step right while ``cdf[j] <= u``" passes finish the search (each bucket spans one or two
    ids except in the far tail of a very steep law).
    """

    def __init__(self, t: _TypePlan, seed: int, index: int, device: torch.device):
        self.n = n = t.count
        self.device = device
        w = (torch.arange(n, dtype=torch.float64, device=device) + t.k0).pow_(-t.exponent)
        cdf = torch.cumsum(w, 0)
        del w
        cdf /= cdf[-1].clone()
        cdf[-1] = 1.0
        self.cdf = cdf
        grid = torch.arange(n + 1, dtype=torch.float64, device=device) / n
        self.guide = torch.searchsorted(cdf, grid, right=True).clamp_(max=n - 1)
        del grid
        perm = torch.randperm(n, generator=_generator(seed, f"perm/{index}", device),
                              device=device)
        self.ids = perm.add_(t.offset)

    def draw(self, out: torch.Tensor, gen: torch.Generator) -> None:
        m, n = out.numel(), self.n
        if n == 1:
            out.fill_(int(self.ids[0]))
            return
        for s in range(0, m, CHUNK):
            c = min(CHUNK, m - s)
            b = torch.randint(0, n, (c,), generator=gen, dtype=torch.int64, device=self.device)
            u = torch.rand(c, generator=gen, dtype=torch.float64, device=self.device)
            u.add_(b).div_(n)                     # (b + r) / n >= b / n, exactly
            j = self.guide[b]
            del b
            while True:
                step = (self.cdf[j] <= u) & (j < n - 1)
                if not bool(step.any()):
                    break
                j += step
            del u, step
            torch.index_select(self.ids, 0, j, out=out[s:s + c])


def _generate_edges(prof: Profile, plan: _Plan, seed: int, device: torch.device) -> torch.Tensor:
    index = {t.name: i for i, t in enumerate(plan.types)}
    samplers: Dict[int, _Sampler] = {}

    def sampler(name: str) -> _Sampler:
        i = index[name]
        if i not in samplers:
            samplers[i] = _Sampler(plan.types[i], seed, i, device)
        return samplers[i]

    edge_index = torch.empty(2, plan.num_edges, dtype=torch.int64, device=device)
    starts = [0]
    for c in plan.rel_counts:
        starts.append(starts[-1] + c)
    for r, (rel, count) in enumerate(zip(prof.relations, plan.rel_counts)):
        if count == 0:
            continue
        s0, s1 = starts[r], starts[r + 1]
        if rel.reverse_of is not None:
            f0, f1 = starts[rel.reverse_of], starts[rel.reverse_of + 1]
            edge_index[0, s0:s1] = edge_index[1, f0:f1]
            edge_index[1, s0:s1] = edge_index[0, f0:f1]
            continue
        drawn = count // 2 if prof.symmetric else count
        sampler(rel.src).draw(edge_index[0, s0:s0 + drawn], _generator(seed, f"src/{r}", device))
        sampler(rel.dst).draw(edge_index[1, s0:s0 + drawn], _generator(seed, f"dst/{r}", device))
        if prof.symmetric:
            edge_index[0, s0 + drawn:s1] = edge_index[1, s0:s0 + drawn]
            edge_index[1, s0 + drawn:s1] = edge_index[0, s0:s0 + drawn]
    samplers.clear()
    return edge_index


def _segment_ids(counts: Sequence[int], total: int, device: torch.device) -> torch.Tensor:
    """[0]*counts[0] + [1]*counts[1] + ... as an int64 tensor of length ``total``."""
    return torch.repeat_interleave(
        torch.arange(len(counts), dtype=torch.int64, device=device),
        torch.tensor(list(counts), dtype=torch.int64, device=device), output_size=total)


def _split_sizes(prof: Profile, n: int, scale: float) -> Tuple[int, int, int]:
    if prof.split is not None:
        sizes = [_round(s * scale) for s in prof.split]
    else:
        sizes = [_round(0.6 * n), _round(0.2 * n), 0]
        sizes[2] = n - sizes[0] - sizes[1]
    if n > 0 and sizes[0] == 0:
        sizes[0] = 1
    for i in (2, 1, 0):                       # shrink test, then val, then train to fit n
        excess = sum(sizes) - n
        if excess > 0:
            sizes[i] -= min(excess, sizes[i])
    return sizes[0], sizes[1], sizes[2]


def load(profile: Union[str, Profile], seed: int = 0, device=None, scale: float = 1.0,
         feature_dim: Optional[int] = None, num_classes: Optional[int] = None) -> Dataset:
    """A synthetic graph with the statistics of ``profile`` (see :func:`profiles`).

    ``scale`` multiplies node and edge counts (each node type keeps >= 1 node; symmetric graphs
    keep an even edge count).  ``feature_dim``: width of ``x`` (default: the dataset's published
    input width; heterogeneous profiles have none, so ``x`` is None unless given).
    ``num_classes``: label classes (default: the published count; link-prediction profiles have
    none, so ``y`` and the splits are None unless given).  Labels live on the first node type
    (ids ``0 .. n_target-1``); ``y`` has one entry per node, -1 outside the labelled type
    (multi-label profiles: ``y`` is [N, num_classes] in {0, 1}).  Splits are random disjoint
    sets of the labelled nodes with the published sizes (scaled), else 60/20/20; a split the
    dataset does not have (the RDF sets have no validation set) is None.
    """
    prof = get_profile(profile)
    seed = _check_seed(seed)
    scale = _check_scale(scale)
    dev = _check_device(device)
    feature_dim = _check_positive_int(feature_dim, "feature_dim")
    num_classes = _check_positive_int(num_classes, "num_classes")
    plan = _plan(prof, scale)

    edge_index = _generate_edges(prof, plan, seed, dev)
    N = plan.num_nodes
    hetero = prof.heterogeneous

    fdim = feature_dim if feature_dim is not None else prof.feature_dim
    x = None
    if fdim is not None:
        x = torch.randn(N, fdim, generator=_generator(seed, "x", dev), dtype=torch.float32,
                        device=dev)

    classes = num_classes if num_classes is not None else prof.num_classes
    y = train_idx = val_idx = test_idx = None
    n_target = plan.types[0].count
    if classes is not None:
        gy = _generator(seed, "y", dev)
        if prof.multilabel:
            y = torch.randint(0, 2, (N, classes), generator=gy, dtype=torch.int64, device=dev)
        else:
            labels = torch.randint(0, classes, (n_target,), generator=gy, dtype=torch.int64,
                                   device=dev)
            if n_target == N:
                y = labels
            else:
                y = torch.full((N,), -1, dtype=torch.int64, device=dev)
                y[:n_target] = labels
        tr, va, te = _split_sizes(prof, n_target, scale)
        perm = torch.randperm(n_target, generator=_generator(seed, "split", dev), device=dev)
        train_idx = perm[:tr].sort().values
        val_idx = perm[tr:tr + va].sort().values if va else None
        test_idx = perm[tr + va:tr + va + te].sort().values if te else None

    extra: Dict[str, object] = {
        "profile": prof,
        "seed": seed,
        "scale": scale,
        "synthetic": True,
        "target_type": prof.target_type,
        "node_counts": {t.name: t.count for t in plan.types},
        "node_type_offsets": [t.offset for t in plan.types] + [N],
        "relation_counts": list(plan.rel_counts),
        "symmetric": prof.symmetric,
        "multilabel": prof.multilabel,
        "degree_model": degree_model(prof, scale),
    }
    if hetero:
        node_type = _segment_ids([t.count for t in plan.types], N, dev)
        edge_type = _segment_ids(plan.rel_counts, plan.num_edges, dev)
        return Dataset(name=f"synthetic:{prof.name}", edge_index=edge_index, num_nodes=N,
                       edge_type=edge_type, num_relations=prof.num_relations,
                       node_type=node_type, node_type_names=prof.node_type_names,
                       relation_names=prof.relation_names, x=x, y=y, train_idx=train_idx,
                       val_idx=val_idx, test_idx=test_idx, num_classes=classes or 0,
                       extra=extra)
    return Dataset(name=f"synthetic:{prof.name}", edge_index=edge_index, num_nodes=N, x=x, y=y,
                   train_idx=train_idx, val_idx=val_idx, test_idx=test_idx,
                   num_classes=classes or 0, extra=extra)
