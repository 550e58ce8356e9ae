"""The siblings pass (horizontal fusion): linears of one input as one GEMM read back as
column windows, their gradients as one ``place``, and the attention backward writing HGT's
k and v gradients side by side; outputs and every gradient against the pass switched off."""
import sys
from pathlib import Path

import pytest
import torch

import hector
from hector.compiler import ir as N
from hector.compiler import models
from hector.compiler.passes import autodiff, siblings
from hector.compiler.program import compile as hcompile
from hector.compiler.verify import verify

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, forward_backward, rel_err  # noqa: E402


def _pair(per="relation", bias=(True, True), widths=(32, 32), heads=(1, 2)):
    x = N.gather(N.input_("x", 6), N.CSRC, "src")
    outs = []
    for name, n, b, h in zip("ab", widths, bias, heads):
        y = N.linear(x, N.param(name, (6, n), per=per), 1)
        if b:
            y = N.binary("add", y, N.param(name + "_bias", (n,), per=per))
        outs.append(N.reshape(y, h) if h != 1 else y)
    return x, outs


def test_linears_of_one_input_become_one_gemm_read_as_windows():
    x, (a, b) = _pair()
    (wa, wb), dec = siblings.run((a, b))
    r = "relation"
    W = N.wcat([N.param("a", (6, 32), per=r), N.param("b", (6, 32), per=r)])
    fused = N.binary("add", N.linear(x, W, 1),
                     N.wcat([N.param("a_bias", (32,), per=r), N.param("b_bias", (32,), per=r)]))
    assert wa == N.cols(fused, 0, (1, 32)) and wb == N.cols(fused, 32, (2, 16))
    assert wa.shape == a.shape and wb.shape == b.shape
    assert dec[0].applied and "N = 64" in dec[0].reason
    verify((wa, wb))


@pytest.mark.parametrize("case", ["slicing", "bias", "read elsewhere", "one", "node rows",
                                  "narrow", "padding"])
def test_linears_that_differ_stay_apart(case):
    x = N.gather(N.input_("x", 6), N.CSRC, "src")
    if case == "slicing":
        a = N.linear(x, N.param("a", (6, 32), per="relation"), 1)
        b = N.linear(x, N.param("b", (6, 32)), 1)
        outs = (a, b)
    elif case == "bias":
        outs = tuple(_pair(bias=(True, False))[1])
    elif case == "read elsewhere":     # a's bare product is an output too: not a window
        lin = N.linear(x, N.param("a", (6, 32)), 1)
        a = N.binary("add", lin, N.param("a_bias", (32,)))
        b = N.binary("add", N.linear(x, N.param("b", (6, 32)), 1), N.param("b_bias", (32,)))
        outs = (a, b, lin)
    elif case == "node rows":          # read in order: nothing to save, lifetimes tied
        x = N.input_("x", 6)
        outs = tuple(N.linear(x, N.param(n, (6, 32), per="node_type"), 1) for n in "ab")
    elif case == "narrow":             # RGAT's z W_r and its score term z W_r a_src
        outs = tuple(_pair(bias=(False, False), widths=(32, 1), heads=(1, 1))[1])
    elif case == "padding":            # 16 + 32 pads to 64 columns, separately to 48
        outs = tuple(_pair(widths=(16, 32), heads=(1, 1))[1])
    else:
        outs = (_pair()[1][0],)
    after, dec = siblings.run(outs)
    assert after == outs and not any(d.applied for d in dec)
    if case in ("narrow", "padding"):
        assert "narrow kernel" in dec[0].reason if case == "narrow" else "padded" in dec[0].reason


def test_gradients_of_the_windows_are_one_place():
    x, (a, b) = _pair(bias=(False, False), heads=(1, 1))
    (wa, wb), _ = siblings.run((a, b))
    bwd = autodiff.differentiate((wa, wb))
    dx = dict(zip(bwd.targets, bwd.outputs))[x.args[0]]
    assert dx.op == N.Op.SCATTER and dx.args[0].op == N.Op.LINEAR
    g = dx.args[0].args[0]
    assert g.op == N.Op.PLACE and g.attr("starts") == (0, 32)
    assert [p.op for p in g.args] == [N.Op.GRAD_OUTPUT, N.Op.GRAD_OUTPUT]
    verify(bwd.outputs)


def test_place_of_gaps_and_overlaps():
    x = N.input_("x", 10)
    p = N.place((N.input_("a", 2), N.input_("b", 3)), (7, 0), (1, 10))
    assert p.attr("starts") == (0, 7) and [a.attr("name") for a in p.args] == ["b", "a"]
    with pytest.raises(ValueError, match="overlap"):
        N.place((N.input_("a", 4), N.input_("b", 3)), (0, 2), (1, 10))
    with pytest.raises(ValueError, match="not inside"):
        N.cols(x, 8, (1, 4))


def _gated(m, in_dim, out_dim):
    """Two per-relation linears of the source rows (siblings), read by an elementwise gate:
    the windows feed traversals and their gradients are a concat (no attention)."""
    x = m.node_input("x", in_dim)
    a = m.linear(m.src(x), m.weight("a", (in_dim, out_dim), per="relation")) \
        + m.weight("a_bias", (out_dim,), per="relation")
    b = m.linear(m.src(x), m.weight("b", (in_dim, out_dim), per="relation")) \
        + m.weight("b_bias", (out_dim,), per="relation")
    return m.aggregate(m.gelu(a) * m.sigmoid(b), "sum", per_relation=True)


def _graph(seed=0, num_nodes=20, num_edges=80, relations=3):
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
    et = torch.randint(0, relations, (num_edges,), generator=gen)
    ntype = (torch.arange(num_nodes) >= 12).long()
    return hector.Graph(ei, edge_type=et, num_nodes=num_nodes, num_relations=relations,
                        node_type=ntype)


def _run(fn, g, backend, fused, monkeypatch, **kw):
    if not fused:
        monkeypatch.setattr(siblings, "run", lambda o, s=None, e=True: (tuple(o), []))
    dev = device_for(backend)
    torch.manual_seed(1)
    m = hcompile(fn, backend=backend, **kw).to(dev)
    g = g.to(dev)
    out, grads = forward_backward(m, g, dev, kw["in_dim"])
    monkeypatch.undo()
    return m.program.compiled_for(g), out, grads


def _same(a, b):
    (_, out, grads), (_, ref, ref_grads) = a, b
    assert rel_err(out, ref) < 1e-5
    assert set(grads) == set(ref_grads)
    for name, gr in grads.items():
        assert gr is not None, name
        assert rel_err(gr, ref_grads[name]) < 1e-4, name


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gated_siblings_equal_separate_linears(backend, monkeypatch):
    kw = dict(in_dim=8, out_dim=16, num_relations=3, num_node_types=2)
    g = _graph()
    fused = _run(_gated, g, backend, True, monkeypatch, **kw)
    _same(fused, _run(_gated, g, "torch", False, monkeypatch, **kw))
    gemms = [s for s in fused[0].forward_plan.steps if s.template == "gemm"]
    assert [s.spec[0].N for s in gemms] == [32]            # one GEMM for both
    bsteps = fused[0].backward_plan.steps
    assert not [s for s in bsteps if s.body.op == N.Op.PLACE]     # no concat: read apart
    # (on compact rows, or summed into the nodes by their scatter epilogues: the graph has
    # over two (src, relation) rows per node)
    dx = [s for s in bsteps if s.template == "gemm" and s.body.op != N.Op.WGRAD
          and (s.output.kind == N.CSRC or s.body.op == N.Op.SCATTER)]
    assert sorted(s.spec[0].K for s in dx) == [16, 16]       # one dx GEMM per window


def _typed_graph(num_nodes=20, num_edges=80, num_relations=4, seed=0):
    """Relation r leaves nodes of type r % 2 (HGT's K and V fold into the relation's)."""
    gen = torch.Generator().manual_seed(seed)
    et = torch.randint(0, num_relations, (num_edges,), generator=gen)
    lo = torch.where(et % 2 == 0, 0, 12)
    hi = torch.where(et % 2 == 0, 12, num_nodes)
    src = lo + (torch.rand(num_edges, generator=gen) * (hi - lo)).long()
    dst = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    ntype = (torch.arange(num_nodes) >= 12).long()
    return hector.Graph(torch.stack([src, dst]), edge_type=et, num_nodes=num_nodes,
                        num_relations=num_relations, node_type=ntype)


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_hgt_keys_and_values_in_one_gemm_and_one_gradient_buffer(backend, heads, monkeypatch):
    kw = dict(in_dim=8, out_dim=16, heads=heads, num_relations=4, num_node_types=2)
    g = _typed_graph()
    fused = _run(models.hgt, g, backend, True, monkeypatch, **kw)
    _same(fused, _run(models.hgt, g, "torch", False, monkeypatch, **kw))
    cp = fused[0]
    compact = [s for s in cp.forward_plan.steps
               if s.template == "gemm" and s.output.kind == N.CSRC]
    assert [s.spec[0].N for s in compact] == [32]           # K and V: N = 16 + 16
    bsteps = cp.backward_plan.steps
    assert [s.body.attr("role") for s in bsteps if s.template == "select"].count("kv") == 1
    assert not [s for s in bsteps if s.body.op == N.Op.PLACE]   # no concat: one buffer
    # (the dx GEMM reads compact rows; it writes them, or sums them into the source nodes
    # itself: its scatter epilogue)
    dx = [s for s in bsteps if s.template == "gemm" and s.spec is not None
          and s.spec[0] is not None and s.spec[1].rows == N.CSRC]
    assert [s.spec[0].K for s in dx] == [32]                 # dK and dV in one dx GEMM


def _attention_layer(m, x, in_dim, d, name):
    """One HGT-like layer (typed K, Q, V; per-relation K and V; dot-product attention)."""
    def typed(part):
        return (m.linear(x, m.weight(name + part, (in_dim, d), per="node_type"))
                + m.weight(name + part + "_b", (d,), per="node_type"))
    k, q, v = typed("k"), typed("q"), typed("v")
    k_r = m.linear(m.src(k), m.weight(name + "k_rel", (1, d, d), per="relation"))
    v_r = m.linear(m.src(v), m.weight(name + "v_rel", (1, d, d), per="relation"))
    alpha = m.edge_softmax(m.dot(m.dst(q), k_r))
    return m.aggregate(alpha * v_r, "sum")


def _two_layers(m, in_dim, out_dim):
    x = m.node_input("x", in_dim)
    return _attention_layer(m, _attention_layer(m, x, in_dim, out_dim, "a"), out_dim,
                            out_dim, "b")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_stacked_layers_fuse_each_group(backend, monkeypatch):
    """The second layer's K and V read the first's output (rebuilt by the first group's
    rewrite): both groups fuse, and both attention backwards write k and v jointly."""
    kw = dict(in_dim=8, out_dim=16, num_relations=4, num_node_types=2)
    g = _typed_graph()
    fused = _run(_two_layers, g, backend, True, monkeypatch, **kw)
    _same(fused, _run(_two_layers, g, "torch", False, monkeypatch, **kw))
    cp = fused[0]
    compact = [s.spec[0].N for s in cp.forward_plan.steps
               if s.template == "gemm" and s.output.kind == N.CSRC]
    assert compact == [32, 32]
    bsteps = cp.backward_plan.steps
    assert [s.body.attr("role") for s in bsteps if s.template == "select"].count("kv") == 2
    assert not [s for s in bsteps if s.body.op == N.Op.PLACE]
    applied = [d.what for r in cp.log for d in r.decisions if r.name.endswith("siblings")
               and d.applied]
    assert sum("linears" in w for w in applied) == 2 and \
        "k and v gradients of 2 attention backward(s)" in applied


def test_a_joint_backward_counts_its_buffer_once():
    from hector.compiler.memory import role_sizes, step_allocs
    g = _typed_graph()
    m = hcompile(models.hgt, in_dim=8, out_dim=16, heads=2, num_relations=4,
                 num_node_types=2, backend="torch")
    m(g, x=torch.randn(g.num_nodes, 8, requires_grad=True)).sum().backward()
    cp = m.program.compiled_for(g)
    (step,) = [s for s in cp.backward_plan.steps if s.body.op == N.Op.ATTENTION_BWD]
    assert step.body.attr("joint")
    size = lambda v: 100 * v.shape[0] * v.shape[1]        # noqa: E731
    roles = role_sizes(step, size)
    assert roles["kv"] == roles["k"] + roles["v"]
    assert step_allocs(step, size) == {step.output: roles["v"] + roles["q"] + roles["k"]}


def test_siblings_of_typed_products_fuse_into_one_product():
    """HGT's K and V weights, ``wmul(wsrc(K_tau), W_k)`` and ``wmul(wsrc(V_tau), W_v)`` with
    per-head ``W``, fuse into ``wmul(wsrc(wcat(K, V)), wheads(W_k, W_v))``; the torch
    evaluation of both forms is the same matrix, weights and bias rows."""
    from hector.compiler.steps_torch import _wmul
    k, v = (N.param(n, (6, 8), per="node_type") for n in "kv")
    wk, wv = (N.param(n, (2, 4, 4), per="relation") for n in ("wk", "wv"))
    fused = siblings.fused_weight([N.wmul(N.wsrc(k), wk), N.wmul(N.wsrc(v), wv)])
    assert fused.op == N.Op.WMUL and fused.shape == (6, 16)
    assert fused.args[0].op == N.Op.WSRC and fused.args[0].args[0].op == N.Op.WCAT
    assert fused.args[1].op == N.Op.WHEADS and fused.args[1].shape == (4, 4, 4)
    verify([fused])
    # a sibling of another form: a plain concatenation
    other = N.param("o", (6, 8), per="relation")
    assert siblings.fused_weight([N.wmul(N.wsrc(k), wk), other]).op == N.Op.WCAT
    g = torch.Generator().manual_seed(0)
    for rows in ((3, 6), (3,)):           # per-relation matrices, then bias rows
        a1, a2 = (torch.randn(*rows, 8, generator=g) for _ in range(2))
        b1, b2 = (torch.randn(3, 2, 4, 4, generator=g) for _ in range(2))
        row = len(rows) == 1
        apart = torch.cat([_wmul(a1, b1, row, (2, 4, 4)), _wmul(a2, b2, row, (2, 4, 4))], -1)
        joint = _wmul(torch.cat([a1, a2], -1), torch.cat([b1, b2], -3), row, (4, 4, 4))
        torch.testing.assert_close(joint, apart)


def _node_group(*members):
    """Linears of node rows of input ``x``: (weight declared stored transposed?, readers)."""
    x = N.input_("x", 6)
    outs = []
    for i, (stored, read_by) in enumerate(members):
        w = N.param(f"w{i}", (8, 6) if stored else (6, 8))
        y = N.linear(x, N.wT(w) if stored else w, 1)
        outs.append(N.gather(y, N.EDGE, "src") if read_by == "gather" else
                    N.binary("add", y, y) if read_by == "add" else N.normalize(y))
    return outs


def _joined(outputs):
    _, decisions = siblings.run(tuple(outputs))
    return [d for d in decisions if d.applied and "node input" in d.what]


def test_node_rows_of_an_input_join_only_when_an_attention_reads_them():
    """Node-row linears of a layer input with declared weights join one GEMM when each is
    gathered or added (an attention's query, key, value and root): the Transformer's four
    projections, stored transposed, stacked in that layout.  A linear read otherwise (GAT's
    projection, which its score products read) and inputs that are no layer input stay
    apart; so do weights ``reorder`` made (products of parameters)."""
    joined = _joined(_node_group((True, "gather"), (True, "gather"), (True, "add")))
    assert len(joined) == 1 and "3 linears" in joined[0].what
    assert not _joined(_node_group((False, "gather"), (False, "other")))
    x = N.normalize(N.input_("x", 6))                  # (not a layer input)
    apart = [N.gather(N.linear(x, N.param(f"w{i}", (6, 8)), 1), N.EDGE, "src")
             for i in range(2)]
    assert not _joined(apart)
    x = N.input_("x", 6)
    made = [N.gather(N.linear(x, N.wmul(N.param(f"a{i}", (6, 4)), N.param(f"b{i}", (4, 8))),
                              1), N.EDGE, "src") for i in range(2)]
    assert not _joined(made)
    # the Transformer program: one GEMM of the stacked [out, in] weights, read in place
    cp = hector.compile(models.transformer, in_dim=16, out_dim=16).program.compiled_for(
        hector.Graph(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3))
    weights = [v for v in N.toposort(cp.forward.optimized) if v.op == N.Op.WCAT]
    assert any(w.attr("rows") and len(w.args) == 4 for w in weights)
    gemms = [s for s in cp.forward_plan.steps if s.template == "gemm"]
    assert len(gemms) == 1
