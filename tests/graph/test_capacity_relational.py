"""Relational capacity blocks (``hector.graph.capacity`` with several relations and node
types): built with no host read, every field is the ordinary block's on the sampled part
(the padding edges take the last relation and sink destinations, so the real edges, compact
rows and node-type ranges are prefixes), segment pointers kept on the device as
``DeviceBounds`` of the capacities, padding compact rows on the last relation and the sinks
in turn, destination slots past the batch's on a sink."""
import sys
from pathlib import Path

import pytest
import torch

from hector.kernels.sizes import DeviceBounds
from hector.loader import NeighborLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loader"))
from test_static_sampler import CASES, _HostReads  # noqa: E402

RELATIONAL = ["hetero_one_type", "hetero_mixed_seeds", "per_relation"]


def _loader(case, seed=3):
    make, fanouts, inputs = CASES[case]
    graph = make()
    return graph, NeighborLoader(graph, fanouts, input_nodes=inputs, batch_size=7,
                                 shuffle=True, seed=seed, static=True)


def assert_fillers_on_sinks(m, cap):
    """The compact rows past the real ones name sinks, spread evenly: no node's row of a
    traversal from compact rows to nodes holds them all (one program would walk them)."""
    fillers = m.node[torch.arange(m.num_rows) >= int(m.rel_ptr[-1])].long()
    first_sink, n = cap.capacity.first_sink, cap.num_nodes
    assert bool((fillers >= first_sink).all()) and bool((fillers < n).all())
    if fillers.numel():
        most = int(torch.bincount(fillers, minlength=n).max())
        assert most == -(-fillers.numel() // (n - first_sink))


@pytest.mark.parametrize("case", RELATIONAL)
def test_sampled_part_is_the_ordinary_block(case):
    graph, loader = _loader(case)
    R, T = graph.num_relations, graph.num_node_types
    for sb in loader.static_batches():
        batch = sb.to_batch(graph, loader.node_type_ptr, graph.node_type_names)
        caps = sb.capacity_blocks(graph)
        assert len(caps) == len(batch.blocks)
        for cap, ref in zip(caps, batch.blocks):
            E, N = ref.num_edges, ref.num_nodes
            assert cap.num_relations == R and cap.num_node_types == T
            # canonical order (relation, destination): the padding edges (last relation,
            # sink destinations) come after every sampled one
            assert E > 0
            for a in ("src", "dst", "etype"):
                assert torch.equal(getattr(cap, a)[:E].long(), getattr(ref, a).long()), a
            assert bool((cap.etype[E:] == R - 1).all())
            assert torch.equal(cap.rel_ptr[:R].long(), ref.rel_ptr[:R].long())
            assert int(cap.rel_ptr[R]) == cap.num_edges
            # the CSR by destination over the sampled nodes
            assert torch.equal(cap.csr_in.ptr[:N + 1].long(), ref.csr_in.ptr.long())
            assert torch.equal(cap.csr_in.col[:E].long(), ref.csr_in.col.long())
            assert torch.equal(cap.csr_in.eid[:E].long(), ref.csr_in.eid.long())
            for m, r in ((cap.compact_src, ref.compact_src), (cap.compact_dst, ref.compact_dst)):
                k = r.num_rows
                assert m.num_rows == cap.num_edges                    # a capacity
                assert torch.equal(m.node[:k].long(), r.node.long())
                assert torch.equal(m.rel[:k].long(), r.rel.long())
                assert torch.equal(m.rel_ptr[:R].long(), r.rel_ptr[:R].long())
                assert torch.equal(m.edge_row[:E].long(), r.edge_row.long())
                assert_fillers_on_sinks(m, cap)
                past = torch.arange(m.num_rows) >= int(m.rel_ptr[-1])
                assert bool((m.rel[past] == R - 1).all())
            assert torch.equal(cap.node_type[:N].long(), ref.node_type.long())
            assert torch.equal(cap.node_type_ptr[:T].long(),
                               torch.tensor(ref.host_ptr["node"][:T]))
            assert int(cap.node_type_ptr[T]) == cap.num_nodes
            n_dst = ref.num_dst_nodes
            assert torch.equal(cap.dst_index[:n_dst].long(), ref.dst_index.long())
            bounds = cap.host_ptr
            assert all(isinstance(b, DeviceBounds) for b in bounds.values())
            assert (bounds["edge"].capacity, bounds["compact_src"].capacity,
                    bounds["node"].capacity) == (cap.num_edges, cap.num_edges, cap.num_nodes)


@pytest.mark.parametrize("case", RELATIONAL)
def test_every_batch_has_the_capacity_sizes(case):
    graph, loader = _loader(case)
    caps = loader.static.caps
    for sb in loader.static_batches():
        blocks = sb.capacity_blocks(graph)
        got = [(b.num_nodes, b.num_edges, b.num_dst_nodes, b.compact_src.num_rows)
               for b in blocks]
        assert got == [(caps.nodes[h], caps.edges[h], caps.dst[h], caps.edges[h])
                       for h in reversed(range(len(caps.dst)))]


@pytest.mark.parametrize("case", RELATIONAL)
def test_building_reads_nothing_back(case):
    graph, loader = _loader(case)
    batches = list(loader.static_batches())
    with _HostReads() as mode:
        for sb in batches:
            sb.capacity_blocks(graph)
    assert mode.seen == []


def test_destination_slots_past_the_batch_map_to_a_sink():
    graph, loader = _loader("hetero_mixed_seeds")
    for sb in loader.static_batches():
        for cap, hop in zip(sb.capacity_blocks(graph), reversed(sb.hops)):
            real = torch.arange(cap.num_dst_nodes) < hop.num_dst
            assert bool((cap.dst_index[~real] >= cap.capacity.first_sink).all())
            pads = cap.dst_index[~real]
            assert pads.unique().numel() == min(pads.numel(),
                                                cap.num_nodes - cap.capacity.first_sink)
            assert bool((cap.dst_index[real] < cap.capacity.first_sink).all())


def test_relational_block_needs_its_arrays():
    from hector.graph.capacity import capacity_block
    ptr, src = torch.tensor([0, 1]), torch.tensor([1])
    with pytest.raises(ValueError, match="needs rel, dst_node, type_ptr and dst_count"):
        capacity_block(ptr, src, 3, 2, 1, num_relations=2)
    with pytest.raises(ValueError, match="self_loops"):
        capacity_block(ptr, src, 3, 2, 1, True, rel=torch.tensor([0]),
                       dst_node=torch.tensor([0]), type_ptr=torch.tensor([0, 2]),
                       num_relations=2, dst_count=torch.tensor(1))
