"""``hector.Graph``: the immutable, device-resident description of a (heterogeneous) graph that
every layer and kernel reads.  Built once per graph with vectorised torch ops; validated once,
at build time, so the hot path never re-checks ids."""
from __future__ import annotations

import operator
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import checks as C
from . import build
from .batching import batch_graphs
from .hetero import flatten_hetero
from .structures import CSR, CompactMap, DegreeStats, move, nbytes_of

#: A node whose in-degree reaches this is a *super node* (the DF-GNN notion: one row with so
#: many neighbours that a node-parallel program for it would straggle).
SUPER_NODE_DEGREE = 1000

EdgeTypeName = Tuple[str, str, str]

#: Derivations that can be made again on another graph of the same shape: name ->
#: ``recipe(graph, *args)``, reading the graph only through its argument.  A graph made by
#: :meth:`Graph.derive` is what an overlapped captured step builds with a batch's blocks on
#: the sampling stream (:func:`hector.graph.twin.prederive`) instead of in its step.
RECIPES: Dict[str, Callable] = {}


def recipe(name: str):
    """Register ``fn(graph, *args)`` as the recipe of the derivations named ``name``."""
    def register(fn):
        RECIPES[name] = fn
        return fn
    return register


def recipe_name(key) -> Optional[str]:
    """The recipe name of a derivation key (``name`` or ``(name, *args)``), None if none."""
    name = key if isinstance(key, str) else key[0] if type(key) is tuple and key else None
    return name if name in RECIPES else None


class Graph:
    """A graph with typed nodes and typed (relational) edges.

    Args:
        edge_index: ``[2, E]`` integer tensor of (source, destination) node ids.
        edge_type: ``[E]`` relation id of each edge (default: one relation).
        num_nodes: number of nodes (default: largest id + 1, or ``len(node_type)``).
        num_relations: number of relations (default: largest ``edge_type`` + 1).
        node_type: ``[N]`` node-type id of each node (default: one node type).
        num_node_types: number of node types (default: largest ``node_type`` + 1).
        node_type_names: a name per node type.
        relation_names: a canonical ``(src_type, relation, dst_type)`` per relation; with
            ``node_type_names`` given, every edge's endpoints are checked against it.
        super_node_threshold: in-degree from which a node counts as a super node.
        check_ids: check every id against its range and, with names, every edge's endpoint
            types (one device read each).  ``False`` is for ids valid by construction, as
            ``hector.loader`` makes its blocks (with all sizes given): a wrong id is then
            undefined behaviour, not an error.
        dst_sorted: the edges are given sorted by (destination, relation), as
            ``hector.loader``'s sampler lists them: the build then skips one sort of the edges
            and shortens another (see :func:`~hector.graph.build.relation_order`).  Checked
            with the build's one read: ValueError when they are not.

    Canonical edge order: edges sorted by (relation, destination), input order within ties.
    Every edge-wise array (``src``, ``dst``, ``etype``, CSR ``eid`` s, compact ``edge_row``) is
    in that order; ``edge_perm[i]`` is the input position of canonical edge ``i``.

    Attributes:
        rel_ptr: ``[R + 1]`` segment of each relation in canonical order.
        csr_in: CSR by destination (aggregation, softmax over incoming edges).
        csr_out: CSR by source (source-side gradients without atomics), built on first use.
        compact_src / compact_dst: unique (src, relation) / (dst, relation) pairs.
        in_degree / out_degree: :class:`DegreeStats`.
        node_type_ptr: ``[T + 1]``; with ``node_perm`` (None when node types are already
            contiguous id ranges) it lists the nodes of each type.
        host_ptr: the segment pointers as Python ints, read once by the build: ``"edge"``
            (``rel_ptr``), ``"compact_src"`` / ``"compact_dst"`` (their ``rel_ptr``) and
            ``"node"`` (``node_type_ptr``).
        num_dst_nodes, dst_index, dst_type_ptr: set on bipartite blocks only (see
            :mod:`hector.graph.block`); ``num_dst_nodes`` is None on an ordinary graph.
    """

    # Block attributes (hector.graph.block.mark_block sets them on a mini-batch's blocks).
    num_dst_nodes: Optional[int] = None
    dst_index: Optional[torch.Tensor] = None
    dst_type_ptr: Optional[List[int]] = None
    #: A capacity block's make-up (see :mod:`hector.graph.capacity`); None otherwise.
    capacity = None

    def __init__(self, edge_index: torch.Tensor, edge_type: Optional[torch.Tensor] = None,
                 num_nodes: Optional[int] = None, num_relations: Optional[int] = None,
                 node_type: Optional[torch.Tensor] = None, num_node_types: Optional[int] = None,
                 node_type_names: Optional[Sequence[str]] = None,
                 relation_names: Optional[Sequence[EdgeTypeName]] = None,
                 super_node_threshold: int = SUPER_NODE_DEGREE, *, check_ids: bool = True,
                 dst_sorted: bool = False):
        src, dst, etype, ntype, sizes = _validate(
            edge_index, edge_type, num_nodes, num_relations, node_type, num_node_types,
            node_type_names, relation_names, super_node_threshold, check_ids)
        self.num_nodes, self.num_relations, self.num_node_types = sizes
        self.num_edges = int(src.numel())
        build.check_build_memory(self.num_nodes, self.num_edges, self.num_relations, src.device)
        self.device = src.device
        self.index_dtype = build.index_dtype(self.num_nodes, self.num_edges)
        self.node_type_names = list(node_type_names) if node_type_names is not None else None
        self.relation_names = [tuple(r) for r in relation_names] if relation_names is not None else None
        self.graph_ptr: Optional[torch.Tensor] = None   # set by Graph.batch
        self._build(src, dst, etype, ntype, super_node_threshold, bool(dst_sorted))
        self._device_copies: Dict[torch.device, Graph] = {self.device: self}
        # Quantities derived from this (immutable) graph, memoised by ``derived``.  A plain
        # attribute set here: torch.compile (2.11) cannot trace ``__dict__.setdefault``.
        self._derived: Dict[object, object] = {}

    # -- construction ---------------------------------------------------------------------
    def _build(self, src, dst, etype, ntype, super_node_threshold, dst_sorted):
        n, r, t = self.num_nodes, self.num_relations, self.num_node_types
        idx = self.index_dtype
        in_order = torch.ones((), dtype=torch.bool, device=src.device)
        if dst_sorted:
            if src.numel() > 1:      # (read with the sizes below; a wrong order raises there)
                key = dst * max(r, 1) + etype
                in_order = (key[1:] >= key[:-1]).all()
            perm = build.relation_order(etype, r)
            self.csr_in = build.csr_of_sorted_input(src, dst, perm, n)
        else:
            perm = build.canonical_order(src, dst, etype, n, r)
        src, dst, etype = (build.take(a, perm) for a in (src, dst, etype))
        rel_ptr = build.sorted_ptr(etype, r)        # (canonical order: by relation)
        if not dst_sorted:
            self.csr_in = build.csr(dst, src, n)
        # The CSR by source (a sort) waits for its first use: a mini-batch block's forward and
        # most backwards never read it.  Its degrees are counted here, for the statistics.
        self._csr_out = None
        runs_src = build.compact_runs(src, etype, n, r, keys_sorted=False)
        runs_dst = build.compact_runs(dst, etype, n, r, keys_sorted=True)
        if ntype is None:
            ntype = torch.zeros(n, dtype=torch.int64, device=src.device)
        type_ptr, contiguous = build.type_ptr(ntype, t)
        degrees = [self.csr_in.degrees(), build.counts_of(src, n)]
        # Every size and pointer the build and the runtime need on the host, in ONE read (each
        # read is a device sync on CUDA, paid by every mini-batch block): the segment pointers
        # (which also size the compact maps), the node-type contiguity and the degree stats.
        ptrs = (rel_ptr, runs_src.rel_ptr, runs_dst.rel_ptr, type_ptr)
        flags = torch.stack([contiguous, in_order]).to(torch.int64)
        stats = [DegreeStats.parts(d, super_node_threshold) for d in degrees if d.numel()]
        values = torch.cat(ptrs + (flags,) + tuple(stats)).tolist()
        host = []
        for p in ptrs:
            host.append([int(v) for v in values[:p.numel()]])
            values = values[p.numel():]
        self.node_types_contiguous = bool(values[0])
        if not values[1]:
            raise ValueError("dst_sorted=True but the edges are not sorted by (destination, "
                             "relation): edge_index[1] * num_relations + edge_type must be "
                             "non-decreasing")
        values = values[1:]
        node_perm = None
        if not self.node_types_contiguous:     # (type_ptr's pointers assumed sorted types)
            type_ptr, node_perm = build.regroup_types(ntype, t)
            host[3] = type_ptr.tolist()
        self.in_degree, self.out_degree = DegreeStats.from_values(
            degrees, values[1:], super_node_threshold)
        self.compact_src = build.compact_from_runs(runs_src, host[1][-1], n)
        self.compact_dst = build.compact_from_runs(runs_dst, host[2][-1], n)
        self.host_ptr = dict(zip(("edge", "compact_src", "compact_dst", "node"), host))
        # Narrow every id array to the index dtype once, here; pointers that may exceed the
        # number of edges stay int64 only when the index dtype is int64 anyway.
        self.src, self.dst, self.etype = src.to(idx), dst.to(idx), etype.to(torch.int32)
        self.edge_perm = perm.to(idx)
        self.node_type = ntype.to(torch.int32)
        self.node_perm = node_perm.to(idx) if node_perm is not None else None
        self.rel_ptr = rel_ptr.to(idx)
        self.node_type_ptr = type_ptr.to(idx)
        self.csr_in = CSR(*(a.to(idx) for a in (self.csr_in.ptr, self.csr_in.col, self.csr_in.eid)))
        self.compact_src = self.compact_src.narrowed(idx)
        self.compact_dst = self.compact_dst.narrowed(idx)

    @property
    def csr_out(self) -> CSR:
        """CSR by source, built on first use (the sort by source of the canonical edges)."""
        if self._csr_out is None:
            c = build.csr(self.src.long(), self.dst.long(), self.num_nodes)
            self._csr_out = CSR(*(a.to(self.index_dtype) for a in (c.ptr, c.col, c.eid)))
        return self._csr_out

    @csr_out.setter
    def csr_out(self, value: CSR) -> None:
        self._csr_out = value

    @classmethod
    def from_hetero(cls, edge_index_dict: Dict[EdgeTypeName, torch.Tensor],
                    num_nodes_dict: Dict[str, int], **kwargs) -> "Graph":
        """Build from PyG's ``HeteroData`` layout: per-type local ids become one global id
        space where node type ``t`` owns a contiguous range (in ``num_nodes_dict`` order), and
        relations are numbered in ``edge_index_dict`` order."""
        flat = flatten_hetero(edge_index_dict, num_nodes_dict)
        return cls(flat.edge_index, edge_type=flat.edge_type, num_nodes=flat.num_nodes,
                   num_relations=len(flat.relation_names), node_type=flat.node_type,
                   num_node_types=len(flat.node_type_names),
                   node_type_names=flat.node_type_names, relation_names=flat.relation_names,
                   **kwargs)

    @classmethod
    def batch(cls, graphs: Sequence["Graph"]) -> "Graph":
        """Block-diagonal batch of graphs sharing one schema (node types and relations).
        ``graph_ptr[i]:graph_ptr[i+1]`` are the node ids of graph ``i`` in the batch."""
        return batch_graphs(cls, graphs)

    @property
    def is_block(self) -> bool:
        """Whether this graph is a bipartite block of a mini-batch (layers on it return only
        its ``num_dst_nodes`` destination rows)."""
        return self.num_dst_nodes is not None

    # -- views ----------------------------------------------------------------------------
    def input_edge_index(self) -> torch.Tensor:
        """``[2, E]`` edges back in the order they were given (int64)."""
        out = torch.empty(2, self.num_edges, dtype=torch.int64, device=self.device)
        out[:, self.edge_perm.long()] = torch.stack([self.src, self.dst]).long()
        return out

    def input_edge_type(self) -> torch.Tensor:
        out = torch.empty(self.num_edges, dtype=torch.int64, device=self.device)
        out[self.edge_perm.long()] = self.etype.long()
        return out

    def relation_source_types(self) -> Optional[Tuple[int, ...]]:
        """Each relation's source node type, or None when some relation leaves nodes of
        several types.  What lets a compiled layer fold a per-node-type weight into a
        per-relation one (HGT's ``K_tau W_r``).  From the names when the graph has them (the
        constructor checked the endpoints against them, or the graph was built from one that
        was), else from the edges with one host read; kept on the graph."""
        return self.derived("relation_source_types", self._relation_source_types)

    def _relation_source_types(self) -> Optional[Tuple[int, ...]]:
        r, t = self.num_relations, self.num_node_types
        if t == 1:
            return (0,) * r
        if self.relation_names is not None and self.node_type_names is not None:
            index = {n: i for i, n in enumerate(self.node_type_names)}
            return tuple(index[s] for s, _, _ in self.relation_names)
        types = self.node_type.long()[self.src.long()]
        rel = self.etype.long()
        lo = torch.full((r,), t, dtype=torch.int64, device=self.device)
        lo = lo.scatter_reduce(0, rel, types, "amin")
        hi = torch.full((r,), -1, dtype=torch.int64, device=self.device)
        hi = hi.scatter_reduce(0, rel, types, "amax")
        lo, hi = torch.stack([lo, hi]).tolist()
        if any(a != b for a, b in zip(lo, hi) if b >= 0):
            return None
        return tuple(a if b >= 0 else 0 for a, b in zip(lo, hi))   # (no edges: any type)

    def nodes_of_type(self, node_type) -> torch.Tensor:
        """Global ids of the nodes of one type (by index or name), ascending."""
        t = self._type_index(node_type)
        lo, hi = self.host_ptr["node"][t], self.host_ptr["node"][t + 1]
        if self.node_types_contiguous:
            return torch.arange(lo, hi, device=self.device)
        return self.node_perm[lo:hi].long()

    def relation_index(self, relation) -> int:
        """The id of ``relation``: an id (int, numpy or 0-d tensor integer), a relation name
        or a ``(src_type, relation, dst_type)`` triple."""
        if not isinstance(relation, (str, tuple, list)):
            relation = _as_id(relation, "relation", "an int id, a relation name (str) or a "
                                                    "(src_type, relation, dst_type) tuple")
        if isinstance(relation, int):
            if not 0 <= relation < self.num_relations:
                raise ValueError(f"relation {relation} out of range for num_relations="
                                 f"{self.num_relations}")
            return relation
        names = self.relation_names or []
        if isinstance(relation, str):
            matches = [i for i, n in enumerate(names) if n[1] == relation]
        else:
            matches = [i for i, n in enumerate(names) if n == tuple(relation)]
        if len(matches) != 1:
            raise ValueError(f"relation {relation!r} is {'ambiguous' if matches else 'unknown'}; "
                             f"known relations: {names}")
        return matches[0]

    def _type_index(self, node_type) -> int:
        if isinstance(node_type, str):
            if not self.node_type_names or node_type not in self.node_type_names:
                raise ValueError(f"unknown node type {node_type!r}; known: {self.node_type_names}")
            return self.node_type_names.index(node_type)
        node_type = _as_id(node_type, "node_type", "an int id or a node type name (str)")
        if not 0 <= node_type < self.num_node_types:
            raise ValueError(f"node type {node_type} out of range for num_node_types="
                             f"{self.num_node_types}")
        return node_type

    def with_one_node_type(self, name: str = "n",
                           relation_names: Optional[Sequence[EdgeTypeName]] = None) -> "Graph":
        """This graph's nodes, edges and relations as a graph of ONE node type ``name``,
        relations named ``relation_names`` (``(name, r, name)`` each; default ``r0``, ``r1``,
        ...), sharing every index array: no copy, no sort, no device read.  For a layer built
        for one node type over relations (``hector train``'s HGT) on a graph whose nodes are
        typed: a mini-batch block of ogbn-mag, say.  Rebuilding such a block from its edges per
        relation instead costs a mask per relation, a range check per edge array and two sorts,
        with a device sync each.  A block's view is an ordinary graph over the block's sources:
        a layer returns every row, :func:`~hector.graph.block.dst_rows` of the block selects
        its destinations."""
        if relation_names is None:
            relation_names = [(name, f"r{r}", name) for r in range(self.num_relations)]
        relation_names = [tuple(r) for r in relation_names]
        _check_names(relation_names, "relation_names", self.num_relations, "num_relations")
        if any(len(r) != 3 or r[0] != name or r[2] != name for r in relation_names):
            raise ValueError(f"relation_names must be ({name!r}, relation, {name!r}) triples "
                             f"on the one node type, got {relation_names}")
        view = object.__new__(Graph)
        view.__dict__.update({k: v for k, v in self.__dict__.items()
                              if k not in ("_device_copies", "_derived", "_attention_op_handle",
                                           "num_dst_nodes", "dst_index", "dst_type_ptr")})
        n, idx = self.num_nodes, self.index_dtype
        view.num_node_types, view.node_types_contiguous, view.node_perm = 1, True, None
        view.node_type = torch.zeros(n, dtype=torch.int32, device=self.device)
        # (made on the device, not copied from the host: a captured step derives this view)
        view.node_type_ptr = torch.arange(2, dtype=idx, device=self.device) * n
        view.host_ptr = dict(self.host_ptr, node=[0, n])
        view.node_type_names, view.relation_names = [name], relation_names
        view._derived, view._device_copies = {}, {self.device: view}
        return view

    # -- device and memory ----------------------------------------------------------------
    def to(self, device) -> "Graph":
        """This graph on ``device``; the copy is kept, so moving twice costs nothing."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device not in self._device_copies:
            other = object.__new__(Graph)
            # Derived graphs (``_derived``) are rebuilt per device on demand, not shared.
            # Nor is the custom ops' handle mark: the copy is named by a handle of its own.
            other.__dict__.update({k: _move_value(v, device) for k, v in self.__dict__.items()
                                   if k not in ("_device_copies", "_derived",
                                                "_attention_op_handle")})
            other.device = device
            other._derived = {}
            other._device_copies = self._device_copies   # shared: every copy knows the others
            self._device_copies[device] = other
        return self._device_copies[device]

    def derived(self, key, build):
        """``build()``, made once per ``key`` and kept on this graph (graphs are immutable, so
        anything computed from one stays valid; a copy on another device has its own)."""
        memo = self._derived
        if key not in memo:
            memo[key] = build()
        return memo[key]

    def derive(self, key):
        """The registered derivation ``key`` (``name`` or ``(name, *args)``, see
        :data:`RECIPES`), made once and kept like :meth:`derived`, and made again from
        another graph's arrays where a step asks (:func:`hector.graph.twin.prederive`)."""
        name, args = (key, ()) if isinstance(key, str) else (key[0], key[1:])
        return self.derived(key, lambda: RECIPES[name](self, *args))

    def nbytes(self) -> int:
        """Bytes held by this graph's index structures on its device."""
        tensors = [self.src, self.dst, self.etype, self.edge_perm, self.rel_ptr, self.node_type,
                   self.node_type_ptr, self.node_perm, self.graph_ptr]
        return (sum(t.numel() * t.element_size() for t in tensors if t is not None)
                + nbytes_of(self.csr_in, self.csr_out, self.compact_src, self.compact_dst))

    def summary(self) -> dict:
        """Plain-Python statistics (what ``hector info`` prints)."""
        rel_ptr, type_ptr = self.host_ptr["edge"], self.host_ptr["node"]
        rel_counts = [b - a for a, b in zip(rel_ptr, rel_ptr[1:])]
        type_counts = [b - a for a, b in zip(type_ptr, type_ptr[1:])]
        return {
            "num_nodes": self.num_nodes, "num_edges": self.num_edges,
            "num_node_types": self.num_node_types, "num_relations": self.num_relations,
            "nodes_per_type": dict(zip(self.node_type_names or map(str, range(self.num_node_types)),
                                       type_counts)),
            "edges_per_relation": dict(zip(
                ["/".join(r) for r in self.relation_names] if self.relation_names
                else map(str, range(self.num_relations)), rel_counts)),
            "compact_src_rows": self.compact_src.num_rows,
            "compact_dst_rows": self.compact_dst.num_rows,
            "in_degree": self.in_degree.__dict__, "out_degree": self.out_degree.__dict__,
            "index_dtype": str(self.index_dtype).replace("torch.", ""),
            "device": str(self.device), "nbytes": self.nbytes(),
        }

    def __repr__(self) -> str:
        return (f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"num_relations={self.num_relations}, num_node_types={self.num_node_types}, "
                f"max_in_degree={self.in_degree.max}, device={self.device}"
                + (f", num_dst_nodes={self.num_dst_nodes})" if self.is_block else ")"))


def _move_value(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (CSR, CompactMap)):
        return move(value, device)
    return value


def _as_id(value, name: str, allowed: str) -> int:
    """``value`` as an int id (numpy and 0-d integer tensors included; not a bool), or a
    TypeError naming ``name`` and what it may be."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{name} must be {allowed}, got {type(value).__name__} ({value!r})")

def _validate(edge_index, edge_type, num_nodes, num_relations, node_type, num_node_types,
              node_type_names, relation_names, super_node_threshold, check_ids=True):
    """Every check of DESIGN.md section 6 that concerns graph structure, in one place, before
    any structure is built.  Returns int64 (src, dst, etype, node_type|None) and the sizes.
    ``check_ids`` False skips the checks that read ids on the host (every size must then be
    given: a size found from the ids would read them too)."""
    C.check_edge_index(edge_index)
    num_edges = edge_index.shape[1]
    if edge_type is not None:
        C.check_index(edge_type, "edge_type", 1)
        C.check_same_length(edge_type, "edge_type", num_edges, "edge_index (its second dim)")
    if node_type is not None:
        C.check_index(node_type, "node_type", 1)
    C.check_same_device([("edge_index", edge_index), ("edge_type", edge_type),
                         ("node_type", node_type)])
    num_nodes = C.check_count(num_nodes, "num_nodes", allow_none=True)
    num_relations = C.check_count(num_relations, "num_relations", allow_none=True)
    num_node_types = C.check_count(num_node_types, "num_node_types", allow_none=True)
    C.check_count(super_node_threshold, "super_node_threshold")

    src, dst = edge_index[0].long(), edge_index[1].long()
    if node_type is not None:
        if num_nodes is None:
            num_nodes = int(node_type.shape[0])
        C.check_same_length(node_type, "node_type", num_nodes, "num_nodes")
    if num_nodes is None:
        if num_edges and int(edge_index.min()) < 0:
            C.check_range(edge_index.reshape(-1), "edge_index", 1, "num_nodes")
        num_nodes = int(edge_index.max()) + 1 if num_edges else 0
    ranges = [(src, "edge_index[0] (source ids)", num_nodes, "num_nodes"),
              (dst, "edge_index[1] (destination ids)", num_nodes, "num_nodes")]

    if edge_type is None:
        etype = torch.zeros(num_edges, dtype=torch.int64, device=src.device)
        num_relations = 1 if num_relations is None else num_relations
        if num_relations < 1 and num_edges:
            raise ValueError("num_relations must be >= 1 when the graph has edges")
    else:
        etype = edge_type.long()
        if num_relations is None:
            num_relations = int(etype.max()) + 1 if num_edges else 1
            if num_edges and int(etype.min()) < 0:
                C.check_range(etype, "edge_type", num_relations, "num_relations")
        ranges.append((etype, "edge_type", num_relations, "num_relations"))

    ntype = None
    if node_type is not None:
        ntype = node_type.long()
        if num_node_types is None:
            num_node_types = int(ntype.max()) + 1 if num_nodes else 1
            if num_nodes and int(ntype.min()) < 0:
                C.check_range(ntype, "node_type", num_node_types, "num_node_types")
        ranges.append((ntype, "node_type", num_node_types, "num_node_types"))
    if check_ids:
        _check_ranges(ranges)
    num_node_types = 1 if num_node_types is None else max(num_node_types, 1)

    _check_names(node_type_names, "node_type_names", num_node_types, "num_node_types")
    if node_type_names is not None and len(set(node_type_names)) != len(node_type_names):
        # one name for two types: lookups by name see only the first (nodes_of_type, relations)
        raise ValueError(f"node_type_names has a name twice ({list(node_type_names)}); each "
                         "node type needs its own name")
    _check_names(relation_names, "relation_names", num_relations, "num_relations")
    if relation_names is not None:
        for i, r in enumerate(relation_names):
            if not (isinstance(r, (tuple, list)) and len(r) == 3 and all(isinstance(s, str) for s in r)):
                raise TypeError(f"relation_names[{i}] must be a (src_type, relation, dst_type) "
                                f"tuple of str, got {r!r}")
        if node_type_names is not None:
            _check_endpoint_types(src, dst, etype, ntype, node_type_names, relation_names,
                                  check_ids)
    return src, dst, etype, ntype, (num_nodes, num_relations, num_node_types)


def _check_ranges(checks) -> None:
    """``check_range`` of every (values, name, upper, upper_name), in order, with one host
    read for all of them (two per array before: eight device syncs per mini-batch block)."""
    checks = [c for c in checks if c[0].numel()]
    if not checks:
        return
    bounds = torch.stack([t for c in checks for t in (c[0].min(), c[0].max())]).tolist()
    for (values, name, upper, upper_name), lo, hi in zip(checks, bounds[0::2], bounds[1::2]):
        if lo < 0 or hi >= upper:
            C.check_range(values, name, upper, upper_name)     # raises, naming the argument


def _check_names(names, name: str, expected: int, expected_name: str) -> None:
    if names is None:
        return
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise TypeError(f"{name} must be a sequence, got {type(names).__name__}")
    if len(names) != expected:
        raise ValueError(f"{name} has {len(names)} entries but {expected_name}={expected}")


def _check_endpoint_types(src, dst, etype, ntype, node_type_names: List[str],
                          relation_names: Sequence[EdgeTypeName], check_ids: bool = True) -> None:
    """Each edge of relation (s, r, d) must leave a node of type s and enter one of type d
    (the names always; the edges only with ``check_ids``)."""
    index = {n: i for i, n in enumerate(node_type_names)}
    for i, (s, _, d) in enumerate(relation_names):
        for t in (s, d):
            if t not in index:
                raise ValueError(f"relation_names[{i}]={relation_names[i]!r} names node type "
                                 f"{t!r}, which is not in node_type_names {list(node_type_names)}")
    if ntype is None or src.numel() == 0 or not check_ids:
        return
    pairs = tuple((index[s], index[d]) for s, _, d in relation_names)
    want = build.host_constant(pairs, src.device)[etype]      # [R, 2], kept per device
    bad = (ntype[src] != want[:, 0]) | (ntype[dst] != want[:, 1])
    if bool(bad.any()):
        e = int(bad.nonzero()[0, 0])
        r = relation_names[int(etype[e])]
        raise ValueError(f"edge {e} ({int(src[e])} -> {int(dst[e])}) has relation {r!r} but "
                         f"its endpoints have node types ({node_type_names[int(ntype[src[e]])]!r}, "
                         f"{node_type_names[int(ntype[dst[e]])]!r})")


@recipe("one_node_type")
def _one_node_type(graph: Graph, name: str, relation_names) -> Graph:
    return graph.with_one_node_type(name, relation_names)
