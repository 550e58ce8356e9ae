"""Every layer on the bipartite blocks of ``hector.loader`` against its PyG namesake called on
the same block (PyG's bipartite form: ``(x_src, x_dst)``, ``size=(n_src, n_dst)``; layers
without a bipartite form run on the block's source nodes and keep the destination rows):
outputs and the gradients of the features and of every parameter.

Our layers take a block four ways, each checked: one x (destinations first) + the block;
``(x_src, x_src[:n_dst])`` + the block; ``(x_src, x_dst)`` with ``x_dst`` a separate tensor
(the union graph); and ``(x_src, x_dst)`` with PyG's ``[2, E]`` bipartite edge_index.
Tiny graphs: the Triton backend runs under the interpreter on the CPU, on the GPU where
there is one (``helpers.device_for``).
"""
import sys
from pathlib import Path

import pytest
import torch

pyg = pytest.importorskip("torch_geometric.nn")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compiler"))
from helpers import (device_for, grads_by_pyg_name, random_hetero,  # noqa: E402
                     random_relational, rel_err)

from hector import Graph                                          # noqa: E402
from hector.loader import NeighborLoader                          # noqa: E402
from hector.nn import (AGNNConv, GATConv, HGTConv, RGATConv,      # noqa: E402
                       RGCNConv, TransformerConv)

TOL = 1e-4
BACKENDS = ["torch", "triton"]
WAYS = ["one_x", "prefix_view", "union", "edge_index"]


def _perturb(module):
    """Non-trivial biases, skips and priors (PyG starts them at 0 or 1)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1 or "bias" in name or "skip" in name or "p_rel" in name or "beta" in name:
                p.normal_(0, 0.5)
    return module


def _block(num_relations=1, layer=0, seed=0):
    """A block of a sampled batch over a 40-node random graph (fan-outs 4, 3)."""
    ei, et = random_relational(num_nodes=40, num_edges=160, num_relations=num_relations,
                               seed=seed, empty=())
    graph = Graph(ei, edge_type=et, num_nodes=40, num_relations=num_relations)
    batch = next(iter(NeighborLoader(graph, [4, 3], batch_size=5, shuffle=True, seed=seed)))
    return batch.blocks[layer]


def _compare(ref, ours, run_ref, run_ours, x):
    """``run_*(module, x_leaf) -> out``; outputs, x gradients, parameter gradients (on the
    device of ``ours``' parameters)."""
    device = next(ours.parameters()).device
    x = x.to(device)
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out = run_ref(ref, x_ref), run_ours(ours, x_ours)
    assert out.shape == out_ref.shape
    assert rel_err(out.detach(), out_ref.detach()) < TOL
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(device)
    names = [n for n, p in ref.named_parameters() if p.requires_grad]
    g_ref = torch.autograd.grad((out_ref * w).sum(), [x_ref] + [dict(ref.named_parameters())[n]
                                                                for n in names], allow_unused=True)
    g = grads_by_pyg_name(ours, (out * w).sum(), [x_ours], names)
    # Some gradients are zero in exact arithmetic (a key bias shifts every score of a row
    # equally, which softmax ignores) and hold only rounding noise: errors are measured
    # against at least a hundredth of the largest gradient.
    floor = 1e-2 * max(float(b.abs().max()) for b in g_ref if b is not None and b.numel())
    for name, a, b in zip(["x"] + names, g, g_ref):
        if b is None:
            continue        # a PyG parameter its forward never reads (RGAT's mod weights)
        assert a is not None, name
        err = float((a - b).abs().max()) / max(float(b.abs().max()), floor)
        assert err < TOL, (name, err)


def _ours_on_block(way, block, *extra):
    """How our layer is called for ``way`` (see the module docstring)."""
    n_dst = block.num_dst_nodes
    ei = block.input_edge_index()

    def run(m, x):
        if way == "one_x":
            return m(x, block, *extra)
        if way == "prefix_view":
            return m((x, x[:n_dst]), block, *extra)
        if way == "union":
            return m((x, x[:n_dst].clone()), block, *extra)
        return m((x, x[:n_dst].clone()), ei, *(block.input_edge_type() for _ in extra))
    return run


def _attention(kind, f_in):
    torch.manual_seed(0)
    if kind == "gat":
        return pyg.GATConv(f_in, 6, heads=2, residual=True), GATConv
    if kind == "agnn":
        return pyg.AGNNConv(), AGNNConv
    return pyg.TransformerConv(f_in, 6, heads=2, beta=True), TransformerConv


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("kind", ["gat", "agnn", "transformer"])
def test_attention_layers_on_blocks(kind, way, backend):
    block = _block(layer=0).to(device_for(backend))
    n_src, n_dst = block.num_nodes, block.num_dst_nodes
    assert n_dst < n_src and block.num_edges > n_dst      # a real bipartite block
    x = torch.randn(n_src, 5, generator=torch.Generator().manual_seed(2))
    ref, cls = _attention(kind, 5)
    _perturb(ref.to(block.device))
    ours = cls.from_pyg(ref, backend=backend)
    ei = block.input_edge_index()

    def run_ref(m, x):
        if kind == "agnn":       # PyG's AGNNConv has no bipartite form
            return m(x, ei)[:n_dst]
        return m((x, x[:n_dst]), ei)       # size = (n_src, n_dst) from the tuple
    _compare(ref, ours, run_ref, _ours_on_block(way, block), x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("kind", ["rgcn", "rgat"])
def test_relational_layers_on_blocks(kind, way, backend):
    block = _block(num_relations=3, layer=1).to(device_for(backend))
    n_src, n_dst = block.num_nodes, block.num_dst_nodes
    x = torch.randn(n_src, 6, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    if kind == "rgcn":
        ref, cls = pyg.RGCNConv(6, 4, 3), RGCNConv
    else:
        ref, cls = pyg.RGATConv(6, 4, 3, heads=2), RGATConv
    _perturb(ref.to(block.device))
    ours = cls.from_pyg(ref, backend=backend)
    ei, et = block.input_edge_index(), block.input_edge_type()

    def run_ref(m, x):
        if kind == "rgat":       # PyG's RGATConv reads one x for both ends
            return m(x, ei, et)[:n_dst]
        return m((x, x[:n_dst]), ei, et)
    _compare(ref, ours, run_ref, _ours_on_block(way, block, et), x)


def _hetero_block(seed=0):
    counts, eid, metadata = random_hetero(seed)
    graph = Graph.from_hetero(eid, counts)
    loader = NeighborLoader(graph, [2, -1], input_nodes=("paper", torch.arange(6)),
                            batch_size=4, shuffle=True, seed=seed)
    return graph, next(iter(loader)).blocks[0], metadata


def _per_type(block, metadata):
    """The block's edges per relation with per-type local ids (PyG's hetero layout)."""
    ptr = block.node_type_ptr.tolist()
    ei, et = block.input_edge_index(), block.input_edge_type()
    types = metadata[0]
    out = {}
    for r, (s, rel, d) in enumerate(metadata[1]):
        e = ei[:, et == r]
        out[(s, rel, d)] = torch.stack([e[0] - ptr[types.index(s)], e[1] - ptr[types.index(d)]])
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_hgt_on_hetero_blocks(backend):
    graph, block, metadata = _hetero_block()
    block = block.to(device_for(backend))
    types = metadata[0]
    ptr = block.node_type_ptr.tolist()
    assert block.dst_index is not None and len({t for t in block.node_type.tolist()}) > 1
    torch.manual_seed(0)
    ref = _perturb(pyg.HGTConv(8, 8, metadata, heads=2).to(block.device))
    ours = HGTConv.from_pyg(ref, backend=backend)
    x = torch.randn(block.num_nodes, 8, generator=torch.Generator().manual_seed(2))
    eid = _per_type(block, metadata)
    n_dst = {t: block.dst_type_ptr[i + 1] - block.dst_type_ptr[i] for i, t in enumerate(types)}

    def split(x):
        return {t: x[ptr[i]:ptr[i + 1]] for i, t in enumerate(types)}

    def run_ref(m, x):
        out = m(split(x), eid)
        return torch.cat([out[t][:n_dst[t]] for t in types if t in out])

    def run_ours(m, x):
        out = m(split(x), block)
        return torch.cat([out[t] for t in types if t in out])
    _compare(ref, ours, run_ref, run_ours, x)


@pytest.mark.parametrize("way", ["one_x", "union", "edge_index"])
def test_rgcn_on_hetero_block_returns_destination_rows(way):
    """With several node types the destinations are no prefix of the sources: the layer
    must take the rows of ``dst_index``."""
    _, block, metadata = _hetero_block(seed=1)
    n_dst = block.num_dst_nodes
    torch.manual_seed(0)
    ref = _perturb(pyg.RGCNConv(5, 4, len(metadata[1])))
    ours = RGCNConv.from_pyg(ref, backend="torch")
    x = torch.randn(block.num_nodes, 5, generator=torch.Generator().manual_seed(2))
    ei, et = block.input_edge_index(), block.input_edge_type()
    dst = block.dst_index.long()
    assert not torch.equal(dst, torch.arange(n_dst))

    def run_ref(m, x):
        return m(x, ei, et)[dst]

    def run_ours(m, x):
        if way == "one_x":
            return m(x, block)
        if way == "union":
            return m((x, x[dst]), block)
        position = torch.full((block.num_nodes,), -1, dtype=torch.long)
        position[dst] = torch.arange(n_dst)
        return m((x, x[dst]), torch.stack([ei[0], position[ei[1]]]), et)
    _compare(ref, ours, run_ref, run_ours, x)


def test_bad_bipartite_inputs_name_the_argument():
    block = _block()
    n_src, n_dst = block.num_nodes, block.num_dst_nodes
    layer = GATConv(5, 4, backend="torch")
    x = torch.randn(n_src, 5)
    with pytest.raises(ValueError, match="x_src has"):
        layer((x, torch.randn(n_dst + 1, 5)), block)
    with pytest.raises(ValueError, match="same features"):
        layer((x, torch.randn(n_dst, 4)), block)
    with pytest.raises(ValueError, match="x_dst rows"):
        layer((x, torch.randn(1, 5)), torch.tensor([[0], [3]]))
    with pytest.raises(ValueError, match="edge_type is required"):
        RGCNConv(5, 4, 3, backend="torch")((x, x[:2].clone()), torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match="no block"):
        layer((x, x[:2].clone()), Graph(torch.tensor([[0], [1]]), num_nodes=n_src))
