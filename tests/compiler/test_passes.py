"""Golden pass tests (IR before -> expected IR, compared structurally) and the switches."""
import itertools
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import dsl, models
from hector.compiler.program import compile as hcompile
from hector.compiler import ir as N
from hector.compiler.passes import canonicalize, compact, fuse, reorder
from hector.compiler.passes.common import GraphStats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, random_relational, rel_err  # noqa: E402

# rows: 100 nodes, 1000 edges, 300 unique (src, rel), 200 unique (dst, rel)
STATS = GraphStats(100, 1000, 300, 200, 4, 1)
NO_DUP = GraphStats(100, 300, 300, 300, 4, 1)


def x_(d=16):
    return N.input_("x", d)


def test_canonicalize_moves_and_merges_scales():
    x = N.gather(x_(), N.EDGE, "src")
    d = N.dot(N.unary("scale", x, factor=2.0), x)
    (out,), _ = canonicalize.run((N.unary("scale", d, factor=0.5),), None)
    assert out == N.dot(x, x)   # 2 * 0.5 == 1: the scale vanishes


def test_reorder_weight_first_rgat_score():
    xs = N.gather(x_(), N.EDGE, "src")
    W, k = N.param("W", (16, 8), per="relation"), N.param("k", (8, 2))
    before = N.linear(N.linear(xs, W, heads=2), k, heads=2)
    (after,), dec = reorder.run((before,), STATS)
    assert after == N.linear(xs, N.wmul(W, k), heads=2)
    # The cost in the reason, from the shapes: x (K=16) @ (W @ k) costs K * 2 per row against
    # K * 8 + 8 * 2 for the two linears.
    assert dec[0].applied
    assert dec[0].reason.startswith(f"per-row cost {16 * 2} <= {16 * 8 + 8 * 2} multiply-adds")


def test_reorder_moves_linear_across_aggregation_when_dst_rows_fewer():
    W = N.param("W", (16, 8), per="relation")
    xs = N.gather(x_(), N.EDGE, "src")
    before = N.scatter(N.linear(xs, W), N.CDST, "dst", "mean")
    (after,), dec = reorder.run((before,), STATS)
    assert after == N.linear(N.scatter(xs, N.CDST, "dst", "mean"), W)
    # more (dst, rel) rows than (src, rel) rows: declined, with the counts as reason
    (kept,), dec = reorder.run((before,), GraphStats(100, 1000, 150, 600, 4, 1))
    assert kept == before and not dec[0].applied and "600" in dec[0].reason


def test_reorder_folds_a_per_head_prior_into_the_key_weight():
    """HGT's ``<q_dst, x_src W_r> p_r`` -> ``<q_dst, x_src (W_r p_r)>``; not when the keys
    are read elsewhere too (they would then be computed twice)."""
    q = N.gather(N.input_("q", 4, heads=2), N.EDGE, "dst")
    xs = N.gather(N.input_("k", 4, heads=2), N.EDGE, "src")
    W, p = N.param("W", (2, 4, 4), per="relation"), N.param("p", (2, 1), per="relation")
    keys = N.linear(xs, W)
    before = N.binary("mul", N.dot(q, keys), p)
    (after,), dec = reorder.run((before,), STATS)
    assert after == N.dot(q, N.linear(xs, N.wscale(W, p)))
    assert [d.applied for d in dec] == [True]
    (kept, _), _ = reorder.run((before, N.unary("exp", keys)), STATS)
    assert kept == before
    with pytest.raises(ValueError, match="wscale"):
        N.wscale(W, N.param("p3", (3, 1), per="relation"))


def test_hgt_attention_reads_the_keys_the_gemm_wrote():
    """After the fold the attention has no ``p`` role: no per-row ``k p_r`` anywhere."""
    m = hcompile(models.hgt, in_dim=8, out_dim=8, heads=2, num_relations=4,
                 num_node_types=1, backend="torch")
    ei, et = random_relational(num_nodes=20, num_edges=70, num_relations=4)
    g = hector.Graph(ei, edge_type=et, num_nodes=20, num_relations=4)
    m(g, x=torch.randn(20, 8, requires_grad=True)).sum().backward()
    cp = m.program.compiled_for(g)
    att = [s for s in cp.forward_plan.steps if s.template == "attention"]
    assert len(att) == 1 and "p" not in att[0].body.attr("roles")
    assert not [s for s in cp.backward_plan.steps if s.body.op == "dot"]


def test_compact_src_and_dst():
    W = N.param("W", (16, 8), per="relation")
    src_lin = N.linear(N.gather(x_(), N.EDGE, "src"), W)
    dst_lin = N.linear(N.gather(x_(), N.EDGE, "dst"), W)
    before = N.binary("add", src_lin, dst_lin)
    (after,), dec = compact.run((before,), STATS)
    expect = N.binary("add",
                      N.gather(N.linear(N.gather(x_(), N.CSRC, "src"), W), N.EDGE, "src"),
                      N.gather(N.linear(N.gather(x_(), N.CDST, "dst"), W), N.EDGE, "dst"))
    assert after == expect and all(d.applied for d in dec)
    (same,), dec = compact.run((before,), NO_DUP)
    assert same == before and "nothing to share" in dec[0].reason


def test_switches_off_are_identity_and_logged():
    t = dsl.trace(models.rgcn, in_dim=16, out_dim=8, num_relations=4)
    for p in (reorder, compact):
        out, dec = p.run(t.outputs, STATS, False)
        assert out == t.outputs and "disabled" in dec[0].reason


def test_fuse_builds_attention_kernel_for_rgat():
    t = dsl.trace(models.rgat, in_dim=16, out_dim=4, heads=2, num_relations=4)
    ir, _ = reorder.run(t.outputs, STATS)
    ir, _ = compact.run(ir, STATS)
    fused, dec = fuse.run(ir, STATS)
    templates = [v.attr("template") for v in N.toposort(fused) if v.op == "kernel"]
    assert templates.count("attention") == 1 and templates.count("gemm") == 3
    att = next(v for v in N.toposort(fused) if v.attr("template") == "attention").attr("body")
    # (the layer's output bias is the attention's epilogue: fuse_attention._fold_bias)
    assert att.attr("roles") == ("v", "a_src", "a_dst", "bias") and att.attr("slope") == 0.2


@pytest.mark.parametrize("model,dims", [
    (models.rgcn, dict(in_dim=8, out_dim=4)),
    (models.rgat, dict(in_dim=8, out_dim=4, heads=2)),
    (models.hgt, dict(in_dim=8, out_dim=8, heads=2)),
])
def test_every_switch_combination_gives_the_same_output(model, dims):
    ei, et = random_relational(num_nodes=20, num_edges=70)
    ntype = (torch.arange(20) >= 12).long() if model is models.hgt else None
    g = hector.Graph(ei, edge_type=et, num_nodes=20, num_relations=4, node_type=ntype)
    ref = None
    torch.manual_seed(0)
    x = torch.randn(20, dims["in_dim"])
    for r, c, f in itertools.product([False, True], repeat=3):
        torch.manual_seed(1)
        m = hcompile(model, reorder=r, compact=c, fuse=f, backend="torch",
                           num_relations=4, num_node_types=g.num_node_types, **dims)
        out = m(g, x=x)
        if ref is None:
            ref = out
        assert rel_err(out.detach(), ref.detach()) < 1e-5, (r, c, f)


def test_fuse_gives_a_linear_its_bias_add_as_the_gemm_epilogue():
    """``[reshape](add(linear(x, W), b))``, the linear read by the add alone and ``b`` sliced
    as ``W``, is one GEMM kernel; declined when the linear's rows are read elsewhere too (they
    are needed without the bias), when the bias is sliced otherwise, or per-head weights."""
    x = x_(16)
    W, b = N.param("W", (16, 8), per="node_type"), N.param("b", (8,), per="node_type")
    lin = N.linear(x, W)
    biased = N.reshape(N.binary("add", lin, b), 2)
    (k,), dec = fuse.run((biased,), STATS)
    assert k.attr("template") == "gemm" and [a.op for a in k.args] == ["input", "param", "param"]
    assert k.attr("body").op == "reshape" and k.attr("body").args[0].op == "add"
    assert [d.applied for d in dec if d.what == "bias add into linear"] == [True]
    (k2, _), _ = fuse.run((biased, N.unary("exp", lin)), STATS)
    assert k2.attr("template") == "traversal"
    b_all = N.param("b_all", (8,))                       # one bias for every node type
    (k3,), _ = fuse.run((N.binary("add", lin, b_all),), STATS)
    assert k3.attr("template") == "traversal"
    Wh = N.param("Wh", (2, 8, 4), per="relation")
    per_head = N.linear(N.gather(N.input_("xh", 8, heads=2), N.CSRC, "src"), Wh)
    (k4,), _ = fuse.run((N.binary("add", per_head, N.param("bh", (2, 4))),), STATS)
    assert k4.attr("template") == "traversal"


@pytest.mark.parametrize("dims", [dict(in_dim=8, out_dim=8, heads=2),
                                  dict(in_dim=6, out_dim=8, heads=1)])
def test_hgt_bias_epilogues_equal_the_torch_backend(dims):
    """HGT on the Triton backend: K, Q, V (and, without the skip, the output linear) carry
    their bias as GEMM epilogues -- no plan step only adds a bias -- with output and every
    gradient equal to the torch backend's, node types interleaved (``node_perm``)."""
    dev = device_for("triton")
    ei, et = random_relational(num_nodes=20, num_edges=70)
    g = hector.Graph(ei, edge_type=et, num_nodes=20, num_relations=4,
                     node_type=torch.arange(20) % 3, num_node_types=3).to(dev)
    x = torch.randn(20, dims["in_dim"], generator=torch.Generator().manual_seed(2)).to(dev)
    results = {}
    for backend in ("torch", "triton"):
        torch.manual_seed(1)
        m = hcompile(models.hgt, backend=backend, num_relations=4, num_node_types=3,
                     **dims).to(dev)
        for p in m.parameters():        # biases are zeros at init: make them count
            torch.nn.init.normal_(p.data if p.dim() else p.data.view(1), std=0.3)
        xg = x.clone().requires_grad_()
        out = m(g, x=xg)
        dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(dev)
        grads = torch.autograd.grad(out, [xg] + list(m.parameters()), dy)
        results[backend] = (m, out, grads)
    m, out, grads = results["triton"]
    plan = m.program.compiled_for(g).forward_plan
    biased = [s for s in plan.steps if s.template == "gemm" and s.spec[0].has_bias]
    assert len(biased) == (4 if dims["in_dim"] != dims["out_dim"] else 3)
    assert not [s for s in plan.steps if s.template == "traversal" and s.spec.schedule != "view"
                and {b.op for b in N.toposort([s.body]) if b.op != "arg"} <= {"add", "reshape"}]
    _, out0, grads0 = results["torch"]
    assert rel_err(out.detach(), out0.detach()) < 1e-5
    for name, a, b in zip(["x"] + [n for n, _ in m.named_parameters()], grads, grads0):
        assert rel_err(a, b) < 1e-4, name


def test_a_reshape_of_an_input_is_a_view_not_a_kernel():
    """A traversal step that only reshapes one input (HGT's backward reshapes dq's rows) runs
    no kernel on the Triton backend: its output is a view of the input's storage."""
    from hector.compiler.execute import run_step, triton_step
    from hector.compiler.steps_torch import GraphIndex
    dev = device_for("triton")
    ei, et = random_relational(num_nodes=20, num_edges=70)
    g = hector.Graph(ei, edge_type=et, num_nodes=20, num_relations=4).to(dev)
    m = hcompile(models.hgt, backend="triton", in_dim=8, out_dim=8, heads=2, num_relations=4,
                 num_node_types=1).to(dev)
    m(g, x=torch.randn(20, 8, device=dev, requires_grad=True)).sum().backward()
    plan = m.program.compiled_for(g).backward_plan
    views = [s for s in plan.steps if s.template == "traversal" and s.spec.schedule == "view"]
    assert views and all(not triton_step(s) for s in views)
    step = views[0]
    x = torch.randn((20,) + tuple(step.inputs[0].shape), device=dev)
    out = run_step(step, [x], GraphIndex.of(g), "triton")
    assert out.shape == (20,) + tuple(step.output.shape) and out.data_ptr() == x.data_ptr()


def test_fuse_keeps_a_linear_csr_sum_out_of_an_elementwise_traversal():
    """``x * sigmoid(g) + scatter(a + b)``: the sum over the CSR is a linear traversal by
    itself (traversal_csr, rows batched) and the whole is not, so it becomes its own kernel
    and the elementwise one a row map reading it; a linear whole stays one kernel."""
    from hector.compiler.lower_traversal import linear_traversal
    x = N.input_("x", 8)
    g = N.unary("sigmoid", N.param("g", (1,), per="node_type"))
    a, b = (N.gather(N.input_(n, 8), N.CSRC, "src") for n in ("a", "b"))
    csr_sum = N.scatter(N.binary("add", a, b), N.NODE, "src")
    out = N.binary("add", N.binary("mul", x, g), csr_sum)
    (fused,), dec = fuse.run((out,), STATS)
    kernels = [v for v in N.toposort([fused]) if v.op == "kernel" and v.attr("template") == "traversal"]
    assert len(kernels) == 2
    csr, rest = sorted(kernels, key=lambda k: k is fused)
    assert linear_traversal(csr.attr("body"))[0] is not None
    assert not any(v.op == "scatter" for v in N.toposort([rest.attr("body")]))
    assert any(not d.applied and "traversal_csr runs by itself" in d.reason for d in dec)
    (whole,), _ = fuse.run((N.binary("add", x, csr_sum),), STATS)
    assert [v.attr("template") for v in N.toposort([whole]) if v.op == "kernel"] == ["traversal"]
