"""``NeighborLoader`` and its sampler on the CPU: every property a sampled batch must have,
checked against the full graph (fan-out per destination and per relation, edges that exist,
no edge twice, every edge kept where the degree is within the fan-out, blocks chained,
node types kept), determinism, uniformity, data-parallel parts and bad input."""
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hector import Graph
from hector.loader import NeighborLoader, SamplingIndex, sample_hop, sampler


def random_graph(num_nodes=60, num_edges=400, num_relations=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, num_nodes, (2, num_edges), generator=g)
    et = torch.randint(0, num_relations, (num_edges,), generator=g)
    return Graph(ei, edge_type=et, num_nodes=num_nodes, num_relations=num_relations)


def hetero_graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    counts = {"author": 30, "paper": 40, "venue": 5}
    rels = {("author", "writes", "paper"): 120, ("paper", "cites", "paper"): 150,
            ("paper", "in", "venue"): 40, ("paper", "written_by", "author"): 120}
    eid = {(s, r, d): torch.stack([torch.randint(0, counts[s], (n,), generator=g),
                                   torch.randint(0, counts[d], (n,), generator=g)])
           for (s, r, d), n in rels.items()}
    return Graph.from_hetero(eid, counts)


def edge_counts(src, dst, rel):
    return Counter(zip(src.tolist(), dst.tolist(), rel.tolist()))


def check_batch(graph: Graph, batch, fanouts):
    """Every structural property of ``batch`` against ``graph``; ``fanouts`` per hop as
    given to the loader (hop 0 around the seeds)."""
    full = edge_counts(graph.src.long(), graph.dst.long(), graph.etype.long())
    blocks = batch.blocks
    assert len(blocks) == len(fanouts)
    for layer, (block, ids) in enumerate(zip(blocks, batch.node_ids)):
        fanout = fanouts[len(blocks) - 1 - layer]           # blocks are outermost first
        assert block.is_block and ids.numel() == block.num_nodes
        assert ids.unique().numel() == ids.numel()           # each node once per block
        # Node types kept, contiguous, and the block's type pointer right.
        types = graph.node_type.long()[ids]
        assert torch.equal(block.node_type.long(), types)
        assert bool((types[1:] >= types[:-1]).all())
        # Destinations: the next block's sources (or the seeds), in order.
        dst_ids = batch.node_ids[layer + 1] if layer + 1 < len(blocks) else batch.seed
        dst_local = (block.dst_index.long() if block.dst_index is not None
                     else torch.arange(block.num_dst_nodes))
        assert torch.equal(ids[dst_local], dst_ids)
        counts = torch.bincount(graph.node_type.long()[dst_ids], minlength=graph.num_node_types)
        assert block.dst_type_ptr == [0] + torch.cumsum(counts, 0).tolist()
        # Every sampled edge exists, none more often than in the graph, every edge enters a
        # destination.
        ei, et = block.input_edge_index(), block.input_edge_type()
        s, d = ids[ei[0]], ids[ei[1]]
        sampled = edge_counts(s, d, et)
        assert all(full[e] >= c for e, c in sampled.items()), "an edge not in the graph"
        assert bool(torch.isin(ei[1], dst_local).all())
        # Fan-out: min(degree, fanout) per destination (per relation for dict fan-outs);
        # no edge into a node that is no destination.
        n, r = graph.num_nodes, graph.num_relations
        full_deg = torch.bincount(graph.dst.long() * r + graph.etype.long(), minlength=n * r).view(n, r)
        got = torch.bincount(d * r + et, minlength=n * r).view(n, r)
        is_dst = torch.zeros(n, dtype=torch.bool)
        is_dst[dst_ids] = True
        assert int(got[~is_dst].sum()) == 0
        if isinstance(fanout, dict):
            limit = torch.tensor([fanout[k] for k in sorted(fanout, key=graph.relation_index)])
            want = torch.where(limit < 0, full_deg, torch.minimum(full_deg, limit))
            assert torch.equal(got[dst_ids], want[dst_ids]), layer
        else:
            deg = full_deg.sum(1)
            want = deg if fanout < 0 else deg.clamp(max=fanout)
            assert torch.equal(got.sum(1)[dst_ids], want[dst_ids]), layer


def edges_of(batch):
    return [(b.input_edge_index(), b.input_edge_type(), ids) for b, ids in
            zip(batch.blocks, batch.node_ids)]


@pytest.mark.parametrize("floyd", [True, False])
@pytest.mark.parametrize("fanouts", [[3, 2], [-1, 2], [1], [5, 3, 2], [0, 2]])
def test_homogeneous_batches_have_every_property(fanouts, floyd, monkeypatch):
    """Both ways of drawing one fan-out for all relations: Floyd's algorithm (the CPU's)
    and the candidates' sort (CUDA's, and the CPU's for large fan-outs)."""
    if not floyd:
        monkeypatch.setattr(sampler, "FLOYD_MAX_FANOUT", 0)
    graph = random_graph()
    loader = NeighborLoader(graph, fanouts, batch_size=7, shuffle=True, seed=3)
    seen = []
    for batch in loader:
        check_batch(graph, batch, fanouts)
        seen.append(batch.seed)
    seen = torch.cat(seen)
    assert torch.equal(seen.sort().values, torch.arange(graph.num_nodes))   # each seed once


@pytest.mark.parametrize("path", ["floyd", "packed", "perm"])
@pytest.mark.parametrize("all_in", [True, False])
def test_per_relation_fanouts(path, all_in, monkeypatch):
    """Per-relation fan-outs, 0 and (with ``all_in``) -1 among them, on every path: Floyd's
    algorithm over (destination, relation) groups (the CPU's, without -1), the sort with
    packed keys, and the permutation for too many groups."""
    if path != "floyd":
        monkeypatch.setattr(sampler, "FLOYD_MAX_FANOUT", 0)
    if path == "perm":
        monkeypatch.setattr(sampler, "_KEY_GROUPS", 0)
    graph = hetero_graph()
    fanouts = [{"writes": 2, "cites": 0, "in": -1 if all_in else 4, "written_by": 3}, 2]
    loader = NeighborLoader(graph, fanouts, input_nodes="paper", batch_size=8, seed=0)
    n = 0
    for batch in loader:
        check_batch(graph, batch, fanouts)
        assert bool((graph.node_type.long()[batch.seed] == 1).all())
        n += batch.batch_size
    assert n == 40


def test_hetero_input_nodes_and_feature_slicing():
    graph = hetero_graph(seed=1)
    ids = torch.tensor([3, 1, 4, 0, 5])
    loader = NeighborLoader(graph, [2, 2], input_nodes=("paper", ids), batch_size=5, seed=0)
    batch = next(iter(loader))
    check_batch(graph, batch, [2, 2])
    offset = graph.node_type_ptr.tolist()[1]
    assert torch.equal(batch.seed, ids + offset)
    x_dict = {"author": torch.randn(30, 2), "paper": torch.randn(40, 2), "venue": torch.randn(5, 2)}
    x_full = torch.cat([x_dict[t] for t in ("author", "paper", "venue")])
    sliced = batch.x_dict(x_dict)
    assert torch.equal(torch.cat([sliced[t] for t in ("author", "paper", "venue")]),
                       x_full[batch.n_id])


def test_mixed_type_seeds_come_out_grouped_by_type():
    graph = hetero_graph()
    seeds = torch.tensor([35, 2, 71, 40, 0])     # paper, author, venue, paper, author
    batch = next(iter(NeighborLoader(graph, [2], input_nodes=seeds, batch_size=5, seed=0)))
    check_batch(graph, batch, [2])
    assert sorted(batch.seed.tolist()) == sorted(seeds.tolist())


def test_deterministic_for_a_seed_and_different_for_another():
    graph = random_graph()

    def run(seed):
        loader = NeighborLoader(graph, [3, 2], batch_size=10, shuffle=True, seed=seed)
        return [edges_of(b) for b in loader]

    a, b, c = run(5), run(5), run(6)
    flat = lambda r: [t for batch in r for blk in batch for t in blk]   # noqa: E731
    assert all(torch.equal(u, v) for u, v in zip(flat(a), flat(b)))
    assert len(flat(a)) != len(flat(c)) or not all(
        u.shape == v.shape and torch.equal(u, v) for u, v in zip(flat(a), flat(c)))


@pytest.mark.parametrize("path", ["floyd", "packed", "perm"])
def test_sampling_is_uniform(path, monkeypatch):
    """One node with 10 incoming edges, fan-out 3, drawn 6000 times in one call: each edge
    is kept with probability 3/10 (binomial sd ~ 35, tolerance 5 sd).  Every way of drawing:
    Floyd's algorithm (the CPU's, one fan-out), and the sorts: (group, random key) packed in
    one int64, and the permutation for too many groups."""
    if path != "floyd":
        monkeypatch.setattr(sampler, "FLOYD_MAX_FANOUT", 0)
    if path == "perm":
        monkeypatch.setattr(sampler, "_KEY_GROUPS", 0)
    graph = Graph(torch.stack([torch.arange(1, 11), torch.zeros(10, dtype=torch.long)]))
    index = SamplingIndex.of(graph)
    gen = torch.Generator().manual_seed(0)
    src, pos, _ = sample_hop(index, torch.zeros(6000, dtype=torch.long), 3, gen)
    assert torch.equal(torch.bincount(pos), torch.full((6000,), 3))
    per_source = torch.bincount(src, minlength=11)[1:].float()
    assert float((per_source - 1800).abs().max()) < 5 * (6000 * 0.3 * 0.7) ** 0.5
    # and no source twice for one destination
    pairs = pos * 11 + src
    assert pairs.unique().numel() == pairs.numel()


def test_parts_are_disjoint_and_equally_long():
    graph = random_graph(num_nodes=50)
    parts = [NeighborLoader(graph, [2], batch_size=4, shuffle=True, seed=9, num_parts=3, part=p)
             for p in range(3)]
    assert [len(p) for p in parts] == [4, 4, 4]      # 50 // 3 = 16 seeds each, batches of 4
    seeds = [torch.cat([b.seed for b in p]) for p in parts]
    assert all(s.numel() == 16 for s in seeds)
    union = torch.cat(seeds)
    assert union.unique().numel() == 48


def test_block_through_layers_gives_num_dst_rows():
    from hector.nn import RGCNConv
    graph = random_graph()
    batch = next(iter(NeighborLoader(graph, [3, 2], batch_size=6, seed=0)))
    x = torch.randn(graph.num_nodes, 4)
    h = x[batch.n_id]
    convs = [RGCNConv(4, 4, 3, backend="torch"), RGCNConv(4, 2, 3, backend="torch")]
    for conv, block in zip(convs, batch.blocks):
        h = conv(h, block)
        assert h.shape[0] == block.num_dst_nodes
    assert h.shape == (6, 2)


@pytest.mark.parametrize("make", [random_graph, hetero_graph])
def test_blocks_equal_checked_builds_of_their_edges(make):
    """The loader builds blocks without the id checks (ids valid by construction): each
    equals a build of the same edges with every check, field by field."""
    graph = make()
    seeds = graph.nodes_of_type("paper") if graph.node_type_names else None
    for batch in NeighborLoader(graph, [4, 3], input_nodes=seeds, batch_size=7, seed=1):
        for block in batch.blocks:
            checked = Graph(block.input_edge_index(), edge_type=block.input_edge_type(),
                            num_nodes=block.num_nodes, num_relations=block.num_relations,
                            node_type=block.node_type.long(),
                            num_node_types=block.num_node_types,
                            node_type_names=block.node_type_names,
                            relation_names=block.relation_names)
            for name in ("src", "dst", "etype", "edge_perm", "rel_ptr", "node_type",
                         "node_type_ptr"):
                assert torch.equal(getattr(block, name), getattr(checked, name)), name
            for name in ("compact_src", "compact_dst"):
                for part in ("node", "rel", "rel_ptr", "edge_row"):
                    assert torch.equal(getattr(getattr(block, name), part),
                                       getattr(getattr(checked, name), part)), (name, part)
            assert block.host_ptr == checked.host_ptr
            assert (block.in_degree, block.out_degree) == (checked.in_degree, checked.out_degree)


def test_bad_input_names_the_argument():
    graph = random_graph()
    hetero = hetero_graph()
    with pytest.raises(TypeError, match="graph"):
        NeighborLoader(graph.input_edge_index(), [2])
    with pytest.raises(TypeError, match="num_neighbors"):
        NeighborLoader(graph, 2)
    with pytest.raises(ValueError, match=r"num_neighbors\[1\]"):
        NeighborLoader(graph, [2, -2])
    with pytest.raises(ValueError, match="batch_size"):
        NeighborLoader(graph, [2], batch_size=0)
    with pytest.raises(ValueError, match="input_nodes"):
        NeighborLoader(graph, [2], input_nodes=torch.tensor([0, 60]))
    with pytest.raises(ValueError, match=r"input_nodes\[1\]"):
        NeighborLoader(hetero, [2], input_nodes=("venue", torch.tensor([5])))
    with pytest.raises(ValueError, match="duplicate"):
        NeighborLoader(graph, [2], input_nodes=torch.tensor([3, 1, 3]))
    with pytest.raises(ValueError, match="unknown node type"):
        NeighborLoader(hetero, [2], input_nodes="institution")
    with pytest.raises(ValueError, match="no fan-out for relation"):
        NeighborLoader(hetero, [{"writes": 2}])
    with pytest.raises(ValueError, match="part"):
        NeighborLoader(graph, [2], num_parts=2, part=2)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2 ** 16), hops=st.lists(st.integers(-1, 8), min_size=1, max_size=3),
       per_relation=st.booleans(), batch_size=st.integers(1, 300), shuffle=st.booleans())
def test_property_on_a_1000_node_graph(seed, hops, per_relation, batch_size, shuffle):
    graph = random_graph(num_nodes=1000, num_edges=6000, num_relations=3, seed=seed)
    fanouts = [{r: max(f - r, -1) for r in range(3)} if per_relation else f for f in hops]
    loader = NeighborLoader(graph, fanouts, batch_size=batch_size, shuffle=shuffle, seed=seed)
    for i, batch in enumerate(loader):
        if i == 2:
            break
        check_batch(graph, batch, fanouts)


@pytest.mark.parametrize("fanouts", [[3, 2], [{"writes": 2, "cites": 1, "in": 0,
                                                "written_by": 3}, 2], [-1, 1], [50]])
def test_max_nodes_bounds_every_batch(fanouts):
    graph = hetero_graph()
    loader = NeighborLoader(graph, fanouts, batch_size=3, shuffle=True, seed=2)
    sizes = [batch.n_id.numel() for batch in loader]
    assert max(sizes) <= loader.max_nodes <= graph.num_nodes
    if fanouts == [3, 2]:
        assert loader.max_nodes == 3 * 4 * 3
    if fanouts[0] == -1:
        assert loader.max_nodes == graph.num_nodes


@pytest.mark.parametrize("hetero", [False, True])
def test_a_batch_reads_the_device_once_per_hop_and_once_per_block(hetero):
    """With one fan-out for all relations, a hop's one read sizes its candidates and counts
    the edges it keeps (no nonzero for the kept ones); seeds of one node type need no read
    of their type pointers.  Per batch of two hops: two sampler reads, two block builds and
    the relabelling's two ``unique`` (nine device syncs before on CUDA)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from helpers import aten_ops, host_reads
    graph = hetero_graph() if hetero else random_graph()
    seeds = "paper" if hetero else None
    loader = NeighborLoader(graph, [3, 2], input_nodes=seeds, batch_size=8, shuffle=True,
                            seed=0)
    it = iter(loader)
    with host_reads(functions=("unique",)) as seen:
        batch, ops = aten_ops(lambda: next(it), nested=True)
    assert ops["aten::nonzero"] == 0     # (inside a boolean mask's index too)
    where = Counter(c.split("/hector/")[-1].split(":")[0] for _, _, c in seen)
    assert where == {"loader/sampler.py": 4, "graph/graph.py": 2}, where   # 2 of them unique
    check_batch(graph, batch, [3, 2])


def test_floyd_draws_every_k_subset_equally_often():
    """Floyd's algorithm, the CPU's path: a destination with 5 candidates and fan-out 2 gets
    each of the 10 pairs with probability 1/10 (20000 draws: sd ~42, tolerance 5 sd), its
    picks in CSR order; rows within the fan-out keep every edge, in order."""
    graph = Graph(torch.stack([torch.tensor([1, 2, 3, 4, 5, 6, 7]),
                               torch.tensor([0, 0, 0, 0, 0, 8, 8])]), num_nodes=9)
    index = SamplingIndex.of(graph)
    dst = torch.cat([torch.zeros(20000, dtype=torch.long), torch.tensor([8])])
    src, pos, _ = sample_hop(index, dst, 2, torch.Generator().manual_seed(1))
    pairs = src[:-2].view(-1, 2)
    assert bool((pairs[:, 0] < pairs[:, 1]).all())            # CSR order, no repeat
    counts = Counter(map(tuple, pairs.tolist()))
    assert len(counts) == 10
    assert max(abs(c - 2000) for c in counts.values()) < 5 * (20000 * 0.1 * 0.9) ** 0.5
    assert src[-2:].tolist() == [6, 7] and pos[-2:].tolist() == [20000, 20000]


def test_floyd_per_relation_groups_are_uniform_and_in_csr_order():
    """Per-relation fan-outs by Floyd's algorithm: a destination with 4 edges of relation 0
    and 3 of relation 1, fan-outs (2, 1), drawn 12000 times: relation 0's 6 pairs and
    relation 1's 3 edges each equally often (5 sd), picks in CSR order, per relation."""
    src = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    graph = Graph(torch.stack([src, torch.zeros(7, dtype=torch.long)]),
                  edge_type=torch.tensor([0, 0, 0, 0, 1, 1, 1]), num_nodes=8, num_relations=2)
    index = SamplingIndex.of(graph)
    got, pos, rel = sample_hop(index, torch.zeros(12000, dtype=torch.long),
                               torch.tensor([2, 1]), torch.Generator().manual_seed(4))
    assert torch.equal(torch.bincount(pos), torch.full((12000,), 3))
    rows = got.view(-1, 3)
    assert torch.equal(rel.view(-1, 3), torch.tensor([[0, 0, 1]]).expand(12000, 3))
    assert bool((rows[:, 0] < rows[:, 1]).all())
    for picks, cases, p in ((map(tuple, rows[:, :2].tolist()), 6, 1 / 6),
                            (rows[:, 2].tolist(), 3, 1 / 3)):
        counts = Counter(picks)
        assert len(counts) == cases
        sd = (12000 * p * (1 - p)) ** 0.5
        assert max(abs(c - 12000 * p) for c in counts.values()) < 5 * sd
