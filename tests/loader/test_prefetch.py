"""``NeighborLoader(prefetch=k)``: the batches of ``prefetch=0``, built by a thread that stops
when the iteration ends, fails or is dropped; loader blocks take the build's sorted-input path
and equal a general build of the same edges."""
import gc
import threading
import time

import pytest
import torch

from hector import Graph
from hector.loader import NeighborLoader
from hector.loader.prefetch import THREAD_NAME, prefetched

from test_neighbor_loader import hetero_graph, random_graph


def producers():
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def wait_for_no_producer(seconds=5.0):
    end = time.monotonic() + seconds
    while producers() and time.monotonic() < end:
        time.sleep(0.01)
    return producers()


def same_block(a: Graph, b: Graph):
    for name in ("src", "dst", "etype", "edge_perm", "node_type", "rel_ptr"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert (a.num_dst_nodes, a.dst_type_ptr, a.host_ptr) == (b.num_dst_nodes, b.dst_type_ptr,
                                                             b.host_ptr)
    assert (a.dst_index is None) == (b.dst_index is None)
    if a.dst_index is not None:
        assert torch.equal(a.dst_index, b.dst_index)


@pytest.mark.parametrize("make", [random_graph, hetero_graph], ids=["homo", "hetero"])
@pytest.mark.parametrize("depth", [1, 3])
def test_prefetched_batches_equal_the_plain_ones(make, depth):
    graph = make()
    seeds = "paper" if graph.num_node_types > 1 else None
    kw = dict(input_nodes=seeds, batch_size=7, shuffle=True, seed=11)
    want = list(NeighborLoader(graph, [4, 3], **kw))
    got = list(NeighborLoader(graph, [4, 3], prefetch=depth, **kw))
    assert len(got) == len(want) > 1
    for a, b in zip(got, want):
        assert torch.equal(a.seed, b.seed)
        for x, y in zip(a.node_ids, b.node_ids):
            assert torch.equal(x, y)
        for x, y in zip(a.blocks, b.blocks):
            same_block(x, y)
    assert wait_for_no_producer() == []


def test_second_epoch_with_prefetch_equals_second_epoch_without():
    graph = random_graph()
    kw = dict(batch_size=9, shuffle=True, seed=2)
    a, b = NeighborLoader(graph, [3], **kw), NeighborLoader(graph, [3], prefetch=2, **kw)
    for _ in range(2):
        for x, y in zip(list(a), list(b)):
            assert torch.equal(x.n_id, y.n_id) and torch.equal(x.blocks[0].src, y.blocks[0].src)


def test_dropping_the_iterator_stops_the_thread():
    loader = NeighborLoader(random_graph(), [5, 5], batch_size=2, seed=0, prefetch=2)
    it = iter(loader)
    next(it)
    assert producers()                  # running, two batches ahead at most
    del it
    gc.collect()
    assert wait_for_no_producer() == []


def test_an_error_in_the_producer_reaches_the_consumer_and_stops_it():
    def broken():
        yield 1
        raise RuntimeError("sampling failed")
    it = prefetched(broken(), 2)
    assert next(it) == 1
    with pytest.raises(RuntimeError, match="sampling failed"):
        next(it)
    assert wait_for_no_producer() == []
    with pytest.raises(ValueError, match="depth"):
        next(prefetched(iter([]), 0))
    with pytest.raises(ValueError, match="prefetch"):
        NeighborLoader(random_graph(), [2], prefetch=-1)


@pytest.mark.parametrize("make", [random_graph, hetero_graph], ids=["homo", "hetero"])
def test_loader_blocks_equal_a_general_build_of_their_edges(make):
    """Blocks are built with ``dst_sorted`` (the sampler's order); the general build of the
    same edges, in the same input order, gives the same graph."""
    graph = make()
    seeds = "paper" if graph.num_node_types > 1 else None
    for batch in NeighborLoader(graph, [4, -1], input_nodes=seeds, batch_size=8, seed=1):
        for block in batch.blocks:
            general = Graph(block.input_edge_index(), edge_type=block.input_edge_type(),
                            num_nodes=block.num_nodes, num_relations=block.num_relations,
                            node_type=block.node_type.long(),
                            num_node_types=block.num_node_types)
            for name in ("src", "dst", "etype", "edge_perm", "rel_ptr", "node_type_ptr"):
                assert torch.equal(getattr(block, name), getattr(general, name)), name
            for name in ("csr_in", "csr_out", "compact_src", "compact_dst"):
                for field, a in vars(getattr(block, name)).items():
                    assert torch.equal(a, getattr(getattr(general, name), field)), name
