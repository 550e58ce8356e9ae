"""IR nodes, DSL capture, printer and verifier."""
import pytest

from hector.compiler import dsl, models
from hector.compiler.verify import IRError, verify
from hector.compiler.printer import format_ir
from hector.compiler import ir as N


def test_structural_equality_and_hash():
    x = N.input_("x", 8)
    w = N.param("w", (8, 4), per="relation")
    a = N.linear(N.gather(x, N.EDGE, "src"), w)
    b = N.linear(N.gather(N.input_("x", 8), N.EDGE, "src"), N.param("w", (8, 4), per="relation"))
    assert a == b and hash(a) == hash(b)
    assert a.kind == N.EDGE and a.shape == (1, 4)
    assert len({a, b}) == 1


def test_shape_inference_heads_and_per_head_weights():
    x = N.input_("x", 16)
    z = N.linear(N.gather(x, N.EDGE, "src"), N.param("w", (16, 8), per="relation"), heads=2)
    assert z.shape == (2, 4)
    k = N.linear(z, N.param("k", (2, 4, 3), per="relation"))
    assert k.shape == (2, 3)
    assert N.dot(k, k).shape == (2, 1)
    assert N.reshape(z, 1).shape == (1, 8) and N.head_mean(z).shape == (1, 4)


@pytest.mark.parametrize("bad", [
    lambda x: N.linear(x, N.param("w", (3, 4))),                          # K mismatch
    lambda x: N.linear(x, N.param("w", (8, 4), per="relation")),          # relation on nodes
    lambda x: N.gather(x, N.CDST, "src"),                                 # wrong endpoint
    lambda x: N.binary("add", x, N.gather(x, N.EDGE, "src")),             # kinds differ
    lambda x: N.edge_softmax(x),                                          # not edge-wise
])
def test_constructors_reject_ill_formed(bad):
    with pytest.raises(ValueError):
        bad(N.input_("x", 8))


def test_verifier_catches_corrupted_shape():
    x = N.input_("x", 8)
    good = N.linear(x, N.param("w", (8, 4)))
    verify([good])
    broken = N.Value("linear", good.args, good.kind, (1, 5), good.attrs)
    with pytest.raises(IRError, match="linear"):
        verify([broken])


def test_trace_and_printer():
    t = dsl.trace(models.rgcn, in_dim=16, out_dim=8, num_relations=3)
    assert set(t.inputs) == {"x"} and set(t.weights) == {"weight", "root", "bias"}
    assert t.weights["weight"].full_shape == (3, 16, 8)
    text = format_ir(t.outputs)
    assert "linear(" in text and "scatter(" in text and text.splitlines()[-1].startswith("return")


def test_dsl_errors_are_clear():
    with pytest.raises(TypeError, match="out_dim"):
        dsl.trace(models.rgcn, in_dim=4)
    with pytest.raises(TypeError, match="numbers"):
        dsl.trace(lambda m: m.node_input("x", 2) + 1)
    with pytest.raises(ValueError, match="init"):
        dsl.trace(lambda m: m.node_input("x", 2) + m.weight("b", 2, init="bad"))
    with pytest.raises(TypeError, match="node-wise"):
        dsl.trace(lambda m: m.src(m.node_input("x", 2)))
