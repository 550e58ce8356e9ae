"""Blocks twinned into buffers of their own (``hector.graph.twin``), and capacity blocks
built for a batch that smaller capacities do not hold: what an overlapped captured step
(``CapturedStep(overlap=True)``) relies on, checked on the CPU."""
import sys
from pathlib import Path

import pytest
import torch

from hector.graph.twin import twin

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
