"""Steady-state calls of the relational layers read nothing from tensors on the host but the
CPU segment pointers the runtime cached per graph (on CUDA every other read would be a device
sync).  Reads are detected by patching the tensor -> Python conversions and keeping those
called from hector's own code (Triton's interpreter reads tensors too; that is not ours)."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.graph import cache as graph_cache
from hector.nn.hgt import HGTConv
from hector.nn.rgat import RGATConv
from hector.nn.rgcn import RGCNConv
from hector.compiler.steps_torch import GraphIndex

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, host_reads, random_hetero, random_relational  # noqa: E402

def _cached_host_tensors(graph):
    ix = GraphIndex.of(graph)
    out = set()
    for key, value in ix.memo.items():
        for t in (value if isinstance(value, tuple) else (value,)):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                out.add(id(t))
    return out


def _check_steady_state(call, graph_of):
    """Two warm-up calls (plans, caches), then one watched call per mode."""
    for train in (False, True, False, True):
        call(train)
    for train in (False, True):
        with host_reads() as seen:
            call(train)
        allowed = set()
        for g in graph_of():
            allowed |= _cached_host_tensors(g)
        bad = [(n, c) for n, t, c in seen if id(t) not in allowed]
        assert not bad, f"host reads in a steady-state {'training' if train else 'inference'} call: {bad}"


def _relational_call(layer, ei, et, x):
    def call(train):
        if train:
            xx = x.clone().requires_grad_()
            layer(xx, ei, et).square().sum().backward()
        else:
            with torch.no_grad():
                layer(x, ei, et)
    return call


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("layer_cls", [RGCNConv, RGATConv])
def test_relational_layers_steady_state_reads_no_device_values(layer_cls, backend):
    torch.manual_seed(0)
    ei, et = random_relational()
    dev = device_for(backend)
    ei, et = ei.to(dev), et.to(dev)
    kwargs = dict(heads=2) if layer_cls is RGATConv else {}
    layer = layer_cls(16, 8, 4, backend=backend, **kwargs).to(dev)
    call = _relational_call(layer, ei, et, torch.randn(24, 16, device=dev))
    _check_steady_state(call, lambda: [hector.graph.graph_of(ei, et, num_nodes=24, num_relations=4)])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_hgt_steady_state_reads_no_device_values(backend):
    torch.manual_seed(0)
    counts, eid, meta = random_hetero()
    del eid[meta[1][-1]]            # an edge type without an entry: still one cached Graph
    dev = device_for(backend)
    eid = {k: v.to(dev) for k, v in eid.items()}
    layer = HGTConv(8, 8, meta, heads=2, backend=backend).to(dev)
    xs = {t: torch.randn(n, 8, device=dev) for t, n in counts.items()}

    def call(train):
        if train:
            xd = {t: x.clone().requires_grad_() for t, x in xs.items()}
            sum(o.square().sum() for o in layer(xd, eid).values()).backward()
        else:
            with torch.no_grad():
                layer(xs, eid)
    graph_cache._cache.clear()
    _check_steady_state(call, lambda: [g for *_, g in graph_cache._cache.values()])
    assert len(graph_cache._cache) == 1        # every call hit the same Graph


def test_hgt_single_node_type_needs_no_concatenation(monkeypatch):
    meta = (["n"], [("n", "r", "n"), ("n", "s", "n")])
    ei = torch.randint(0, 10, (2, 30), generator=torch.Generator().manual_seed(1))
    eid = {meta[1][0]: ei[:, :20], meta[1][1]: ei[:, 20:]}
    layer = HGTConv(8, 8, meta, heads=2, backend="torch")
    x = torch.randn(10, 8)
    want = layer({"n": x}, eid)["n"]
    seen = []
    real = layer.program.__call__
    monkeypatch.setattr(layer, "program", lambda g, inputs, w: seen.append(inputs["x"]) or real(g, inputs, w))
    got = layer({"n": x}, eid)["n"]
    assert torch.equal(got, want)
    assert seen[0] is x             # the features themselves, not a copy


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("make", [
    lambda b: hector.nn.GATConv(16, 8, heads=2, backend=b),
    lambda b: hector.nn.AGNNConv(backend=b),
    lambda b: hector.nn.TransformerConv(16, 8, heads=2, backend=b),
], ids=["gat", "agnn", "transformer"])
def test_attention_layers_steady_state_reads_no_device_values(make, backend):
    torch.manual_seed(0)
    ei, _ = random_relational()
    dev = device_for(backend)
    ei = ei.to(dev)
    layer = make(backend).to(dev)
    x = torch.randn(24, 16, device=dev)

    def call(train):
        if train:
            xx = x.clone().requires_grad_()
            layer(xx, ei).square().sum().backward()
        else:
            with torch.no_grad():
                layer(x, ei)
    _check_steady_state(call, lambda: [])



def _row_bins_reads(seen):
    """The reads of traversal row bins among ``seen``: a CSR's own on its first launch
    (``schedule.row_bins``), or a plan's for all its CSRs (``csr.resolve_layouts``)."""
    import inspect

    from hector.kernels.traversal import csr
    resolve = range(0)
    if hasattr(csr, "resolve_layouts"):
        lines, first = inspect.getsourcelines(csr.resolve_layouts)
        resolve = range(first, first + len(lines))
    return [c for _, _, c in seen if "/kernels/traversal/schedule.py" in c or (
        "/kernels/traversal/csr.py" in c and int(c.rsplit(":", 1)[1]) in resolve)]


@pytest.mark.parametrize("layer_cls", [RGCNConv, RGATConv])
def test_a_new_blocks_traversal_row_bins_are_one_read_and_the_backward_reads_none(layer_cls):
    """A new block's traversal CSRs, the forward plan's and the backward plan's, get their
    row bins in ONE read, in the forward, before the first launch (each CSR read its own on
    its first launch before: RGCN's forward on a mini-batch block two a layer, a device sync
    each on CUDA; then the backward plan read its own).  The backward reads nothing: with
    several GPUs a read there waits for the gradient all-reduces DDP has started, so for the
    slowest rank, in the middle of every step (measured: HGT's two-GPU step 40 -> 56 ms)."""
    from hector.graph.graph import recipe_name
    from hector.loader import NeighborLoader
    torch.manual_seed(0)
    ei, et = random_relational(num_nodes=60, num_edges=400)
    dev = device_for("triton")
    g = hector.Graph(ei.to(dev), edge_type=et.to(dev), num_nodes=60, num_relations=4)
    block = next(iter(NeighborLoader(g, [5], batch_size=16, seed=0))).blocks[0]
    kwargs = dict(heads=2) if layer_cls is RGATConv else {}
    layer = layer_cls(16, 8, 4, backend="triton", **kwargs).to(dev)
    x = torch.randn(block.num_nodes, 16, device=dev, requires_grad=True)
    with host_reads() as seen:
        out = layer(x, block)
    fwd = _row_bins_reads(seen)
    with host_reads() as bwd:
        out.square().sum().backward()
    assert len(fwd) == 1 and bwd == [], (fwd, bwd)
    bins = [m.bins for k, m in block._derived.items() if recipe_name(k) == "traversal_csr"]
    assert len(bins) >= 2 and all(b is not None for b in bins)
