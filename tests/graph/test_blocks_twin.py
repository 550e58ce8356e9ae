"""Blocks twinned into buffers of their own (``hector.graph.twin``), and capacity blocks
built for a batch that smaller capacities do not hold: what an overlapped captured step
(``CapturedStep(overlap=True)``) relies on, checked on the CPU."""
import sys
from pathlib import Path

import pytest
import torch

from hector.graph import with_self_loops
from hector.graph.twin import prederive, twin

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loader"))
from test_static_sampler import CASES  # noqa: E402
from hector.loader import NeighborLoader  # noqa: E402


def _batches(case, seed=3):
    make, fanouts, inputs = CASES[case]
    graph = make()
    loader = NeighborLoader(graph, fanouts, input_nodes=inputs, batch_size=7, shuffle=True,
                            seed=seed, static=True)
    return graph, list(loader.static_batches())


def _tensors(obj, seen=None):
    """Every tensor ``obj`` reaches (graphs' fields, records, containers), by identity."""
    seen = {} if seen is None else seen
    if isinstance(obj, torch.Tensor):
        seen[id(obj)] = obj
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for k, v in vars(obj).items():
            if k not in ("_derived", "_device_copies") and id(v) not in seen:
                _tensors(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tensors(v, seen)
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensors(v, seen)
    return seen


@pytest.mark.parametrize("case", ["homogeneous", "hetero_mixed_seeds", "per_relation"])
def test_a_twin_shares_no_memory_and_its_refill_copies_every_tensor(case):
    graph, batches = _batches(case)
    sb = batches[0]
    blocks = sb.capacity_blocks(graph)
    (copy, n_id), refill = twin((blocks, sb.n_id))
    ours, theirs = _tensors((copy, n_id)), _tensors((blocks, sb.n_id))
    assert len(ours) == len(theirs) == refill.pairs
    storages = {t.untyped_storage().data_ptr() for t in theirs.values() if t.numel()}
    assert not any(t.untyped_storage().data_ptr() in storages for t in ours.values()
                   if t.numel())
    for t in ours.values():
        t.fill_(-7) if t.dtype != torch.bool else t.fill_(True)
    refill()
    for c, b in zip(copy, blocks):
        assert set(vars(c)) == set(vars(b))
        for k in ("src", "dst", "etype", "edge_perm", "node_type", "rel_ptr"):
            assert torch.equal(getattr(c, k), getattr(b, k)), k
        assert torch.equal(c.csr_in.col, b.csr_in.col)
        if b.compact_src is not None:
            assert torch.equal(c.compact_src.edge_row, b.compact_src.edge_row)
        assert c.capacity.src is not b.capacity.src
        assert torch.equal(c.capacity.src, b.capacity.src)
    assert torch.equal(n_id, sb.n_id)


def _same_tensors(a, b):
    """``a`` and ``b`` reach equal tensors in the same places (their walks zipped)."""
    ta, tb = list(_tensors(a).values()), list(_tensors(b).values())
    assert len(ta) == len(tb)
    for x, y in zip(ta, tb):
        assert x.dtype == y.dtype and torch.equal(x, y)


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the aten ops run inside it."""
    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _one_relation_graph(num_nodes=60, num_edges=400):
    from hector import Graph
    g = torch.Generator().manual_seed(1)
    return Graph(torch.randint(0, num_nodes, (2, num_edges), generator=g), num_nodes=num_nodes)


def _key(case, block):
    """The derivation a layer makes on ``case``'s first block: GAT's self loops on a block
    of one relation, HGT's one-type view on a relational one."""
    if case == "one_relation":
        return "self_loops"
    return ("one_node_type", "n", tuple(("n", f"r{r}", "n") for r in range(block.num_relations)))


@pytest.mark.parametrize("case", ["one_relation", "per_relation"])
def test_prederived_graphs_match_their_derivation_and_are_twinned(case):
    """A batch's blocks given the derivations an earlier batch's blocks hold: equal to
    deriving them on demand, twinned with the blocks, refilled by the twin's copies, and
    found by the step without a kernel."""
    if case == "one_relation":
        graph = _one_relation_graph()
        loader = NeighborLoader(graph, [3, 2], batch_size=7, shuffle=True, seed=3,
                                static=True)
        batches = list(loader.static_batches())
    else:
        graph, batches = _batches(case)
    earlier = batches[0].capacity_blocks(graph)
    key = _key(case, earlier[0])
    earlier[0].derive(key)                   # (the other place, bare, stays bare)
    blocks = batches[1].capacity_blocks(graph)
    prederive(blocks, like=earlier)
    assert key in blocks[0]._derived and key not in blocks[1]._derived
    on_demand = batches[1].capacity_blocks(graph)[0].derive(key)
    _same_tensors(blocks[0]._derived[key], on_demand)

    copy, refill = twin(blocks)
    made, original = copy[0]._derived[key], blocks[0]._derived[key]
    assert made is not original and type(made) is type(original)
    storages = {t.untyped_storage().data_ptr() for t in _tensors(original).values()
                if t.numel()}
    assert not any(t.untyped_storage().data_ptr() in storages
                   for t in _tensors(made).values() if t.numel())
    for t in _tensors(made).values():
        t.fill_(-7) if t.dtype != torch.bool else t.fill_(True)
    refill()
    _same_tensors(made, on_demand)
    with _Ops() as ops:
        assert copy[0].derive(key) is made
    assert ops.count == 0
    if case == "one_relation":
        assert with_self_loops(copy[0]) is made and made.capacity.self_loops


def test_a_twin_refuses_an_object_it_cannot_copy():
    with pytest.raises(TypeError, match="twin"):
        twin([torch.zeros(2), object()])


@pytest.mark.parametrize("case", ["homogeneous", "per_relation"])
def test_blocks_of_capacities_too_small_for_the_batch_build_in_bounds(case):
    """The overlapped step builds a batch's blocks before it reads the batch's sizes: on
    capacities fitted to a smaller batch, the build stays in bounds (the CPU raises on an
    index out of range) and the sizes say the blocks are to be dropped."""
    graph, batches = _batches(case)
    sizes = [sb.sizes() for sb in batches]
    small = min(range(len(sizes)), key=lambda i: sum(e for _, e, _ in sizes[i]))
    caps = batches[0].caps.fitted(sizes[small], 1.0)
    over = [sb for sb, sz in zip(batches, sizes) if not caps.holds(sz)]
    assert over, "every batch fits the smallest one's capacities"
    for sb in over:
        blocks = sb.capacity_blocks(graph, caps)
        for b, h in zip(blocks, reversed(range(len(caps.nodes)))):
            assert b.num_nodes == caps.nodes[h]
            assert int(b.src.max()) < b.num_nodes and int(b.dst.max()) < b.num_nodes
