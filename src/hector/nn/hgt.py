r"""HGT (Hu et al. 2020), PyG ``HGTConv`` semantics, compiled by Hector."""
from __future__ import annotations

import math
from typing import Dict

import torch
from torch import nn

from .. import checks as C
from ..compiler import models
from ..compiler.program import Program, node_type_bounds
from ..graph import Graph
from ..graph.cache import cached
from ._common import check_input, load_from_pyg, stacked_rows
from ..compiler.warm import graphed
from .rgcn import compiler_options


class _Typed(nn.Module):
    """PyG ``HeteroLinear``'s parameter layout (``weight [types, in, out]``)."""

    def __init__(self, types: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(types, dim, dim))


def _pieces(out: torch.Tensor, slices) -> Dict[str, torch.Tensor]:
    """``{type: out[lo:hi]}`` for ``slices`` ((type, lo, hi), ascending and disjoint) as
    pieces of one ``torch.split`` over all of ``out``'s rows: its backward concatenates the
    pieces' gradients once (rows no piece returns get zeros).  A slice per type would give
    each its own full-height zeroed gradient, summed by autograd: on synthetic mag 3 fills and
    2 adds of 1.9M x 64 rows, 1 ms of a 30 ms training step.  Under autograd each piece is
    copied out of the split (one pass over the returned rows), so that it can be modified
    in place as any layer's output can."""
    sizes, index, at = [], {}, 0
    for t, lo, hi in slices:
        if lo > at:
            sizes.append(lo - at)
        index[t] = len(sizes)
        sizes.append(hi - lo)
        at = hi
    if at < out.shape[0]:
        sizes.append(out.shape[0] - at)
    parts = torch.split(out, sizes)
    if out.requires_grad and torch.is_grad_enabled():
        # (the pieces of a split may not be modified in place under autograd, PyG's outputs
        # may: a copy of each returned piece, whose gradients still meet in the split's one
        # backward)
        return {t: parts[i].clone() for t, i in index.items()}
    return {t: parts[i] for t, i in index.items()}


def _pyg_state(module, state, prefix, local_metadata) -> None:
    """``state_dict`` hook: the packed parameters under PyG's per-type keys."""
    names = module.pyg_keys()
    packed = {n: state.pop(prefix + n) for n in names if prefix + n in state}
    for key, t in module.in_pyg_layout(packed).items():
        state[prefix + key] = t


def _packed_state(module, state, prefix, local_metadata, strict, missing, unexpected,
                  errors) -> None:
    """``load_state_dict`` pre-hook: PyG's per-type entries stacked into the packed ones
    (a family with any of its keys absent is left as it is: reported missing)."""
    for name, keys in module.pyg_keys().items():
        full = [prefix + k for k in keys]
        if full and all(k in state for k in full):
            parts = [state.pop(k) for k in full]
            state[prefix + name] = torch.cat(parts) if name in ("skip", "p_rel") \
                else torch.stack(parts)


class HGTConv(nn.Module):
    r"""Heterogeneous graph transformer, per head:

    .. math::
        s_{uv} = \frac{(K_{\tau(u)} x_u W^{att}_r) \cdot Q_{\tau(v)} x_v \; p_r}{\sqrt{d}}, \quad
        \alpha = \mathrm{softmax}_{u \in N(v)} s, \quad
        x_v' = A_{\tau(v)}\, \mathrm{gelu}\Big(\sum_u \alpha_{uv} V_{\tau(u)} x_u W^{msg}_r\Big)

    with PyG's gated skip connection when in and out widths agree.  Compiled from
    :func:`hector.compiler.models.hgt`: ``k W^{att}_r`` and ``v W^{msg}_r`` run once per unique
    (src, relation) pair, then one attention traversal.

    Parameters are packed one tensor per family, node types or relations stacked in
    metadata order (``kqv_weight [T, 3F, in]``, ``kqv_bias``, ``out_weight``, ``out_bias``,
    ``skip [T]``, ``p_rel [R, heads]``, and PyG's own ``k_rel`` / ``v_rel``), where PyG keeps
    one per type: ``state_dict()`` and ``load_state_dict()`` use PyG's keys and shapes, and
    :meth:`in_pyg_layout` maps packed tensors (or their gradients) to them.

    Args:
        in_channels (int, or a dict of equal ints), out_channels, metadata, heads: as in PyG.
        reorder, compact, fuse, backend, autodiff: see :func:`hector.compile`.

    Shapes:
        forward(x_dict, edge_index_dict) -> {node type: [N_t, out_channels]} for every node
        type that is a destination in ``metadata``; ``edge_index_dict`` may be a prebuilt
        ``hector.Graph`` (built with ``Graph.from_hetero`` in metadata order) or a block of
        ``hector.loader`` (x_dict: each type's source nodes; output: its destination rows).
    """

    def __init__(self, in_channels, out_channels: int, metadata, heads: int = 1, **compiler):
        super().__init__()
        node_types, edge_types = list(metadata[0]), [tuple(e) for e in metadata[1]]
        if isinstance(in_channels, dict):
            dims = set(in_channels.values())
            if len(dims) != 1 or set(in_channels) != set(node_types):
                raise NotImplementedError("HGTConv: in_channels must be one int for every node "
                                          f"type, got {in_channels}")
            in_channels = dims.pop()
        C.check_size(in_channels, "in_channels")
        C.check_size(out_channels, "out_channels")
        C.check_size(heads, "heads")
        if out_channels % heads:
            raise ValueError(f"'out_channels' (got {out_channels}) must be divisible by the "
                             f"number of heads (got {heads})")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.node_types, self.edge_types = node_types, edge_types
        self.dst_node_types = {e[-1] for e in edge_types}
        d = out_channels // heads
        T, R = len(node_types), len(edge_types)
        # One parameter per family, types stacked: PyG keeps one per node type and relation
        # (about a hundred on an RDF graph), and every parameter costs a warm training step
        # its own gradient accumulation and optimizer slot on the host, and a cold one the
        # stacking of the slices.  state_dict() and load_state_dict() speak PyG's keys.
        self.kqv_weight = nn.Parameter(torch.empty(T, 3 * out_channels, in_channels))
        self.kqv_bias = nn.Parameter(torch.empty(T, 3 * out_channels))
        self.out_weight = nn.Parameter(torch.empty(T, out_channels, out_channels))
        self.out_bias = nn.Parameter(torch.empty(T, out_channels))
        self.k_rel = _Typed(heads * R, d)
        self.v_rel = _Typed(heads * R, d)
        self.skip = nn.Parameter(torch.ones(T))
        self.p_rel = nn.Parameter(torch.ones(R, heads))
        self.register_state_dict_post_hook(_pyg_state)
        self.register_load_state_dict_pre_hook(_packed_state)
        self.program = Program(models.hgt, in_dim=in_channels, out_dim=out_channels, heads=heads,
                               num_relations=len(edge_types), num_node_types=len(node_types),
                               **compiler_options(**compiler))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w, b, fan_in in ((self.kqv_weight, self.kqv_bias, self.in_channels),
                             (self.out_weight, self.out_bias, self.out_channels)):
            bound = 1.0 / math.sqrt(fan_in)        # PyG Linear's kaiming_uniform, per type
            nn.init.uniform_(w, -bound, bound)
            nn.init.uniform_(b, -bound, bound)
        for rel in (self.k_rel, self.v_rel):
            bound = 1.0 / math.sqrt(rel.weight.size(1))
            nn.init.uniform_(rel.weight, -bound, bound)
        nn.init.ones_(self.skip)
        nn.init.ones_(self.p_rel)

    def pyg_keys(self) -> Dict[str, list]:
        """Each packed parameter's PyG keys, one per slice along its first axis."""
        types, rels = self.node_types, ["__".join(e) for e in self.edge_types]
        return {"kqv_weight": [f"kqv_lin.lins.{t}.weight" for t in types],
                "kqv_bias": [f"kqv_lin.lins.{t}.bias" for t in types],
                "out_weight": [f"out_lin.lins.{t}.weight" for t in types],
                "out_bias": [f"out_lin.lins.{t}.bias" for t in types],
                "skip": [f"skip.{t}" for t in types], "p_rel": [f"p_rel.{r}" for r in rels]}

    def in_pyg_layout(self, tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """``{packed name: tensor}`` (parameters, their gradients) -> PyG's names and shapes
        (views; None stays None: an unused parameter's gradient); other names pass
        through."""
        keys = self.pyg_keys()
        out = {}
        for name, t in tensors.items():
            if name not in keys:
                out[name] = t
                continue
            for i, key in enumerate(keys[name]):   # (skip and p_rel keep a leading axis of 1)
                out[key] = None if t is None else t[i:i + 1] if name in ("skip", "p_rel") \
                    else t[i]
        return out

    # -- PyG parameters -> the DSL's per-type stacks (differentiable views) ----------------
    def _weights(self) -> Dict[str, torch.Tensor]:
        """The DSL's per-type stacks: views of the packed parameters, no copy."""
        F, H, R = self.out_channels, self.heads, len(self.edge_types)
        d = F // H
        out = {}
        for i, name in enumerate(("k", "q", "v")):
            out[name] = self.kqv_weight[:, i * F:(i + 1) * F].transpose(1, 2)
            out[name + "_bias"] = self.kqv_bias[:, i * F:(i + 1) * F]
        for name, rel in (("k_rel", self.k_rel), ("v_rel", self.v_rel)):
            # PyG's type index is head * R + relation.
            out[name] = rel.weight.view(H, R, d, d).transpose(0, 1)
        out["p_rel"] = self.p_rel.view(R, H, 1)
        out["a"] = self.out_weight.transpose(1, 2)
        out["a_bias"] = self.out_bias
        if self.in_channels == self.out_channels:
            out["skip"] = self.skip.view(-1, 1)
        return out

    def graph_of(self, x_dict, edge_index_dict) -> Graph:
        if isinstance(edge_index_dict, Graph):
            g = edge_index_dict
            if g.node_type_names != self.node_types or g.relation_names != self.edge_types:
                raise ValueError(
                    f"the prebuilt Graph must have node types {self.node_types} and relations "
                    f"{self.edge_types} in metadata order (as Graph.from_hetero builds it); it "
                    f"has node types {g.node_type_names} and relations {g.relation_names}")
            if not g.node_types_contiguous:
                # x_dict is stacked type after type and the output sliced the same way, which
                # is only right when each node type is one contiguous id range.
                raise ValueError("the prebuilt Graph's node types are not contiguous id ranges; "
                                 "build it with Graph.from_hetero (or order node ids by type)")
            # x_dict is stacked type after type against the graph's type ranges: rows that
            # only add up to the graph's total would be silently read as other types' nodes.
            ptr = g.host_ptr["node"]
            for i, t in enumerate(self.node_types):
                rows, want = int(x_dict[t].shape[0]), ptr[i + 1] - ptr[i]
                if rows != want:
                    where = "the block has" if g.is_block else "the graph has"
                    raise ValueError(f"x_dict[{t!r}] has {rows} rows but {where} {want} {t!r} "
                                     "nodes; pass one row per node of each type")
            return g
        if not isinstance(edge_index_dict, dict):
            raise TypeError("edge_index_dict must be a dict {(src, rel, dst): edge_index} or a "
                            f"hector.Graph, got {type(edge_index_dict).__name__}")
        extra = [k for k in edge_index_dict if tuple(k) not in self.edge_types]
        if extra:
            raise ValueError(f"edge_index_dict has edge types {extra} not in metadata")
        counts = {t: int(x_dict[t].shape[0]) for t in self.node_types}
        given = [edge_index_dict.get(e) for e in self.edge_types]
        dev = next(iter(x_dict.values())).device

        def build() -> Graph:
            ordered = {e: t if t is not None else torch.zeros(2, 0, dtype=torch.long, device=dev)
                       for e, t in zip(self.edge_types, given)}
            return Graph.from_hetero(ordered, counts)
        # The shared build-once cache (verified against the tensors' contents on a hit); an
        # edge type without an entry is keyed as None, so absent types do not force rebuilds.
        return cached(given, ("hgt", tuple(map(tuple, self.edge_types))) + tuple(counts.items()),
                      build)

    def _type_slices(self, graph: Graph):
        """(node type, first row, end row) of each destination type in the output: Python
        ints (the compiler reads the node-type pointer from the graph once)."""
        ptr = node_type_bounds(graph)
        # On a block, type t's destinations are its first sources (hector.graph.block).
        ends = ([ptr[i] + graph.dst_type_ptr[i + 1] - graph.dst_type_ptr[i]
                 for i in range(len(self.node_types))] if graph.is_block else ptr[1:])
        return tuple((t, ptr[i], ends[i]) for i, t in enumerate(self.node_types)
                     if t in self.dst_node_types)

    @graphed
    def forward(self, x_dict: Dict[str, torch.Tensor], edge_index_dict) -> Dict[str, torch.Tensor]:
        if not isinstance(x_dict, dict):
            raise TypeError(f"x_dict must be a dict {{node type: features}}, got "
                            f"{type(x_dict).__name__}")
        missing = [t for t in self.node_types if t not in x_dict]
        if missing:
            raise ValueError(f"x_dict lacks node type(s) {missing} of metadata")
        for t in self.node_types:
            check_input(self, x_dict[t], f"x_dict[{t!r}]", width=self.in_channels)
        C.check_same_device([(f"x_dict[{t!r}]", x_dict[t]) for t in self.node_types], "x_dict")
        graph = self.graph_of(x_dict, edge_index_dict)
        # The program reads one node input: node types stacked in id order.  That is one
        # copy of the features per call, unless they are consecutive rows of one tensor
        # already (stacked_rows); avoiding it otherwise would need per-type inputs in the
        # IR (the typed K/Q/V GEMM and the skip both read x).
        x = stacked_rows(x_dict[t] for t in self.node_types)
        out = self.program(graph, {"x": x}, self._weights())[0]
        return _pieces(out, self._type_slices(graph))

    @classmethod
    def from_pyg(cls, module, **compiler) -> "HGTConv":
        """An HGTConv with the hyper-parameters and parameters of a PyG ``HGTConv``."""
        ours = cls(module.in_channels, module.out_channels,
                   (module.node_types, module.edge_types), module.heads, **compiler)
        return load_from_pyg(ours, module)

    def __repr__(self) -> str:
        return f"HGTConv({self.in_channels}, {self.out_channels}, heads={self.heads})"
