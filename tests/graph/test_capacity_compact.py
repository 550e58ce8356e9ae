"""Capacity blocks of one relation and node type (``hector.graph.capacity``) build their
compact maps on first need (``with_compact_maps``, which the compiler's graph statistics and
index call): none at build, then maps of ``edges`` rows each (a bound) with no host read,
the ordinary block's on the sampled part, padding rows on the sinks in turn, segment pointers
kept on the device as ``DeviceBounds``."""
import sys
from pathlib import Path

import torch

from hector.compiler.passes.common import GraphStats
from hector.graph.capacity import with_compact_maps
from hector.graph import with_self_loops
from hector.kernels.sizes import DeviceBounds
from hector.loader import NeighborLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loader"))
from test_neighbor_loader import random_graph  # noqa: E402
from test_static_sampler import _HostReads  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_capacity_relational import assert_fillers_on_sinks  # noqa: E402


def test_compact_maps_on_first_need_are_the_ordinary_blocks():
    graph = random_graph(num_relations=1)
    loader = NeighborLoader(graph, [3, 2], batch_size=7, shuffle=True, seed=3, static=True)
    for sb in loader.static_batches():
        batch = sb.to_batch(graph, loader.node_type_ptr, None)
        caps = sb.capacity_blocks(graph)
        assert all(c.compact_src is None and c.compact_dst is None for c in caps)
        twins = [with_self_loops(c) for c in caps]
        with _HostReads() as mode:
            for c in caps + twins:
                assert with_compact_maps(c) is c
        assert mode.seen == []
        for cap, ref in zip(caps, batch.blocks):
            E = ref.num_edges
            assert torch.equal(cap.src[:E].long(), ref.src.long())
            for m, r in ((cap.compact_src, ref.compact_src), (cap.compact_dst, ref.compact_dst)):
                k = r.num_rows
                assert m.num_rows == cap.num_edges                    # a capacity
                assert torch.equal(m.node[:k].long(), r.node.long())
                # (the sinks' padding edges have rows of their own after the sampled ones)
                assert k <= int(m.rel_ptr[-1]) <= m.num_rows and not bool(m.rel.any())
                assert torch.equal(m.edge_row[:E].long(), r.edge_row.long())
                assert_fillers_on_sinks(m, cap)
        for c in caps + twins:
            for kind in ("compact_src", "compact_dst"):
                b = c.host_ptr[kind]
                assert isinstance(b, DeviceBounds) and b.capacity == c.num_edges
            stats = GraphStats.of(c, typed=False)
            assert (stats.compact_src_rows, stats.compact_dst_rows) == (c.num_edges,) * 2


def test_attention_programs_on_capacity_blocks_build_no_compact_maps():
    """The graph statistics read a fresh block's compact rows as their bound, and GAT's and
    AGNN's programs (which read no compact rows) run on the blocks without building the maps
    (two sorts and some forty kernels a batch); the output is the ordinary block's."""
    from hector.nn import AGNNConv, GATConv
    graph = random_graph(num_relations=1)
    loader = NeighborLoader(graph, [3, 2], batch_size=7, shuffle=True, seed=3, static=True)
    sb = next(iter(loader.static_batches()))
    batch = sb.to_batch(graph, loader.node_type_ptr, None)
    caps = sb.capacity_blocks(graph)
    stats = GraphStats.of(caps[0], typed=False)
    assert (stats.compact_src_rows, stats.compact_dst_rows) == (caps[0].num_edges,) * 2
    assert caps[0].compact_src is None
    torch.manual_seed(0)
    for layer in (GATConv(5, 3, heads=2, backend="torch"), AGNNConv(backend="torch")):
        for cap, ref in zip(caps, batch.blocks):
            x = torch.randn(cap.num_nodes, 5, requires_grad=True)
            out = layer(x, cap)
            out.sum().backward()
            assert cap.compact_src is None and cap.compact_dst is None
            want = layer(x[:ref.num_nodes], ref)
            n = ref.num_dst_nodes
            assert torch.allclose(out[:n], want[:n], atol=1e-5)
