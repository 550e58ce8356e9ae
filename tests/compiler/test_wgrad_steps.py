"""Weight-gradient steps of compiled backward plans on the Triton backend (one
``segment_mm_wgrad`` launch per step) against the torch backend's per-slice loop: per relation
(with empty relations), per node type (non-contiguous types: ``node_perm``), one segment,
per-head weights and zero rows; the bias gradients' slice sums against ``index_add``; and the
per-node-type bias gradients (``wsum`` on the weight-gradient kernel, x a column of ones)."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from hector.graph import Graph
from hector.nn import HGTConv, RGATConv
from hector.compiler.execute import run_step, triton_step
from hector.compiler import steps_torch
from hector.compiler.steps_torch import GraphIndex, eval_body

pyg = pytest.importorskip("torch_geometric.nn")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import device_for, random_hetero, random_relational  # noqa: E402


def _wgrad_steps(program, graph, op="wgrad"):
    plan = program.compiled_for(graph).backward_plan
    steps = [s for s in plan.steps if s.body.op == op]
    assert steps and all(triton_step(s) for s in steps)
    return steps


def _check(steps, graph, dev):
    ix = GraphIndex.of(graph)
    gen = torch.Generator().manual_seed(0)
    for step in steps:
        args = [torch.randn((ix.rows[v.kind],) + v.shape, generator=gen).to(dev)
                for v in step.inputs]
        want = eval_body(step.body, args, ix)
        got = run_step(step, args, ix, "triton")
        if step.extra is not None:      # a weight gradient with its bias gradient: (dW, db)
            got, db = got
            dy = args[step.body.args[1].attr("index")]
            want_db = eval_body(step.extra.attr("body"), [dy], ix)
            assert db.shape == want_db.shape, step.name
            torch.testing.assert_close(db, want_db, rtol=1e-4, atol=1e-4)
        assert got.shape == want.shape, step.name
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opts", [dict(), dict(heads=2)])
@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("empty", [False, True])
def test_rgat_wgrad_steps(opts, compact, empty):
    dev = device_for("triton")
    ei, et = random_relational(num_relations=4)
    if empty:
        ei, et = ei[:, :0], et[:0]
    g = Graph(ei.to(dev), edge_type=et.to(dev), num_nodes=24, num_relations=4)
    layer = RGATConv.from_pyg(pyg.RGATConv(8, 4, 4, **opts), backend="triton", compact=compact,
                              reorder=compact)
    _check(_wgrad_steps(layer.program, g), g, dev)


@pytest.mark.parametrize("heads", [1, 2])
def test_hgt_wgrad_steps(heads):
    dev = device_for("triton")
    counts, eid, meta = random_hetero()
    layer = HGTConv.from_pyg(pyg.HGTConv(8, 8, meta, heads=heads), backend="triton")
    g = layer.graph_of({t: torch.zeros(n, 8, device=dev) for t, n in counts.items()},
                       {k: v.to(dev) for k, v in eid.items()})
    _check(_wgrad_steps(layer.program, g), g, dev)


def test_hgt_wgrad_steps_non_contiguous_node_types():
    import hector
    from hector.compiler import models
    dev = device_for("triton")
    ei, et = random_relational(num_relations=4)
    node_type = torch.tensor([i % 3 for i in range(24)])
    g = Graph(ei.to(dev), edge_type=et.to(dev), num_nodes=24, num_relations=4,
              node_type=node_type.to(dev), num_node_types=3)
    assert not g.node_types_contiguous
    m = hector.compile(models.hgt, in_dim=8, out_dim=8, heads=2, num_relations=4,
                       num_node_types=3, backend="triton")
    _check(_wgrad_steps(m.program, g), g, dev)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("n", [1, 4, steps_torch.ONE_HOT_SLICES + 3])
def test_slice_sums_equal_index_add(monkeypatch, dtype, tol, n):
    # a bias gradient per slice: rows in any order, some slices empty, several row chunks
    monkeypatch.setattr(steps_torch, "_ONE_HOT_ELEMENTS", 7 * n)     # chunks of 7 rows
    gen = torch.Generator().manual_seed(n)
    dy = torch.randn(53, 3, 5, generator=gen).to(dtype)
    idx = torch.randint(0, max(1, n - 1), (53,), generator=gen)      # slice n-1 stays empty
    got = steps_torch.slice_sums(dy, idx, n)
    want = torch.zeros(n, 3, 5).index_add(0, idx, dy.float())
    assert got.shape == (n, 3, 5) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    if n > 1:
        assert torch.all(got[n - 1] == 0)


@pytest.mark.parametrize("n", [4, steps_torch.ONE_HOT_SLICES + 1])
def test_slice_sums_of_no_rows_are_zeros(n):
    # a graph without edges: a per-relation bias gradient sums no compact rows
    got = steps_torch.slice_sums(torch.zeros(0, 2, 1), torch.zeros(0, dtype=torch.long), n)
    assert got.shape == (n, 2, 1) and not got.any()


@pytest.mark.parametrize("heads", [1, 2])
def test_hgt_relation_weight_gradients_read_node_rows_in_place(heads):
    """``k W_r`` and ``v W_r`` read node rows gathered onto (src, relation) rows; their weight
    gradients read the same node rows through the GEMM's index (no gathered copy, no
    traversal step that only gathers), and equal the torch backend's (``_check``)."""
    from hector.compiler.ir import Op
    dev = device_for("triton")
    counts, eid, meta = random_hetero()
    layer = HGTConv.from_pyg(pyg.HGTConv(8, 8, meta, heads=heads), backend="triton")
    g = layer.graph_of({t: torch.zeros(n, 8, device=dev) for t, n in counts.items()},
                       {k: v.to(dev) for k, v in eid.items()})
    steps = _wgrad_steps(layer.program, g)
    gathered = [s for s in steps if s.body.args[0].op == Op.GATHER]
    # K's and V's (8 columns each): one 16-column GEMM since the siblings pass fuses
    # outputs of up to one padded tile (narrow kernels are for one column only)
    assert sum(s.body.shape[-1] for s in gathered) == 16 and len(gathered) == 1
    assert all(s.inputs[0].kind == "node" and "read in place" in s.note for s in gathered)
    plan = layer.program.compiled_for(g).backward_plan
    assert not [s for s in plan.steps if s.template == "traversal"
                and [b.op for b in _ops(s.body)] == [Op.GATHER]]
    _check(gathered, g, dev)


def _ops(body):
    from hector.compiler.ir import Op, toposort
    return [b for b in toposort([body]) if b.op != Op.ARG]


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("contiguous", [True, False])
def test_hgt_node_type_bias_gradients_on_the_wgrad_kernel(heads, contiguous):
    """HGT's per-node-type biases and skip gate: each gradient one ``segment_mm_wgrad``
    launch (a GEMM step, not torch's one-hot product), equal to the torch backend's, with
    node types contiguous or interleaved (read through ``node_perm``), one type empty."""
    import hector
    from hector.compiler import models
    dev = device_for("triton")
    ei, et = random_relational(num_relations=4)
    node_type = (torch.arange(24) * 3 // 24 if contiguous else torch.arange(24) % 3)
    g = Graph(ei.to(dev), edge_type=et.to(dev), num_nodes=24, num_relations=4,
              node_type=node_type.to(dev), num_node_types=4)      # type 3 has no node
    assert g.node_types_contiguous == contiguous
    m = hector.compile(models.hgt, in_dim=8, out_dim=8, heads=heads, num_relations=4,
                       num_node_types=4, backend="triton")
    plan = m.program.compiled_for(g).backward_plan
    alone = [s for s in plan.steps if s.body.op == "wsum" and s.body.per == "node_type"]
    paired = [s for s in plan.steps if s.extra is not None and s.body.op == "wgrad"
              and s.extra.attr("body").per == "node_type"]
    # the skip gate alone; the k, q, v and output biases with their weights' gradients
    assert len(alone) == 1 and len(paired) == 4
    assert all(s.template == "gemm" for s in alone + paired)
    _check(alone + paired, g, dev)


def _typed_hgt_graph(dev):
    counts, eid, meta = random_hetero()
    layer = HGTConv.from_pyg(pyg.HGTConv(8, 8, meta, heads=1), backend="triton")
    g = layer.graph_of({t: torch.zeros(n, 8, device=dev) for t, n in counts.items()},
                       {k: v.to(dev) for k, v in eid.items()})
    return layer, g


def test_hgt_bias_gradients_come_from_the_weight_gradient_kernels():
    """Each typed linear's bias gradient sums the dy its weight gradient reads: lowering
    pairs them (the step's ``extra`` output), so no bias-gradient step of its own is left
    but the skip gate's; per node type (Q, output) and per relation (K and V folded into
    the relations' weights); both against the torch backend's separate sums."""
    dev = device_for("triton")
    layer, g = _typed_hgt_graph(dev)
    plan = layer.program.compiled_for(g).backward_plan
    paired = [s for s in plan.steps if s.body.op == "wgrad" and s.extra is not None]
    # K and V per relation are one fused GEMM (8 + 8 columns, see above)
    assert sorted(s.body.per for s in paired) == ["node_type", "node_type", "relation"]
    assert [s.body.shape for s in paired if s.body.per == "relation"] == [(8, 16)]
    alone = [s for s in plan.steps if s.body.op == "wsum"]
    assert [s.body.shape for s in alone] == [(1,)]           # the gate's (1,) per node type
    _check(paired + alone, g, dev)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("runs", [0, 1, 3])    # rows per program: automatic, 1 or 3 tiles
def test_wgrad_sums_kernel_equals_the_two_kernels(dtype, tol, runs):
    from hector.kernels.segment_mm import launch
    from hector.kernels.segment_mm.spec import GemmSpec, default_schedule
    dev = device_for("triton")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(90, 12, generator=gen).to(dev, dtype)
    dy = torch.randn(430, 10, generator=gen).to(dev, dtype)
    gather = torch.randint(0, 90, (400,), generator=gen).to(dev)
    scatter = torch.randperm(430, generator=gen)[:400].to(dev)
    bounds = (0, 250, 250, 400)                     # the middle segment is empty
    spec = GemmSpec.of(x, gather, scatter, False, 10)
    sched = default_schedule(spec, interpreting=dev.type == "cpu")
    # 1 or 3 row tiles per program: segments split over programs, partial sums by atomics,
    # each program's own loop over one or several tiles
    sched = dataclasses.replace(sched, wgrad_rows=runs * sched.block_m)
    like = torch.empty(3, 12, 10, dtype=dtype, device=dev)
    dw, db = launch.launch_wgrad(spec, sched, bounds, x, gather, dy, scatter, like, sums=True)
    want_dw = launch.launch_wgrad(spec, sched, bounds, x, gather, dy, scatter, like)
    xs, ds = x.float()[gather], dy.float()[scatter]
    want_db = torch.stack([ds[a:b].sum(0) for a, b in zip(bounds[:-1], bounds[1:])])
    assert dw.dtype == db.dtype == dtype and db.shape == (3, 10)
    torch.testing.assert_close(dw.float(), want_dw.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(db.float(), want_db, rtol=tol, atol=tol)
    assert not db[1].any()
    ref = torch.stack([xs[a:b].t() @ ds[a:b] for a, b in zip(bounds[:-1], bounds[1:])])
    torch.testing.assert_close(dw.float(), ref, rtol=tol, atol=tol * 4)


def test_rgcn_weight_gradient_reads_the_destination_gradient_in_place():
    """RGCN with the mean before its relation linear (reorder: fewer (dst, relation) rows than
    (src, relation) rows): ``dW_r = sum mean^T g[dst]`` reads the incoming gradient's node rows
    through the kernel's dy index -- no traversal step gathers them onto the compact rows --
    runs first in the backward (the mean it reads is freed before the dx GEMM's compact
    rows exist), equals the torch backend's, and the layer's gradients equal torch's."""
    from hector.compiler import models
    from hector.compiler.ir import CDST, Op
    from hector.compiler.program import compile as hcompile
    from helpers import rel_err
    dev = device_for("triton")
    gen = torch.Generator().manual_seed(0)
    ei = torch.stack([torch.randint(0, 24, (90,), generator=gen),
                      torch.randint(0, 8, (90,), generator=gen)])
    g = Graph(ei, edge_type=torch.randint(0, 3, (90,), generator=gen), num_nodes=24,
              num_relations=3)

    def run(backend):
        torch.manual_seed(1)
        m = hcompile(models.rgcn, backend=backend, in_dim=8, out_dim=12, num_relations=3)
        for p in m.parameters():
            torch.nn.init.normal_(p.data, std=0.3)
        m, gg = m.to(dev), g.to(dev)
        x = torch.randn(24, 8, generator=torch.Generator().manual_seed(2)).to(dev)
        x.requires_grad_()
        out = m(gg, x=x)
        (out * torch.linspace(-1, 1, out.numel(), device=dev).view_as(out)).sum().backward()
        return m, gg, [x.grad] + [p.grad for p in m.parameters()]
    m, gg, grads = run("triton")
    plan = m.program.compiled_for(gg).backward_plan
    (step,) = [s for s in plan.steps if s.body.op == Op.WGRAD and s.body.per == "relation"]
    assert step.body.args[1].op == Op.GATHER and "dy read in place" in step.note
    assert plan.steps[0] is step
    assert not [s for s in plan.steps if s.template == "traversal" and s.output.kind == CDST]
    _check([step], gg, dev)
    for got, want in zip(grads, run("torch")[2]):
        assert rel_err(got.cpu(), want.cpu()) < 1e-4


@pytest.mark.parametrize("heads", [1, 2])
def test_shared_bias_gradients_come_from_the_weight_gradient_kernels(heads):
    """A bias shared by all rows (Transformer's query, key, value and root biases, stacked
    as its four projections are one GEMM) sums the dy its weight's gradient reads: it is that
    kernel's second output, no bias-gradient step is left, and both equal the torch
    backend's sums."""
    from hector.compiler import models
    from hector.compiler.program import compile as hcompile
    from hector.graph import with_self_loops
    dev = device_for("triton")
    gen = torch.Generator().manual_seed(0)
    g = with_self_loops(Graph(torch.randint(0, 20, (2, 60), generator=gen), num_nodes=20))
    m = hcompile(models.transformer, backend="triton", in_dim=12, out_dim=8, heads=heads)
    plan = m.program.compiled_for(g).backward_plan
    paired = [s for s in plan.steps if s.body.op == "wgrad" and s.extra is not None]
    assert [s.extra.attr("body").shape for s in paired] == [(4 * heads * 8,)]
    assert not [s for s in plan.steps if s.body.op == "wsum"]
    _check(paired, g.to(dev), dev)
