"""``NeighborLoader(sample_stream=...)``: sampling on a CUDA stream of its own hands over
the same batches as sampling on the consumer's stream, with every tensor of a batch found
(so each is marked as used by the consumer's stream), and the option is checked."""
import pytest
import torch

from hector import Graph
from hector.loader import NeighborLoader
from hector.loader.side_stream import tensors_of


def hetero_graph(device="cpu"):
    g = torch.Generator().manual_seed(0)
    counts = {"author": 30, "paper": 40}
    rels = {("author", "writes", "paper"): 120, ("paper", "cites", "paper"): 150,
            ("paper", "written_by", "author"): 120}
    eid = {(s, r, d): torch.stack([torch.randint(0, counts[s], (n,), generator=g),
                                   torch.randint(0, counts[d], (n,), generator=g)])
           for (s, r, d), n in rels.items()}
    return Graph.from_hetero(eid, counts).to(device)


def test_tensors_of_a_batch_reaches_its_ids_and_every_block_structure():
    batch = next(iter(NeighborLoader(hetero_graph(), [3, 2], batch_size=5, seed=0)))
    found = {id(t) for t in tensors_of(batch)}
    assert id(batch.seed) in found and all(id(n) in found for n in batch.node_ids)
    for block in batch.blocks:
        # the block's own index tensors: edges, relations, node types, CSR by destination
        for t in (block.src, block.dst, block.etype, block.node_type, block.csr_in.ptr,
                  block.csr_in.col):
            assert id(t) in found
    assert len(found) == len(list(tensors_of(batch)))     # each tensor once


def test_bad_sample_stream_is_named():
    graph = hetero_graph()
    with pytest.raises(TypeError, match="sample_stream"):
        NeighborLoader(graph, [2], sample_stream="yes")
    with pytest.raises(ValueError, match="sample_stream=True needs a CUDA graph"):
        NeighborLoader(graph, [2], sample_stream=True)
    assert NeighborLoader(graph, [2]).stream is None          # CPU: no side stream


@pytest.mark.skipif(not torch.cuda.is_available(), reason="side streams need a GPU")
def test_side_stream_batches_equal_the_consumer_stream_ones():
    graph = hetero_graph("cuda")
    side = NeighborLoader(graph, [3, 2], batch_size=6, shuffle=True, seed=4)
    plain = NeighborLoader(graph, [3, 2], batch_size=6, shuffle=True, seed=4,
                           sample_stream=False)
    assert side.stream is not None and plain.stream is None
    for _ in range(2):                                         # two epochs
        got, want = list(side), list(plain)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert torch.equal(a.seed, b.seed)
            assert all(torch.equal(x, y) for x, y in zip(a.node_ids, b.node_ids))
            for ba, bb in zip(a.blocks, b.blocks):
                assert torch.equal(ba.input_edge_index(), bb.input_edge_index())
                assert torch.equal(ba.input_edge_type(), bb.input_edge_type())
