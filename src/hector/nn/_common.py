"""What every layer does with its inputs before the math: find or build the Graph, check the
features against it, and take over a PyG layer's parameters."""
from __future__ import annotations

import itertools
from typing import Callable, Optional

import torch

from .. import checks as C
from ..device import BACKENDS
from ..graph import Graph, graph_of, with_self_loops
from ..kernels.attention.op import STRATEGIES
from ..graph.block import dst_rows, take_rows  # noqa: F401  (take_rows: for the layers)


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return strategy


def first_floating(module: torch.nn.Module) -> Optional[torch.Tensor]:
    """A layer's first floating parameter, else its first floating buffer (None if it has
    neither): what its device and dtype are read from.  Lazily: listing every parameter
    first cost HGT on bgs (27 node types, 122 relations: some 300 parameters, once per node
    type's input) most of its 19 ms eager forward."""
    return next((t for t in itertools.chain(module.parameters(), module.buffers())
                 if t.is_floating_point()), None)


def param_dtype(module: torch.nn.Module):
    """The dtype of :func:`first_floating` (None if there is none)."""
    t = first_floating(module)
    return None if t is None else t.dtype


def program_of(module: torch.nn.Module, key: tuple, make: Callable[[], object]):
    """The layer's compiled program for ``key``: the hyper-parameters it compiles as they are
    now (a user may set ``dropout`` or ``strategy`` after construction; the program made for
    the old value would silently keep it), made by ``make`` on first need and kept."""
    programs = module.__dict__.setdefault("_programs", {})
    prog = programs.get(key)
    if prog is None:
        prog = programs[key] = make()
    return prog


def check_input(module: torch.nn.Module, x, name: str = "x", width=None) -> torch.Tensor:
    """Every layer's first check of its node features (see ``checks.check_node_input``)."""
    return C.check_node_input(x, name, width, param_dtype(module))


def resolve_graph(x: torch.Tensor, edge_index, add_self_loops: bool) -> Graph:
    """``edge_index`` may be a PyG ``[2, E]`` tensor (its Graph is built once and cached while
    the tensor lives unchanged) or a prebuilt ``hector.Graph``."""
    C.check_tensor(x, "x")
    if x.dim() < 1:
        raise ValueError(f"x must have shape [num_nodes, features], got {tuple(x.shape)}")
    if isinstance(edge_index, Graph):
        graph = edge_index
    else:
        C.check_edge_index(edge_index)
        graph = graph_of(edge_index, num_nodes=int(x.shape[0]))
    C.check_features(x, "x", graph.num_nodes, "graph.num_nodes", graph.device)
    return with_self_loops(graph) if add_self_loops else graph


def no_edge_features(edge_attr, layer: str) -> None:
    if edge_attr is not None:
        raise NotImplementedError(f"{layer}: edge features (edge_attr / edge_dim) are not "
                                  "supported yet; pass edge_attr=None")


def load_from_pyg(module: torch.nn.Module, pyg_module: torch.nn.Module,
                  unused: tuple = ()) -> torch.nn.Module:
    """Copy a PyG layer's parameters (our layers use PyG's parameter names) and match its
    device and dtype (of its first parameter, else of its first floating buffer: PyG's
    ``AGNNConv`` with a fixed beta has only that).  Moved first, then copied: a float64
    value is not rounded through our float32 tensors.  ``unused``: name prefixes of PyG
    parameters that this configuration of the PyG layer owns but never uses in its forward
    (left out)."""
    state = {k: v for k, v in pyg_module.state_dict().items()
             if not any(k.startswith(p) for p in unused)}
    ref = first_floating(pyg_module)
    if ref is not None:
        module.to(device=ref.device, dtype=ref.dtype)
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"cannot take over {type(pyg_module).__name__}'s parameters: missing "
                         f"{missing}, unexpected {unexpected}")
    return module.train(pyg_module.training)


def as_one_graph(x, edge_index, edge_type=None, add_self_loops: bool = False,
                 num_relations=None):
    """Bring bipartite inputs to one graph over one node set, so every layer keeps its
    single-graph math; returns ``(x, edge_index, edge_type, rows, add_self_loops)`` where
    ``rows`` selects the destination rows of the output (``take_rows``; None: all rows) and
    ``add_self_loops`` is what the caller still has to add.

    * ``x`` one tensor and ``edge_index`` a block (``hector.loader``): ``x`` has a row per
      source node, destinations among them; the output is the block's destination rows.
    * ``x = (x_src, x_dst)`` (PyG's bipartite form) with a block whose destinations are the
      first sources and ``x_dst`` the first rows of ``x_src`` (a view): as above.
    * any other ``(x_src, x_dst)``: the union graph over ``x_src`` then ``x_dst`` (edges enter
      the ``x_dst`` copies; with ``add_self_loops``, PyG's bipartite loops source ``i`` ->
      destination ``i`` replace the edges whose two ends have the same id).

    ``num_relations``: the relational layers' count; None for a layer that reads no relations
    (GAT, AGNN, Transformer), whose union graph then has none either (a block sampled from a
    graph with several relations keeps its edge types, which such a layer ignores).
    """
    if not isinstance(x, (tuple, list)):
        return x, edge_index, edge_type, (dst_rows(edge_index) if isinstance(edge_index, Graph)
                                          else None), add_self_loops
    if len(x) != 2:
        raise ValueError(f"x as a tuple must be (x_src, x_dst), got {len(x)} entries")
    x_src, x_dst = x
    C.check_tensor(x_src, "x[0] (x_src)")
    if x_dst is None:
        return as_one_graph(x_src, edge_index, edge_type, add_self_loops, num_relations)
    C.check_tensor(x_dst, "x[1] (x_dst)")
    if x_src.dim() != 2 or x_dst.dim() != 2 or x_src.shape[1] != x_dst.shape[1]:
        raise ValueError(f"x_src and x_dst must be [rows, features] with the same features, got "
                         f"{tuple(x_src.shape)} and {tuple(x_dst.shape)}")
    if isinstance(edge_index, Graph) and edge_index.is_block and _is_prefix_view(x_src, x_dst, edge_index):
        return as_one_graph(x_src, edge_index, edge_type, add_self_loops, num_relations)
    if not isinstance(edge_index, Graph) and edge_type is None and (num_relations or 1) > 1:
        raise ValueError("edge_type is required with an edge_index tensor (one relation id "
                         "per edge); or pass a block built by hector.loader as edge_index")
    n_src, n_dst = int(x_src.shape[0]), int(x_dst.shape[0])
    src, dst_id, dst_pos, etype, loop_src = _bipartite_edges(edge_index, edge_type, n_src, n_dst)
    if add_self_loops:
        keep = src != dst_id
        src, dst_pos, etype = src[keep], dst_pos[keep], etype[keep]
        loops = torch.arange(loop_src.numel(), device=src.device)
        src, dst_pos = torch.cat([src, loop_src]), torch.cat([dst_pos, loops])
        etype = torch.cat([etype, torch.zeros_like(loops)])
    union = Graph(torch.stack([src, dst_pos + n_src]), num_nodes=n_src + n_dst,
                  edge_type=None if num_relations is None else etype,
                  num_relations=num_relations or 1)
    return torch.cat([x_src, x_dst.to(x_src.device)]), union, None, slice(n_src, n_src + n_dst), False


def stacked_rows(xs) -> torch.Tensor:
    """``torch.cat(xs, 0)``, without the copy when the tensors are already consecutive row
    blocks of one dense buffer (per-type features split from one tensor, as ``hector
    bench`` passes HGT's): then a view of those rows, whose backward splits the gradient as
    cat's does (on synthetic mag a 497 MB copy per forward)."""
    xs = list(xs)
    if len(xs) == 1:
        return xs[0]
    if torch.compiler.is_compiling() or not _consecutive(xs):
        return torch.cat(xs, 0)
    return _RowBlocks.apply(*xs)


def _consecutive(xs) -> bool:
    """Same dtype, device and row shape, each dense, and the non-empty ones one after the
    other in one storage (an empty tensor's data pointer means nothing: it is skipped)."""
    first = next((t for t in xs if t.dim() >= 1 and t.shape[0]), None)
    if first is None or not first.is_contiguous():
        return False
    storage, at = first.untyped_storage().data_ptr(), first.data_ptr()
    for t in xs:
        if t.dtype != first.dtype or t.device != first.device or t.shape[1:] != first.shape[1:]:
            return False
        if t.shape[0] == 0:
            continue
        if (not t.is_contiguous() or t.untyped_storage().data_ptr() != storage
                or t.data_ptr() != at):
            return False
        at += t.numel() * t.element_size()
    return True


class _RowBlocks(torch.autograd.Function):
    """The rows of consecutive blocks of one buffer as one view (see :func:`stacked_rows`)."""

    @staticmethod
    def forward(ctx, *xs):
        ctx.rows = [t.shape[0] for t in xs]
        first = next(t for t in xs if t.shape[0])
        return first.as_strided((sum(ctx.rows),) + tuple(first.shape[1:]), first.stride(),
                                first.storage_offset())

    @staticmethod
    def backward(ctx, grad):
        return tuple(grad.split(ctx.rows, 0))


def _is_prefix_view(x_src: torch.Tensor, x_dst: torch.Tensor, block: Graph) -> bool:
    """``x_dst`` is ``x_src[:num_dst]`` (same storage), so no union is needed."""
    return (block.dst_index is None and x_dst.shape[0] == block.num_dst_nodes
            and x_dst.data_ptr() == x_src.data_ptr() and x_dst.stride() == x_src.stride()
            and x_dst.dtype == x_src.dtype)


def _bipartite_edges(edge_index, edge_type, n_src: int, n_dst: int):
    """Per edge of a block or of a PyG bipartite ``[2, E]`` edge_index: (source id,
    destination id -- an edge is a self loop when the two ids are equal --, destination
    position in ``x_dst``, relation); and the source of each PyG bipartite self loop."""
    if isinstance(edge_index, Graph):
        g = edge_index
        if not g.is_block:
            raise ValueError("x is a (x_src, x_dst) tuple but edge_index is a Graph that is no "
                             "block; pass a block (hector.loader) or a [2, E] edge_index")
        if (g.num_nodes, g.num_dst_nodes) != (n_src, n_dst):
            raise ValueError(f"x_src has {n_src} rows and x_dst {n_dst} but the block has "
                             f"{g.num_nodes} source and {g.num_dst_nodes} destination nodes")
        ei, etype = g.input_edge_index(), g.input_edge_type()
        if g.dst_index is None:
            loop_src = torch.arange(n_dst, device=g.device)
            return ei[0], ei[1], ei[1], etype, loop_src
        loop_src = g.dst_index.long()
        position = torch.full((n_src,), -1, dtype=torch.int64, device=g.device)
        position[loop_src] = torch.arange(n_dst, device=g.device)
        return ei[0], ei[1], position[ei[1]], etype, loop_src
    C.check_edge_index(edge_index)
    C.check_range(edge_index[0], "edge_index[0] (source ids)", n_src, "x_src rows")
    C.check_range(edge_index[1], "edge_index[1] (destination ids)", n_dst, "x_dst rows")
    ei = edge_index.long()
    if edge_type is None:
        etype = torch.zeros_like(ei[0])
    else:
        C.check_index(edge_type, "edge_type", 1)
        C.check_same_length(edge_type, "edge_type", ei.shape[1], "edge_index (its second dim)")
        etype = edge_type.long().to(ei.device)
    return ei[0], ei[1], ei[1], etype, torch.arange(min(n_src, n_dst), device=ei.device)
