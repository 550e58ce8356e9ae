"""hector.nn relational layers against their PyG namesakes, weights copied with from_pyg:
outputs and the gradients of x and of every parameter, fp32 relative error < 1e-4."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.nn.hgt import HGTConv
from hector.nn.rgat import RGATConv
from hector.nn.rgcn import RGCNConv

pyg = pytest.importorskip("torch_geometric.nn")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import (device_for, grads_by_pyg_name, random_hetero,  # noqa: E402
                     random_relational, rel_err)

from helpers import SHARED_DATA as DATA  # noqa: E402
TOL = 1e-4


def _perturb(module):
    """PyG initialises biases to 0 and skips/priors to 1: randomise so they are tested."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "bias" in name or "skip" in name or "p_rel" in name:
                p.normal_()


def _compare(ref, ours, run, tol=TOL):
    """``run(module) -> (loss, inputs)``; compares loss value and every gradient."""
    names = [n for n, p in ref.named_parameters() if p.requires_grad]
    a, xs_a = run(ref)
    b, xs_b = run(ours)
    ga = torch.autograd.grad(a, xs_a + [dict(ref.named_parameters())[n] for n in names],
                             allow_unused=True)
    gb = grads_by_pyg_name(ours, b, xs_b, names)
    assert rel_err(b.detach(), a.detach()) < tol
    for n, u, v in zip(["x"] * len(xs_a) + names, gb, ga):
        if v is None:
            continue   # PyG's parameters of unused variants (RGAT's mod weights)
        assert u is not None, n
        assert rel_err(u, v) < tol, (n, rel_err(u, v))


def _relational_run(ei, et, x, outw=None):
    def run(m):
        xx = x.detach().clone().requires_grad_()
        out = m(xx, ei, et)
        w = outw if outw is not None else torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
        w = w.to(out.device)
        return (out * w).sum(), [xx]
    return run


def _compare_on_random_graph(pyg_cls, ours_cls, opts, backend, dtype=torch.float32, tol=TOL):
    """A relational layer (16 -> 8, 4 relations) against its PyG namesake on a random graph,
    on the device ``backend`` runs on."""
    torch.manual_seed(0)
    ei, et = random_relational()
    dev = device_for(backend)
    ref = pyg_cls(16, 8, 4, **opts)
    _perturb(ref)
    ref = ref.to(dev, dtype)
    ours = ours_cls.from_pyg(ref, backend=backend)
    x = torch.randn(24, 16).to(dev, dtype)
    _compare(ref, ours, _relational_run(ei.to(dev), et.to(dev), x), tol)


RGCN_OPTS = [dict(), dict(num_bases=2), dict(num_blocks=2), dict(aggr="add"),
             dict(root_weight=False, bias=False)]


@pytest.mark.parametrize("opts", RGCN_OPTS, ids=str)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_rgcn_random_graph(opts, backend):
    _compare_on_random_graph(pyg.RGCNConv, RGCNConv, opts, backend)


RGAT_OPTS = [dict(), dict(heads=2), dict(heads=2, concat=False), dict(heads=2, num_bases=2),
             dict(heads=2, num_blocks=2), dict(negative_slope=0.1, bias=False)]


@pytest.mark.parametrize("opts", RGAT_OPTS, ids=str)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_rgat_random_graph(opts, backend):
    _compare_on_random_graph(pyg.RGATConv, RGATConv, opts, backend)


@pytest.mark.parametrize("in_dim,heads", [(16, 2), (8, 2), (8, 1)])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_hgt_random_hetero(in_dim, heads, backend):
    _compare_hgt(in_dim, heads, backend)


def _compare_hgt(in_dim, heads, backend, dtype=torch.float32, tol=TOL):
    torch.manual_seed(0)
    counts, eid, meta = random_hetero()
    dev = device_for(backend)
    ref = pyg.HGTConv(in_dim, 8, meta, heads=heads)
    _perturb(ref)
    ref = ref.to(dev, dtype)
    ours = HGTConv.from_pyg(ref, backend=backend)
    xs = {t: torch.randn(n, in_dim).to(dev, dtype) for t, n in counts.items()}
    eid = {k: v.to(dev) for k, v in eid.items()}

    def run(m):
        xd = {t: x.clone().requires_grad_() for t, x in xs.items()}
        out = m(xd, eid)
        assert sorted(out) == ["author", "paper", "venue"]
        loss = sum((out[t] * torch.randn(out[t].shape, generator=torch.Generator().manual_seed(i))
                    .to(dev)).sum()
                   for i, t in enumerate(sorted(out)))
        return loss, list(xd.values())
    _compare(ref, ours, run, tol)


#: float64 asked, float64 computed: agreement to rounding, far below any fp32 step (which
#: would show as ~1e-7).  The Triton backend takes no float64 (it says so): torch only.
F64_TOL = 1e-10


@pytest.mark.parametrize("layer, opts", [
    ("rgcn", dict()), ("rgcn", dict(num_bases=2)), ("rgat", dict(heads=2)),
    ("rgat", dict(heads=2, num_bases=2)), ("rgat", dict(heads=2, num_blocks=2))], ids=str)
def test_relational_layers_in_float64_match_pyg_to_rounding(layer, opts):
    pyg_cls, ours_cls = {"rgcn": (pyg.RGCNConv, RGCNConv), "rgat": (pyg.RGATConv, RGATConv)}[layer]
    _compare_on_random_graph(pyg_cls, ours_cls, opts, "torch", torch.float64, F64_TOL)


def test_hgt_in_float64_matches_pyg_to_rounding():
    _compare_hgt(16, 2, "torch", torch.float64, F64_TOL)


def test_prebuilt_graph_is_accepted():
    ei, et = random_relational()
    ref = pyg.RGCNConv(16, 8, 4)
    ours = RGCNConv.from_pyg(ref, backend="torch")
    g = hector.Graph(ei, edge_type=et, num_nodes=24, num_relations=4)
    x = torch.randn(24, 16)
    assert rel_err(ours(x, g).detach(), ref(x, ei, et).detach()) < TOL


def _dataset(name, folder):
    root = DATA / folder
    if not root.exists():
        pytest.skip(f"dataset folder {root} is absent")
    from hector import datasets
    return datasets.load(name, root=str(root))


@pytest.mark.parametrize("name,folder", [("aifb", "aifb"), ("fb15k-237", "fb15k-237")])
def test_rgcn_and_rgat_on_real_graphs(name, folder):
    ds = _dataset(name, folder)
    ei, et, n, r = ds.edge_index, ds.edge_type, ds.num_nodes, ds.num_relations
    torch.manual_seed(0)
    x = torch.randn(n, 8)
    ref = pyg.RGCNConv(8, 4, r)
    _perturb(ref)
    _compare(ref, RGCNConv.from_pyg(ref, backend="torch"), _relational_run(ei, et, x))
    if name == "aifb":   # PyG's RGAT materialises E x in x out weights: keep it to AIFB
        ref = pyg.RGATConv(8, 4, r, heads=2)
        _perturb(ref)
        _compare(ref, RGATConv.from_pyg(ref, backend="torch"), _relational_run(ei, et, x))


@pytest.mark.parametrize("make", [
    lambda: RGATConv(8, 4, 3, attention_mechanism="within-relation"),
    lambda: RGATConv(8, 4, 3, attention_mode="multiplicative-self-attention"),
    lambda: RGATConv(8, 4, 3, mod="additive"),
    lambda: RGATConv(8, 4, 3, dropout=0.1),
    lambda: RGATConv(8, 4, 3, edge_dim=2),
    lambda: RGCNConv(8, 4, 3, aggr="max"),
    lambda: HGTConv({"a": 8, "b": 4}, 8, (["a", "b"], [("a", "r", "b")])),
])
def test_unsupported_options_raise(make):
    with pytest.raises(NotImplementedError):
        make()


def test_bad_inputs_name_the_argument():
    ei, et = random_relational()
    layer = RGCNConv(16, 8, 4, backend="torch")
    with pytest.raises(ValueError, match="x"):
        layer(torch.randn(24, 15), ei, et)
    with pytest.raises(ValueError, match="edge_type"):
        layer(torch.randn(24, 16), ei, None)
    with pytest.raises(ValueError, match="num_relations"):
        layer(torch.randn(24, 16), ei, et + 1)
    with pytest.raises(TypeError, match="x"):
        layer(torch.randn(24, 16).long(), ei, et)
    with pytest.raises(ValueError, match="backend"):
        RGCNConv(16, 8, 4, backend="cuda")


def test_half_precision_runs_in_fp32_accumulation():
    ei, et = random_relational()
    ref = pyg.RGCNConv(16, 8, 4)
    ours = RGCNConv.from_pyg(ref, backend="torch")
    x = torch.randn(24, 16)
    want = ref(x, ei, et).detach()
    got = ours.to(torch.bfloat16)(x.to(torch.bfloat16), ei, et)
    assert got.dtype == torch.bfloat16 and rel_err(got.float().detach(), want) < 2e-2


def test_hgt_prebuilt_graph_checked_against_metadata():
    """A prebuilt Graph gives the dict path's result when it matches the metadata, and is
    refused (not silently misread) when its relations or node-id layout do not."""
    torch.manual_seed(0)
    counts, eid, meta = random_hetero()
    layer = HGTConv(8, 8, meta, heads=2, backend="torch")
    xs = {t: torch.randn(n, 8) for t, n in counts.items()}
    g = hector.Graph.from_hetero({e: eid[e] for e in meta[1]}, counts)
    want, got = layer(xs, eid), layer(xs, g)
    assert all(torch.allclose(got[t], want[t], atol=1e-6) for t in want)
    reordered = hector.Graph.from_hetero({e: eid[e] for e in reversed(meta[1])}, counts)
    with pytest.raises(ValueError, match="relations .* in metadata order"):
        layer(xs, reordered)
    flat = g.input_edge_index()
    perm = torch.randperm(g.num_nodes)          # same graph, node ids no longer grouped by type
    interleaved = hector.Graph(perm[flat], edge_type=g.input_edge_type(), num_nodes=g.num_nodes,
                               num_relations=g.num_relations,
                               node_type=g.node_type.long()[torch.argsort(perm)],
                               num_node_types=3, node_type_names=g.node_type_names,
                               relation_names=g.relation_names)
    with pytest.raises(ValueError, match="not contiguous id ranges"):
        layer(xs, interleaved)


def test_hgt_packs_pyg_parameters_and_speaks_pyg_state_dicts():
    """One parameter per family (types stacked), whatever the number of types and
    relations; state_dict() has PyG's keys and shapes, and loads strictly both ways."""
    _, _, meta = random_hetero()
    ref = pyg.HGTConv(8, 8, meta, heads=2)
    _perturb(ref)
    ours = HGTConv(8, 8, meta, heads=2)
    assert len(list(ours.parameters())) == 8 < len(list(ref.parameters()))
    ours.load_state_dict(ref.state_dict())                   # strict
    mine, theirs = ours.state_dict(), ref.state_dict()
    assert list(mine) != [] and sorted(mine) == sorted(theirs)
    for k, v in theirs.items():
        assert mine[k].shape == v.shape and torch.equal(mine[k], v), k
    again = pyg.HGTConv(8, 8, meta, heads=2)
    again.load_state_dict(mine)                              # strict, the other way
    for k, v in again.state_dict().items():
        assert torch.equal(v, theirs[k]), k
    with pytest.raises(RuntimeError, match="Missing key"):
        ours.load_state_dict({k: v for k, v in theirs.items() if not k.startswith("skip.")})
