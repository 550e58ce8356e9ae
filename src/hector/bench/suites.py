"""What ``hector bench`` compares: per layer kind, the seeded PyG layer, hector's layer taken
over from it (``from_pyg``, so both hold the same parameters), hector's unoptimised plan for
the relational layers, and how each of them is called on one workload."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
from .. import datasets
from .. import nn as hnn
from ..datasets import profiles
from ..datasets.registry import REGISTRY, normalize
from ..graph import Graph

RELATIONAL = ("rgcn", "rgat", "hgt")
ATTENTION = ("gat", "agnn", "transformer")
LAYERS = RELATIONAL + ATTENTION
DEFAULT_LAYERS = ("rgcn", "gat")
DEFAULT_RELATIONAL_DATASET = "synthetic:aifb"
DEFAULT_ATTENTION_DATASET = "synthetic:cora"
CPU_DEFAULT_RELATIONAL_SCALE = 0.2     # keeps the no-argument CPU run short

UNOPTIMISED = dict(reorder=False, compact=False, fuse=False)


def parse_layers(text) -> List[str]:
    """'rgcn,gat' -> ['rgcn', 'gat']; raises ValueError naming --layers on unknown names."""
    if text is None:
        return list(DEFAULT_LAYERS)
    items = [t.strip().lower() for t in (text.split(",") if isinstance(text, str) else text)]
    items = [t for t in items if t]
    if not items:
        raise ValueError(f"--layers is empty; choose from {','.join(LAYERS)}")
    bad = [t for t in items if t not in LAYERS]
    if bad:
        raise ValueError(f"--layers: unknown layer name(s) {', '.join(map(repr, bad))}; "
                         f"choose from {','.join(LAYERS)}")
    return list(dict.fromkeys(items))


def check_dataset(name: str) -> None:
    """Raise ValueError naming --dataset when ``datasets.load`` would not know ``name``."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("--dataset must be a dataset name (e.g. cora, aifb, synthetic:aifb)")
    key = normalize(name)
    if key.startswith("synthetic:"):
        prof = key[len("synthetic:"):]
        if prof not in profiles.PROFILES:
            raise ValueError(f"--dataset: unknown synthetic profile {prof!r}; known profiles: "
                             f"{', '.join(sorted(profiles.PROFILES))}")
    elif key not in REGISTRY:
        raise ValueError(f"--dataset: unknown dataset name {name!r}; known names: "
                         f"{', '.join(sorted(REGISTRY))}, or synthetic:PROFILE")


def default_dataset(layer: str) -> str:
    return DEFAULT_RELATIONAL_DATASET if layer in RELATIONAL else DEFAULT_ATTENTION_DATASET


@dataclass(frozen=True)
class Case:
    """One measurement: a layer on a dataset at one width and head count."""
    layer: str
    dataset: str
    features: int
    heads: int = 1
    scale: Optional[float] = None      # synthetic profiles only; None: the profile's size
    root: Optional[str] = None         # local folder of a real dataset

    @property
    def workload_key(self) -> tuple:
        return (self.dataset, self.scale, self.root)


# -- workloads ----------------------------------------------------------------------------
class Workload:
    """One dataset on one device: its Graph, seeded random features ``x(F) [N, F]`` and the
    inputs each library's layers take."""

    def __init__(self, name: str, device: torch.device, root=None,
                 scale: Optional[float] = None, seed: int = 0):
        kw = {"seed": seed}
        if scale is not None and name.lower().startswith("synthetic:"):
            kw["scale"] = scale
        ds = datasets.load(name, root=root, **kw)
        self.name, self.device, self.scale = name, device, kw.get("scale")
        self.ds = ds.to(device)
        self.graph = self.ds.graph
        self.seed = seed
        self._x: Dict[int, torch.Tensor] = {}
        self.edge_index = self.ds.edge_index
        et = self.ds.edge_type
        self.edge_type = et if et is not None else torch.zeros(
            self.edge_index.shape[1], dtype=torch.long, device=device)
        self._homo = None
        self._hgt = None

    def x(self, features: int) -> torch.Tensor:
        """Seeded node features ``[N, features]`` (the same for every peer of a case)."""
        if features not in self._x:
            self._x.clear()                   # one width at a time: large graphs are large
            gen = torch.Generator().manual_seed(self.seed)
            self._x[features] = torch.randn(self.graph.num_nodes, features,
                                            generator=gen).to(self.device)
        return self._x[features]

    def describe(self) -> dict:
        g = self.graph
        return dict(dataset=self.name, scale=self.scale, nodes=g.num_nodes, edges=g.num_edges,
                    relations=g.num_relations, node_types=g.num_node_types)

    def homogeneous_graph(self):
        """The graph without relation ids (for the attention layers)."""
        if self._homo is None:
            self._homo = Graph(self.edge_index, num_nodes=self.graph.num_nodes)
        return self._homo

    # HGT: node types, renamed relations (PyG's ParameterDict keys cannot hold '.'), inputs
    def hgt(self):
        if self._hgt is None:
            g = self.graph
            types = list(g.node_type_names) if g.node_type_names else ["n"]
            ptr = g.node_type_ptr.tolist()
            counts = {t: ptr[i + 1] - ptr[i] for i, t in enumerate(types)}
            offsets = {t: ptr[i] for i, t in enumerate(types)}
            rels = g.relation_names or [(types[0], "", types[0])] * g.num_relations
            metadata = (types, [(s, f"r{i}", d) for i, (s, _, d) in enumerate(rels)])
            graph = Graph(g.input_edge_index(), edge_type=g.input_edge_type(),
                          num_nodes=g.num_nodes, num_relations=g.num_relations,
                          node_type=g.node_type.long(), num_node_types=len(types),
                          node_type_names=types, relation_names=metadata[1])
            ei, et = self.edge_index, self.edge_type
            order = torch.argsort(et, stable=True)
            per = torch.bincount(et, minlength=g.num_relations).tolist()
            hetero = {}
            for (s, r, d), part in zip(metadata[1], torch.split(ei[:, order], per, dim=1)):
                shift = torch.tensor([[offsets[s]], [offsets[d]]], device=ei.device)
                hetero[(s, r, d)] = (part - shift).contiguous()
            self._hgt = dict(metadata=metadata, counts=counts, graph=graph, hetero=hetero)
        return self._hgt

    def split(self, x) -> Dict[str, torch.Tensor]:
        counts = self.hgt()["counts"]
        return dict(zip(counts, torch.split(x, list(counts.values()), dim=0)))


# -- layers -------------------------------------------------------------------------------
@dataclass
class Peer:
    name: str
    module: torch.nn.Module
    call: Callable[[torch.Tensor], torch.Tensor]
    kind: str                         # 'pyg' (reference), 'pyg-compiled', 'hector'
    note: str = ""
    extra: dict = field(default_factory=dict)


def pyg_layer(layer: str, W: Workload, features: int, heads: int) -> torch.nn.Module:
    """The seeded PyG layer every peer takes its parameters from."""
    import torch_geometric.nn as pyg
    torch.manual_seed(0)
    F, H = features, heads
    per_head = max(1, F // H)
    R = W.graph.num_relations
    if layer == "rgcn":
        m = pyg.RGCNConv(F, F, R)
    elif layer == "rgat":
        m = pyg.RGATConv(F, per_head, R, heads=H)
    elif layer == "hgt":
        m = pyg.HGTConv(F, F, W.hgt()["metadata"], heads=H)
    elif layer == "gat":
        m = pyg.GATConv(F, per_head, heads=H)
    elif layer == "agnn":
        m = pyg.AGNNConv()
    elif layer == "transformer":
        m = pyg.TransformerConv(F, per_head, heads=H)
    else:
        raise ValueError(f"--layers: unknown layer {layer!r}")
    return m.to(W.device)


def _hector_class(layer: str):
    return {"rgcn": hnn.RGCNConv, "rgat": hnn.RGATConv, "hgt": hnn.HGTConv, "gat": hnn.GATConv,
            "agnn": hnn.AGNNConv, "transformer": hnn.TransformerConv}[layer]


def hector_layer(layer: str, ref: torch.nn.Module, backend: str, **switches) -> torch.nn.Module:
    cls = _hector_class(layer)
    if layer in RELATIONAL:
        return cls.from_pyg(ref, backend=backend, **switches)
    return cls.from_pyg(ref, backend=backend)


def own_layer(layer: str, W: Workload, features: int, heads: int, backend: str,
              **switches) -> torch.nn.Module:
    """hector's layer with ``pyg_layer``'s sizes, seeded, built without PyG (``--no-pyg``)."""
    torch.manual_seed(0)
    cls, F, H = _hector_class(layer), features, heads
    per_head, R = max(1, F // H), W.graph.num_relations
    kw = dict(backend=backend, **switches)
    if layer == "rgcn":
        m = cls(F, F, R, **kw)
    elif layer == "rgat":
        m = cls(F, per_head, R, heads=H, **kw)
    elif layer == "hgt":
        m = cls(F, F, W.hgt()["metadata"], heads=H, **kw)
    elif layer == "agnn":
        m = cls(**kw)
    else:
        m = cls(F, per_head, heads=H, **kw)
    return m.to(W.device)


def caller(layer: str, module, W: Workload, pyg: bool) -> Callable:
    """x -> one output tensor (HGT: node types' outputs concatenated in a fixed order)."""
    if layer == "hgt":
        h = W.hgt()
        eid = h["hetero"] if pyg else h["graph"]

        def call(x):
            out = module(W.split(x), eid)
            return torch.cat([out[t] for t in sorted(out)], 0)
        return call
    if layer in RELATIONAL:
        if pyg:
            return lambda x: module(x, W.edge_index, W.edge_type)
        return lambda x: module(x, W.graph)
    if pyg:
        return lambda x: module(x, W.edge_index)
    g = W.homogeneous_graph()
    return lambda x: module(x, g)


def peers(layer: str, W: Workload, features: int, heads: int, backend: str,
          with_pyg: bool = True, compile_pyg: bool = False, capture: bool = False):
    """(reference PyG module, [Peer, ...]): PyG eager, PyG compiled and compiled with
    mode="reduce-overhead" (CUDA), hector, hector captured in CUDA graphs (``capture``: the
    runner replays one graph per inference call and one per training step), hector
    unoptimised (relational layers).  Without PyG (``with_pyg=False``) torch_geometric is not
    imported: the reference is None and hector's layers are built on their own, seeded."""
    out: List[Peer] = []
    ref = None
    if with_pyg:
        ref = pyg_layer(layer, W, features, heads)
        out.append(Peer("PyG eager", ref, caller(layer, ref, W, True), "pyg"))
        if compile_pyg:
            compiled = torch.compile(ref)
            out.append(Peer("PyG compile", ref, caller(layer, compiled, W, True),
                            "pyg-compiled"))
            overhead = torch.compile(ref, mode="reduce-overhead")
            out.append(Peer("PyG compile RO", ref, caller(layer, overhead, W, True),
                            "pyg-compiled", note='torch.compile(mode="reduce-overhead")'))

    def make(**switches):
        if ref is None:
            return own_layer(layer, W, features, heads, backend, **switches)
        return hector_layer(layer, ref, backend, **switches).to(W.device)
    ours = make()
    out.append(Peer("hector", ours, caller(layer, ours, W, False), "hector"))
    if capture:
        out.append(Peer("hector captured", ours, caller(layer, ours, W, False), "hector",
                        note="CUDA graph replay", extra={"captured": True}))
    if layer in RELATIONAL:
        plain = make(**UNOPTIMISED)
        out.append(Peer("hector unopt", plain, caller(layer, plain, W, False), "hector",
                        note="reorder=False, compact=False, fuse=False"))
    return ref, out
