"""Sampling into static-capacity buffers (``hector.loader.static``, ``NeighborLoader(static=
True)``): the batches have every property of the loader's (checked by the loader tests'
``check_batch``), on both ways of drawing (the kernel, under the interpreter here, and the
torch path); buffers of the capacities' shapes whatever the batch; short last batches
padded; no host read and no data-dependent shape while sampling; determinism; and on CUDA,
sampling captured once in a CUDA graph and replayed batch after batch."""
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hector import Graph
from hector.kernels.sampling import op as floyd_op
from hector.loader import NeighborLoader
from hector.loader.static import Capacities

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_neighbor_loader import check_batch, hetero_graph, random_graph  # noqa: E402

CASES = {
    "homogeneous": (random_graph, [3, 2], None),
    "hetero_one_type": (hetero_graph, [2, 2], "paper"),
    "hetero_mixed_seeds": (hetero_graph, [2, 3], None),
    "per_relation": (hetero_graph, [{"writes": 2, "cites": 0, "in": -1, "written_by": 3}, 2],
                     "paper"),
    "every_edge": (random_graph, [-1, 2], None),
}


@pytest.mark.parametrize("path", ["kernel", "torch"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_static_batches_have_every_property(case, path, monkeypatch):
    if path == "torch":
        monkeypatch.setattr(floyd_op, "MAX_WIDTH", 0)
    make, fanouts, inputs = CASES[case]
    graph = make()
    loader = NeighborLoader(graph, fanouts, input_nodes=inputs, batch_size=7, shuffle=True,
                            seed=4, static=True)
    seen = []
    for batch in loader:
        check_batch(graph, batch, fanouts)
        seen.append(batch.seed)
    seeds = torch.cat(seen)
    assert seeds.numel() == loader.seeds.numel()                 # the short batch included
    assert torch.equal(seeds.sort().values, loader.seeds.sort().values)


def test_buffers_have_the_capacities_shapes():
    graph = random_graph(num_nodes=200, num_edges=900)
    loader = NeighborLoader(graph, [4, 3], batch_size=16, seed=0, static=True)
    caps = loader.static.caps
    deg_max = int(torch.bincount(graph.dst.long()).max())
    assert caps == Capacities.of(16, [4, 3], 200, deg_max)
    assert caps.dst[1] == caps.nodes[0] and caps.edges == (16 * 4, caps.dst[1] * 3)
    assert caps.sinks == caps.dst
    for sb in loader.static_batches():
        for h, hop in enumerate(sb.hops):
            assert hop.ptr.shape == (caps.dst[h] + 1,)
            assert hop.src.shape == hop.rel.shape == (caps.edges[h],)
            assert hop.node_ids.shape == (caps.nodes[h],)
            assert hop.dst_local.shape == (caps.dst[h],)
        sizes = sb.sizes()
        assert all(e <= caps.edges[h] and n <= caps.nodes[h] for h, (_, e, n) in enumerate(sizes))
        # valid prefixes; padding edges index node 0, padding node slots spread over the
        # graph (slot % num_nodes: no hot row for a gradient summed back through them)
        for hop, (_, e, n) in zip(sb.hops, sizes):
            slots = torch.arange(hop.node_ids.numel())
            assert torch.equal(hop.node_ids[n:], slots[n:] % graph.num_nodes)
            assert bool((hop.src[e:] == 0).all())


def test_capacities_bound_a_fanout_by_the_largest_degree():
    caps = Capacities.of(10, [50, -1], num_nodes=1000, max_degree=6)
    assert caps.width == (6, 6)
    assert caps.sinks == (10, 80)                  # one per destination
    assert caps.nodes == (70 + 10, 560 + 80)
    assert Capacities.of(10, [[2, 3], 1], 30, 9).width == (5, 1)
    assert Capacities.of(10, [4], 30, 9).nodes == (30 + 10,)   # never more than the graph
    assert Capacities.of(10, [4, 4], 30, 9).nodes == (40, 40 + 40)   # but its destinations
    assert Capacities.of(10, [0], 30, 9).sinks == (0,)          # no edges, no sinks


class _HostReads(TorchDispatchMode):
    """Records ops that read device data back to the host or whose output size is data
    (``tolist`` of a CPU tensor reads without an op: the CUDA test below checks syncs)."""
    READS = ("_local_scalar_dense", "nonzero", "unique", "masked_select", "bincount",
             "repeat_interleave", "equal", "is_nonzero")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if any(r in name for r in self.READS):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("case", ["homogeneous", "per_relation", "hetero_mixed_seeds"])
def test_sampling_reads_nothing_back(case):
    make, fanouts, inputs = CASES[case]
    graph = make()
    loader = NeighborLoader(graph, fanouts, input_nodes=inputs, batch_size=7, shuffle=True,
                            seed=1, static=True)
    with _HostReads() as mode:
        batches = list(loader.static_batches())
    assert len(batches) == len(loader)
    assert mode.seen == []
    with _HostReads() as mode:         # the mode sees a read where there is one
        int(batches[-1].hops[0].num_nodes)
    assert mode.seen == ["_local_scalar_dense.default"]


def test_same_seed_same_batches_another_seed_others():
    graph = random_graph()

    def run(seed):
        loader = NeighborLoader(graph, [3, 2], batch_size=10, shuffle=True, seed=seed,
                                static=True)
        return [t for b in loader for blk in b.blocks for t in (blk.input_edge_index(),)]

    a, b, c = run(5), run(5), run(6)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not all(u.shape == v.shape and torch.equal(u, v) for u, v in zip(a, c))


def test_uniform_through_the_loader():
    """6000 destinations, each with in-edges from the same 10 sources, fan-out 3: each source
    is picked for 3/10 of them (binomial sd ~35, tolerance 5 sd)."""
    n = 6000
    dst = torch.arange(10, 10 + n).repeat_interleave(10)
    src = torch.arange(10).repeat(n)
    graph = Graph(torch.stack([src, dst]), num_nodes=10 + n)
    loader = NeighborLoader(graph, [3], input_nodes=torch.arange(10, 10 + n), batch_size=n,
                            seed=0, static=True)
    batch = next(iter(loader))
    block, ids = batch.blocks[0], batch.node_ids[0]
    picked = ids[block.input_edge_index()[0]]
    counts = torch.bincount(picked, minlength=10)[:10].float()
    assert float((counts - 1800).abs().max()) < 5 * (n * 0.3 * 0.7) ** 0.5


def test_buffers_beyond_the_free_memory_are_refused(monkeypatch):
    from hector.loader import static
    monkeypatch.setattr(static, "available_bytes", lambda device: 1 << 20)
    graph = random_graph(num_nodes=2000, num_edges=40000)
    with pytest.raises(ValueError, match="static=True: batches of 512 .* GiB"):
        NeighborLoader(graph, [-1, -1], batch_size=512, seed=0, static=True)
    NeighborLoader(graph, [2], batch_size=4, seed=0, static=True)     # small: fine


def test_bad_seed_buffer_is_refused():
    loader = NeighborLoader(random_graph(), [2], batch_size=5, seed=0, static=True)
    with pytest.raises(ValueError, match="batch_size=5"):
        loader.static.sample(torch.arange(4))
    with pytest.raises(RuntimeError, match="static=True"):
        next(NeighborLoader(random_graph(), [2], batch_size=5).static_batches())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_sampling_never_syncs():
    graph = hetero_graph().to("cuda")
    fanouts = CASES["per_relation"][1]
    loader = NeighborLoader(graph, fanouts, input_nodes="paper", batch_size=7, shuffle=True,
                            seed=1, static=True)
    list(loader.static_batches())                          # warm-up (compiles the kernel)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batches = list(loader.static_batches())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(batches) == len(loader)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_sampling_replays_from_one_cuda_graph():
    """Sampling captured once: each replay, with new seeds written into the captured buffer,
    gives a batch with every property, and new random draws."""
    graph = random_graph(num_nodes=300, num_edges=3000).to("cuda")
    fanouts = [4, 3]
    loader = NeighborLoader(graph, fanouts, batch_size=16, seed=0, static=True)
    seeds = torch.arange(16, device="cuda")
    count = torch.tensor(16, device="cuda")
    loader.static.sample(seeds, count)                     # warm-up (compiles the kernel)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = loader.static.sample(seeds, count)
    draws = []
    for step in range(4):
        seeds.copy_(torch.randperm(300, device="cuda")[:16])
        count.fill_(16 - step)                             # a shorter batch too
        g.replay()
        batch = out.to_batch(graph, loader.node_type_ptr, None)
        batch = type(batch)([b.to("cpu") for b in batch.blocks],
                            [i.cpu() for i in batch.node_ids], batch.seed.cpu(),
                            batch.node_type_ptr, None)
        assert batch.batch_size == 16 - step
        check_batch(graph.to("cpu"), batch, fanouts)
        draws.append(batch.blocks[-1].input_edge_index().clone())
    assert len({tuple(d.reshape(-1).tolist()) for d in draws}) == 4


def test_a_node_type_without_nodes_keeps_its_pointer():
    g = torch.Generator().manual_seed(0)
    counts = {"author": 20, "paper": 30, "none": 0}
    edges = {("author", "writes", "paper"): torch.stack([torch.randint(0, 20, (80,), generator=g),
                                                         torch.randint(0, 30, (80,), generator=g)]),
             ("paper", "cites", "paper"): torch.randint(0, 30, (2, 60), generator=g)}
    graph = Graph.from_hetero(edges, counts)
    loader = NeighborLoader(graph, [3, 2], input_nodes="paper", batch_size=6, seed=0,
                            static=True)
    for batch in loader:
        check_batch(graph, batch, [3, 2])
        assert all(len(b.dst_type_ptr) == 4 for b in batch.blocks)


@pytest.mark.parametrize("case", ["homogeneous", "hetero_mixed_seeds"])
def test_compiled_index_building_equals_the_eager_one(case):
    """``HECTOR_COMPILE_INDEX``' compiled functions (``torch.compile``, Inductor's CPU code
    here) give the eager ones' results: the sampler's relabelling, hop by hop, and the
    capacity blocks, field by field, on fitted capacities too."""
    import dataclasses
    from hector.loader import static
    make, fanout, seeds = CASES[case]
    graph = make()
    loader = NeighborLoader(graph, fanout, input_nodes=seeds, batch_size=8, seed=3,
                            static=True)
    sampler = loader.static
    sb = sampler.sample(*next(iter(loader.seed_batches())))
    caps, dst, n_dst = sb.caps, sb.seeds.long(), sb.num_seeds
    for h, hop in enumerate(sb.hops):
        # (the picks' global sources are not kept: the hop's local ones mapped back)
        src_global = torch.where(torch.arange(hop.src.numel()) < hop.ptr[-1],
                                 hop.node_ids[hop.src], 0)
        args = (sampler.index.node_type, sampler.num_nodes, sampler.num_types, caps.dst[h],
                caps.nodes[h] - caps.sinks[h], caps.nodes[h], dst, n_dst, hop.ptr, src_global)
        want = static.relabel(*args)
        assert torch.equal(want[0], hop.src) and torch.equal(want[1], hop.node_ids)
        got = static._compiled(static.relabel)(*args)
        for x, y in zip(got, want):
            assert torch.equal(x, y)
        dst, n_dst = hop.node_ids, hop.num_nodes
    compiled = static._compiled(static._build_blocks)
    for caps in (sb.caps, sb.caps.fitted(sb.sizes(), 1.25)):
        got, want = compiled(sb, graph, caps), static._build_blocks(sb, graph, caps)
        assert len(got) == len(want) == len(fanout)
        for a, b in zip(got, want):
            assert (a.num_nodes, a.num_edges, a.num_dst_nodes) == \
                (b.num_nodes, b.num_edges, b.num_dst_nodes)
            for name, value in vars(b).items():
                other = vars(a)[name]
                if isinstance(value, torch.Tensor):
                    assert torch.equal(other, value), name
                elif dataclasses.is_dataclass(value):     # CSRs, compact maps
                    for f in dataclasses.fields(value):
                        x, y = getattr(other, f.name), getattr(value, f.name)
                        assert not isinstance(y, torch.Tensor) or torch.equal(x, y), \
                            (name, f.name)
