"""Every mini-batch is a graph of a new shape.

* The compiled-plan cache of a ``Program`` keeps only the most recently used shapes (LRU), so
  training by mini-batches does not grow it without end.
* A new shape does not rerun the graph-independent stage (passes, lowering): it is put to
  the kept stage's cost-model questions and, answering them alike, runs on that stage.  The
  calls of the compiler are counted; and every layer gives on a run of blocks exactly what a
  fresh layer (empty caches: everything compiled for that block) gives.
"""
import pytest
import torch

from hector import Graph
from hector.compiler import models, pipeline, program as program_module
from hector.compiler.passes import compact
from hector.compiler.program import PLAN_CACHE_SIZE, Program
from hector.loader import NeighborLoader
from hector.nn import AGNNConv, GATConv, HGTConv, RGATConv, RGCNConv, TransformerConv
from hector.compiler.passes.common import GraphStats
from helpers import device_for, random_hetero


def blocks(n):
    g = torch.Generator().manual_seed(0)
    graph = Graph(torch.randint(0, 80, (2, 400), generator=g),
                  edge_type=torch.randint(0, 2, (400,), generator=g), num_relations=2)
    loader = NeighborLoader(graph, [3], batch_size=5, shuffle=True, seed=0)
    out = {}                 # the first block of each shape (the plan cache's key)
    for b in loader:
        out.setdefault(GraphStats.of(b.blocks[0]), b.blocks[0])
    assert len(out) >= n, "the test needs blocks of distinct shapes"
    return list(out.values())[:n]


def program(size=None):
    return Program(models.rgcn, in_dim=4, out_dim=3, num_bases=None, num_blocks=None,
                   aggr="mean", root_weight=True, bias=True, num_relations=2, backend="torch",
                   plan_cache_size=size)


def run(p, block):
    weights = {"weight": torch.randn(2, 4, 3), "root": torch.randn(4, 3), "bias": torch.randn(3)}
    return p(block, {"x": torch.randn(block.num_nodes, 4)}, weights)[0]


def test_plan_cache_keeps_the_most_recently_used_shapes():
    p = program(size=3)
    bs = blocks(5)
    for b in bs[:3]:
        run(p, b)
    assert len(p._cache) == 3
    run(p, bs[0])                       # a hit: bs[0] becomes the most recent
    run(p, bs[3])                       # a miss: evicts the least recent, bs[1]
    run(p, bs[4])                       # evicts bs[2]
    kept = {k[0] for k in p._cache}
    assert kept == {p.stats(b) for b in (bs[0], bs[3], bs[4])}
    out = run(p, bs[1])                 # an evicted shape compiles again and still runs
    assert out.shape == (bs[1].num_nodes, 3) and len(p._cache) == 3


def test_plan_cache_size_default_and_environment(monkeypatch):
    assert program().plan_cache_size == PLAN_CACHE_SIZE
    monkeypatch.setenv("HECTOR_PLAN_CACHE_SIZE", "5")
    assert program().plan_cache_size == 5
    monkeypatch.setenv("HECTOR_PLAN_CACHE_SIZE", "zero")
    with pytest.raises(ValueError, match="HECTOR_PLAN_CACHE_SIZE"):
        program()
    with pytest.raises(ValueError, match="plan_cache_size"):
        program(size=0)


# -- the graph-independent stage, shared across shapes -------------------------------------

@pytest.fixture
def compiler_calls(monkeypatch):
    """How often stage 1 (forward passes + lowering) and stage 2 (backward) ran."""
    calls = {"forward": 0, "backward": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(program_module, "compile_forward",
                        counting("forward", program_module.compile_forward))
    monkeypatch.setattr(pipeline, "_backward_stage",
                        counting("backward", pipeline._backward_stage))
    return calls


def train_step(p, block):
    weights = {"weight": torch.randn(2, 4, 3, requires_grad=True),
               "root": torch.randn(4, 3), "bias": torch.randn(3)}
    p(block, {"x": torch.randn(block.num_nodes, 4)}, weights)[0].square().sum().backward()


def test_a_new_shape_does_not_rerun_the_graph_independent_stage(compiler_calls):
    p = program()
    bs = blocks(4)
    for b in bs:
        train_step(p, b)
    assert len(p._cache) == 4                       # one entry per shape ...
    assert compiler_calls == {"forward": 1, "backward": 1}     # ... one compilation
    (stage,) = [s for _, s in p._stages.values()]
    assert all(e.forward is stage and e.backward is stage.backwards[0]
               for e in p._cache.values())


def _graph(src, dst, rel):
    return Graph(torch.tensor([src, dst]), edge_type=torch.tensor(rel), num_nodes=12,
                 num_relations=2)


def test_a_graph_answering_the_cost_models_otherwise_gets_its_own_stage(compiler_calls):
    """Compaction pays only when (src, relation) pairs repeat: a graph where none repeats
    answers that question otherwise and must not take the first graph's plans."""
    shared = _graph([0, 0, 0, 1, 1, 2], [3, 4, 5, 3, 4, 5], [0, 0, 0, 1, 1, 1])
    distinct = _graph([0, 1, 2, 3, 4, 5], [6, 6, 7, 7, 8, 8], [0, 0, 1, 1, 0, 1])
    assert distinct.compact_src.num_rows == distinct.num_edges > shared.compact_src.num_rows
    p = program()
    train_step(p, shared)
    train_step(p, distinct)
    assert compiler_calls == {"forward": 2, "backward": 2} and len(p._stages) == 2
    for g in (shared, distinct):       # each entry holds the plans compiled for its graph
        cp, own = p.compiled_for(g), p.compile_exact(g)
        assert cp.forward_plan == own.forward_plan and cp.backward_plan == own.backward_plan
    assert p.compiled_for(shared).forward_plan != p.compiled_for(distinct).forward_plan


def test_stage_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(program_module, "STAGE_CACHE_SIZE", 1)
    p = program()
    run(p, _graph([0, 0, 0, 1, 1, 2], [3, 4, 5, 3, 4, 5], [0, 0, 0, 1, 1, 1]))
    run(p, _graph([0, 1, 2, 3, 4, 5], [6, 6, 7, 7, 8, 8], [0, 0, 1, 1, 0, 1]))
    assert len(p._stages) == 1 and len(p._cache) == 2


def test_debug_mode_catches_a_pass_reading_the_graph_beside_its_questions(monkeypatch):
    """A pass whose rewrite depends on a row count without a ``Cheaper`` question would make
    a shared stage wrong; ``HECTOR_DEBUG=1`` compares every reuse with a fresh compilation."""
    real = compact.run

    def sneaky(outputs, stats, enabled=True):     # compacts only graphs with even E
        return real(outputs, stats, enabled and stats.num_edges % 2 == 0)
    monkeypatch.setattr(compact, "run", sneaky)
    monkeypatch.setenv("HECTOR_DEBUG", "1")
    even = _graph([0, 0, 0, 1, 1, 2], [3, 4, 5, 3, 4, 5], [0, 0, 0, 1, 1, 1])
    odd = _graph([0, 0, 0, 1, 1], [3, 4, 5, 3, 4], [0, 0, 0, 1, 1])
    p = program()
    run(p, even)
    with pytest.raises(AssertionError, match="outside its Cheaper questions"):
        run(p, odd)


# -- every layer on a run of blocks == a fresh layer on each block -------------------------

def _relational_blocks(n=3):
    g = torch.Generator().manual_seed(1)
    graph = Graph(torch.randint(0, 60, (2, 300), generator=g),
                  edge_type=torch.randint(0, 3, (300,), generator=g), num_relations=3)
    loader = NeighborLoader(graph, [4, 3], batch_size=6, shuffle=True, seed=1)
    return [b.blocks[0] for _, b in zip(range(n), loader)]


def _hetero_blocks(n=3):
    counts, eid, metadata = random_hetero(seed=0)
    graph = Graph.from_hetero(eid, counts)
    loader = NeighborLoader(graph, [3, 2], input_nodes=("paper", torch.arange(8)),
                            batch_size=3, shuffle=True, seed=0)
    return [b.blocks[0] for _, b in zip(range(n), loader)], metadata


def _layer(kind, metadata=None):
    torch.manual_seed(0)       # every call: the same parameters
    make = {"rgcn": lambda: RGCNConv(5, 4, 3, backend="torch"),
            "rgat": lambda: RGATConv(5, 4, 3, heads=2, backend="torch"),
            "hgt": lambda: HGTConv(5, 4, metadata, heads=2, backend="torch"),
            "gat": lambda: GATConv(5, 4, heads=2, backend="torch"),
            "agnn": lambda: AGNNConv(backend="torch"),
            "transformer": lambda: TransformerConv(5, 4, heads=2, beta=True, backend="torch")}
    return make[kind]()


def _forward_backward(kind, layer, block, metadata):
    x = torch.randn(block.num_nodes, 5, generator=torch.Generator().manual_seed(2))
    x = x.to(block.device).requires_grad_()
    if kind == "hgt":
        ptr = block.node_type_ptr.tolist()
        out = layer({t: x[ptr[i]:ptr[i + 1]] for i, t in enumerate(metadata[0])}, block)
        out = torch.cat([out[t] for t in metadata[0] if t in out])
    elif kind in ("rgcn", "rgat"):
        out = layer(x, block, block.input_edge_type())
    else:
        out = layer(x, block)
    out.square().sum().backward()
    return [out.detach(), x.grad] + [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("kind", ["rgcn", "rgat", "hgt", "gat", "agnn", "transformer"])
def test_layers_on_a_run_of_blocks_equal_fresh_layers(kind, compiler_calls):
    if kind == "hgt":
        bs, metadata = _hetero_blocks()
    else:
        bs, metadata = _relational_blocks(), None
    assert len({GraphStats.of(b) for b in bs}) == len(bs), "the test needs distinct shapes"
    layer = _layer(kind, metadata)
    for b in bs:
        layer.zero_grad()
        got = _forward_backward(kind, layer, b, metadata)
        want = _forward_backward(kind, _layer(kind, metadata), b, metadata)
        assert len(got) == len(want)
        for a, w in zip(got, want):
            assert (a is None) == (w is None)
            assert a is None or torch.equal(a, w)
    if kind in ("rgcn", "rgat", "hgt"):
        # The fresh layers compiled once per block; the run of blocks once per stage, and
        # fewer stages than blocks: some comparison above was between a shared stage and a
        # compilation of its own.
        stages = len(layer.program._stages)
        assert compiler_calls["forward"] == len(bs) + stages and stages < len(bs)


def test_attention_launch_tables_keep_only_live_graphs():
    """Relational attention on the Triton backend names each block (and each of its derived
    graphs and launch plans) to the custom op by an int handle; the handle tables must let
    a block's entries go with it, or they grow by a few entries per batch without end."""
    import gc
    from hector.kernels.attention import custom_ops
    device = device_for("triton")         # (the interpreter on a CPU)
    layer = _layer("rgat").to(device)
    layer.program.backend = "triton"
    gc.collect()
    def entries():
        return set(custom_ops._GRAPHS._objects.keys()), set(custom_ops._LAUNCHES._objects.keys())

    before = entries()
    for i in range(2):
        b = _relational_blocks(2)[i].to(device)       # (only this name holds the block)
        _forward_backward("rgat", layer, b, None)
        grown = entries()
        assert grown[0] - before[0] and grown[1] - before[1]   # the block's entries
        del b
        gc.collect()
        # None of the block's entries is left (an older test's entry may go too).
        now = entries()
        assert now[0] <= before[0] and now[1] <= before[1]
