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


class _Lins(nn.Module):
    """PyG ``HeteroDictLinear``'s parameter layout (``lins.<type>.weight/bias``)."""

    def __init__(self, types, in_dim: int, out_dim: int):
        super().__init__()
        self.lins = nn.ModuleDict({t: nn.Linear(in_dim, out_dim) for t in types})


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
    2 adds of 1.9M x 64 rows, 1 ms of a 30 ms training step."""
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
    return {t: parts[i] for t, i in index.items()}


class HGTConv(nn.Module):
    r"""Heterogeneous graph transformer, per head:

    .. math::
        s_{uv} = \frac{(K_{\tau(u)} x_u W^{att}_r) \cdot Q_{\tau(v)} x_v \; p_r}{\sqrt{d}}, \quad
        \alpha = \mathrm{softmax}_{u \in N(v)} s, \quad
        x_v' = A_{\tau(v)}\, \mathrm{gelu}\Big(\sum_u \alpha_{uv} V_{\tau(u)} x_u W^{msg}_r\Big)

    with PyG's gated skip connection when in and out widths agree.  Compiled from
    :func:`hector.compiler.models.hgt`: ``k W^{att}_r`` and ``v W^{msg}_r`` run once per unique
    (src, relation) pair, then one attention traversal.

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
        self.kqv_lin = _Lins(node_types, in_channels, 3 * out_channels)
        self.out_lin = _Lins(node_types, out_channels, out_channels)
        self.k_rel = _Typed(heads * len(edge_types), d)
        self.v_rel = _Typed(heads * len(edge_types), d)
        self.skip = nn.ParameterDict({t: nn.Parameter(torch.ones(1)) for t in node_types})
        self.p_rel = nn.ParameterDict({"__".join(e): nn.Parameter(torch.ones(1, heads))
                                       for e in edge_types})
        self.program = Program(models.hgt, in_dim=in_channels, out_dim=out_channels, heads=heads,
                               num_relations=len(edge_types), num_node_types=len(node_types),
                               **compiler_options(**compiler))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lins in (self.kqv_lin, self.out_lin):
            for lin in lins.lins.values():
                bound = 1.0 / math.sqrt(lin.in_features)   # PyG Linear's kaiming_uniform
                nn.init.uniform_(lin.weight, -bound, bound)
                nn.init.uniform_(lin.bias, -bound, bound)
        for rel in (self.k_rel, self.v_rel):
            bound = 1.0 / math.sqrt(rel.weight.size(1))
            nn.init.uniform_(rel.weight, -bound, bound)
        for p in list(self.skip.values()) + list(self.p_rel.values()):
            nn.init.ones_(p)

    # -- PyG parameters -> the DSL's per-type stacks (differentiable views) ----------------
    def _weights(self) -> Dict[str, torch.Tensor]:
        # One stack per parameter family, then views: a stack of per-type slices made
        # autograd zero-fill and copy every slice's gradient and sum three per Linear, some
        # 460 tiny kernels per backward on a 27-type graph (bgs: half its eager training step).
        F, H, R = self.out_channels, self.heads, len(self.edge_types)
        d = F // H
        kqv = [self.kqv_lin.lins[t] for t in self.node_types]
        kqv_w = torch.stack([lin.weight for lin in kqv])          # [T, 3F, in]
        kqv_b = torch.stack([lin.bias for lin in kqv])            # [T, 3F]
        out = {}
        for i, name in enumerate(("k", "q", "v")):
            out[name] = kqv_w[:, i * F:(i + 1) * F].transpose(1, 2)
            out[name + "_bias"] = kqv_b[:, i * F:(i + 1) * F]
        for name, rel in (("k_rel", self.k_rel), ("v_rel", self.v_rel)):
            # PyG's type index is head * R + relation.
            out[name] = rel.weight.view(H, R, d, d).transpose(0, 1)
        out["p_rel"] = torch.stack([self.p_rel["__".join(e)] for e in self.edge_types]).view(R, H, 1)
        lins = [self.out_lin.lins[t] for t in self.node_types]
        out["a"] = torch.stack([lin.weight for lin in lins]).transpose(1, 2)
        out["a_bias"] = torch.stack([lin.bias for lin in lins])
        if self.in_channels == self.out_channels:
            out["skip"] = torch.stack([self.skip[t] for t in self.node_types])
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
