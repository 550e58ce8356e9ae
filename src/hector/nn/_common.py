"""What every layer does with its inputs before the math: find or build the Graph, check the
features against it, and take over a PyG layer's parameters."""
from __future__ import annotations

import torch

from .. import checks as C
from ..device import BACKENDS
from ..graph import Graph, graph_of, with_self_loops
from ..kernels.attention.op import STRATEGIES


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return strategy


def param_dtype(module: torch.nn.Module):
    """The dtype of a layer's first floating parameter or buffer (None if it has none)."""
    for t in list(module.parameters()) + list(module.buffers()):
        if t.is_floating_point():
            return t.dtype
    return None


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
    device and dtype.  ``unused``: name prefixes of PyG parameters that this configuration of
    the PyG layer owns but never uses in its forward (left out)."""
    state = {k: v for k, v in pyg_module.state_dict().items()
             if not any(k.startswith(p) for p in unused)}
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"cannot take over {type(pyg_module).__name__}'s parameters: missing "
                         f"{missing}, unexpected {unexpected}")
    ref = next(iter(pyg_module.parameters()), None)
    if ref is not None:
        module.to(device=ref.device, dtype=ref.dtype)
    return module.train(pyg_module.training)
