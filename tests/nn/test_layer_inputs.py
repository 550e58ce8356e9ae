"""Bad sizes and bad inputs to the six layers: a ValueError/TypeError naming the argument,
raised before any kernel runs; and TransformerConv.from_pyg on PyG's
root_weight=False."""
import re

import pytest
import torch

from hector.nn import AGNNConv, GATConv, HGTConv, RGATConv, RGCNConv, TransformerConv

EI = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
ET = torch.tensor([0, 1, 0, 1])
META = (["n"], [("n", "r0", "n"), ("n", "r1", "n")])


def hgt_inputs(x):
    return {"n": x}, {e: EI[:, ET == r] for r, e in enumerate(META[1])}


# name -> (layer built for 4 input features, how it is called on x)
LAYERS = {
    "gat": (lambda: GATConv(4, 3, heads=2, backend="torch"), lambda m, x: m(x, EI)),
    "transformer": (lambda: TransformerConv(4, 3, heads=2, backend="torch"),
                    lambda m, x: m(x, EI)),
    "agnn": (lambda: AGNNConv(backend="torch"), lambda m, x: m(x, EI)),
    "rgcn": (lambda: RGCNConv(4, 3, 2, backend="torch"), lambda m, x: m(x, EI, ET)),
    "rgat": (lambda: RGATConv(4, 3, 2, backend="torch"), lambda m, x: m(x, EI, ET)),
    "hgt": (lambda: HGTConv(4, 4, META, heads=2, backend="torch"),
            lambda m, x: m(*hgt_inputs(x))),
}
X_NAME = {"hgt": "x_dict['n']"}


@pytest.mark.parametrize("make, arg, value", [
    (lambda v: GATConv(4, 3, heads=v), "heads", 0),
    (lambda v: GATConv(4, v), "out_channels", 0),
    (lambda v: GATConv(4, v), "out_channels", -3),
    (lambda v: GATConv(v, 3), "in_channels", 0),
    (lambda v: TransformerConv(4, 3, heads=v), "heads", 0),
    (lambda v: TransformerConv(4, v), "out_channels", 0),
    (lambda v: TransformerConv(4, v), "out_channels", -2),
    (lambda v: RGCNConv(4, 3, 2, num_bases=v), "num_bases", 0),
    (lambda v: RGCNConv(4, 3, 2, num_bases=v), "num_bases", -2),
    (lambda v: RGCNConv(4, 4, 2, num_blocks=v), "num_blocks", 0),
    (lambda v: RGATConv(4, 4, 2, num_blocks=v), "num_blocks", 0),
    (lambda v: RGATConv(4, 4, 2, num_bases=v), "num_bases", -1),
    (lambda v: HGTConv(4, v, META), "out_channels", 0),
])
def test_bad_sizes_raise_value_error_naming_them(make, arg, value):
    with pytest.raises(ValueError, match=rf"{arg} must be >= 1, got {value}"):
        make(value)


def test_hgt_out_channels_must_divide_by_heads():
    with pytest.raises(ValueError, match=r"out_channels.*divisible.*heads"):
        HGTConv(4, 6, META, heads=4)


@pytest.mark.parametrize("make", [
    lambda: GATConv(-1, 3), lambda: TransformerConv(-1, 3), lambda: RGCNConv(-1, 3, 2),
    lambda: RGATConv(-1, 3, 2), lambda: HGTConv(-1, 4, META)],
    ids=["gat", "transformer", "rgcn", "rgat", "hgt"])
def test_lazy_in_channels_is_refused_clearly(make):
    with pytest.raises(ValueError, match=r"in_channels=-1 \(PyG's lazy size.*pass the input"):
        make()


@pytest.mark.parametrize("make", [lambda: GATConv(4, 3.0), lambda: RGCNConv(4, 3, 2.5),
                                  lambda: HGTConv(4, 4, META, heads="2")])
def test_non_int_sizes_raise_type_error(make):
    with pytest.raises(TypeError, match=r"must be an int >= 1"):
        make()


@pytest.mark.parametrize("layer", LAYERS)
def test_float64_x_into_float32_layer_is_a_type_error(layer):
    make, call = LAYERS[layer]
    x = torch.randn(4, 4, dtype=torch.float64)
    name = re.escape(X_NAME.get(layer, "x"))
    with pytest.raises(TypeError, match=rf"{name} has dtype torch.float64 but the layer's "
                                        r"parameters are torch.float32"):
        call(make(), x)
    # the same layer in float64 takes it
    assert call(make().double(), x) is not None


@pytest.mark.parametrize("layer", [k for k in LAYERS if k != "agnn"])
def test_x_of_the_wrong_width(layer):
    make, call = LAYERS[layer]
    with pytest.raises(ValueError, match=r"5 features per node but the layer was built for "
                                         r"in_channels=4"):
        call(make(), torch.randn(4, 5))


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("shape", [(4,), (4, 4, 1)])
def test_x_of_the_wrong_rank(layer, shape):
    make, call = LAYERS[layer]
    with pytest.raises(ValueError, match=r"must have shape \[num_nodes, "):
        call(make(), torch.randn(*shape))


def test_agnn_with_featureless_x():
    with pytest.raises(ValueError, match=r"x has no features \(shape \(4, 0\)\)"):
        AGNNConv(backend="torch")(torch.randn(4, 0), EI)


@pytest.mark.parametrize("layer", LAYERS)
def test_meta_device_edge_index(layer):
    make, call = LAYERS[layer]
    m = make()
    if layer == "hgt":
        x_dict, ei = hgt_inputs(torch.randn(4, 4))
        ei = {k: v.to("meta") for k, v in ei.items()}
        with pytest.raises(ValueError, match=r"is on the meta device"):
            m(x_dict, ei)
        return
    args = (EI.to("meta"),) + ((ET,) if layer in ("rgcn", "rgat") else ())
    with pytest.raises(ValueError, match=r"edge_index is on the meta device"):
        m(torch.randn(4, 4), *args)


@pytest.mark.parametrize("layer", LAYERS)
def test_meta_device_x(layer):
    make, call = LAYERS[layer]
    with pytest.raises(ValueError, match=r"is on the meta device"):
        call(make(), torch.randn(4, 4, device="meta"))


def test_hgt_list_in_x_dict():
    m = HGTConv(4, 4, META, backend="torch")
    _, ei = hgt_inputs(None)
    with pytest.raises(TypeError, match=r"x_dict\['n'\] must be a torch.Tensor, got list"):
        m({"n": torch.randn(4, 4).tolist()}, ei)


@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("beta", [False, True])
def test_transformer_from_pyg_without_root_weight(concat, beta):
    """PyG builds lin_skip (and lin_beta) even with root_weight=False, and never uses them."""
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    ref = pyg.TransformerConv(4, 3, heads=2, concat=concat, beta=beta, root_weight=False)
    ours = TransformerConv.from_pyg(ref, backend="torch")
    assert ours.lin_skip is None and ours.lin_beta is None
    x = torch.randn(4, 4)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out = ref(xa, EI), ours(xb, EI)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    cot = torch.randn_like(out)
    (out_ref * cot).sum().backward()
    (out * cot).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-5, atol=1e-6)
    theirs = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name].grad, rtol=1e-5, atol=1e-6)


def test_from_pyg_keeps_a_float64_layers_values_exactly():
    """A float64 PyG layer's values arrive unrounded (moved to its dtype, then copied), and a
    PyG layer whose only floating state is a buffer (AGNN with a fixed beta) sets our dtype."""
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    ref = pyg.GATConv(4, 3, heads=2).double()
    with torch.no_grad():
        ref.bias.fill_(0.1)              # (not representable in float32)
    ours = GATConv.from_pyg(ref, backend="torch")
    theirs = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert p.dtype == torch.float64 and torch.equal(p, theirs[name]), name
    fixed = AGNNConv.from_pyg(pyg.AGNNConv(requires_grad=False).double(), backend="torch")
    assert fixed.beta.dtype == torch.float64
