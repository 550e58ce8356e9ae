"""Which traversal bodies lower to the ``traversal_csr`` kernel (``LinearTraversal``), and the
reason ``explain`` prints when one does not."""
from hector.compiler import ir
from hector.compiler.ir import CDST, CSRC, EDGE, NODE, arg
from hector.compiler.lower_traversal import linear_traversal


def _args(*values):
    return [arg(i, v) for i, v in enumerate(values)]


def test_rgcn_aggregation_is_one_source_with_addend_and_bias():
    h = ir.Value("saved", (), CSRC, (1, 4))
    root = ir.input_("x", 4)
    b = ir.param("b", (4,))
    a_h, a_root, a_b = _args(h, root, b)
    per_rel = ir.scatter(ir.gather(a_h, EDGE, "src"), CDST, "dst", "mean")
    body = ir.binary("add", ir.binary("add", ir.scatter(per_rel, NODE, "dst"), a_root), a_b)
    lt, why = linear_traversal(body)
    assert why == ""
    assert lt.sources == ((0, (("gather", CSRC, EDGE, "src", None),
                               ("scatter", CDST, EDGE, "dst", "mean"),
                               ("scatter", NODE, CDST, "dst", "sum")), 1.0),)
    assert lt.addends == ((1, 1.0),) and lt.bias == 2


def test_movements_distribute_over_sums_and_scales_fold_into_coefficients():
    e1, e2 = ir.Value("saved", (), EDGE, (2, 3)), ir.Value("saved", (), EDGE, (2, 3))
    a, b = _args(e1, e2)
    body = ir.scatter(ir.binary("sub", a, ir.unary("scale", b, factor=0.5)), NODE, "src")
    lt, why = linear_traversal(body)
    assert why == ""
    move = (("scatter", NODE, EDGE, "src", "sum"),)
    assert lt.sources == ((0, move, 1.0), (1, move, -0.5))


def test_declines_say_why():
    e = ir.Value("saved", (), EDGE, (1, 1))
    (a,) = _args(e)
    lt, why = linear_traversal(ir.scatter(ir.edge_softmax(a), NODE, "dst"))
    assert lt is None and "edge_softmax" in why
    node = ir.input_("x", 4)
    (n,) = _args(node)
    lt, why = linear_traversal(ir.unary("relu", n))
    assert lt is None and "relu" in why
    w = ir.param("w", (4,), per="relation")
    c = ir.Value("saved", (), CSRC, (1, 4))
    a_c, a_w = _args(c, w)
    lt, why = linear_traversal(ir.binary("add", ir.gather(a_c, EDGE, "src"), a_w))
    assert lt is None and "per-relation" in why
    lt, why = linear_traversal(ir.binary("add", n, n))
    assert lt is None and "no gather or scatter" in why
