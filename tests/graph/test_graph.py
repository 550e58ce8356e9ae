"""Every structure of ``Graph`` against a naive Python reference, on random graphs."""
from collections import Counter, defaultdict

import pytest
import torch
from hypothesis import given, settings, strategies as st

from hector import Graph
from hector.graph import graph_of


@st.composite
def random_graphs(draw, max_nodes=12, max_edges=40, max_relations=4):
    n = draw(st.integers(0, max_nodes))
    r = draw(st.integers(1, max_relations))
    e = draw(st.integers(0, max_edges)) if n > 0 else 0
    src = draw(st.lists(st.integers(0, max(n - 1, 0)), min_size=e, max_size=e))
    dst = draw(st.lists(st.integers(0, max(n - 1, 0)), min_size=e, max_size=e))
    typ = draw(st.lists(st.integers(0, r - 1), min_size=e, max_size=e))
    return n, r, src, dst, typ


def build(n, r, src, dst, typ):
    ei = torch.tensor([src, dst], dtype=torch.int64).reshape(2, -1)
    return Graph(ei, edge_type=torch.tensor(typ, dtype=torch.int64), num_nodes=n, num_relations=r)


def reference(n, r, src, dst, typ):
    """What each structure must hold, computed edge by edge."""
    order = sorted(range(len(src)), key=lambda i: (typ[i], dst[i], i))
    in_rows, out_rows = defaultdict(list), defaultdict(list)
    for pos, i in enumerate(order):
        in_rows[dst[i]].append((src[i], pos))
        out_rows[src[i]].append((dst[i], pos))
    return order, in_rows, out_rows


@settings(max_examples=150, deadline=None)
@given(random_graphs())
def test_structures_match_reference(g_args):
    n, r, src, dst, typ = g_args
    g = build(*g_args)
    order, in_rows, out_rows = reference(*g_args)
    assert (g.num_nodes, g.num_edges, g.num_relations) == (n, len(src), r)
    assert g.edge_perm.tolist() == order
    assert g.src.tolist() == [src[i] for i in order]
    assert g.dst.tolist() == [dst[i] for i in order]
    assert g.etype.tolist() == [typ[i] for i in order]
    counts = Counter(typ)
    assert g.rel_ptr.tolist() == [sum(counts[t] for t in range(k)) for k in range(r + 1)]

    for csr, rows in ((g.csr_in, in_rows), (g.csr_out, out_rows)):
        assert csr.ptr[0] == 0 and csr.ptr[-1] == len(src) and csr.ptr.numel() == n + 1
        for v in range(n):
            lo, hi = int(csr.ptr[v]), int(csr.ptr[v + 1])
            got = list(zip(csr.col[lo:hi].tolist(), csr.eid[lo:hi].tolist()))
            assert got == rows[v]      # same entries, in canonical (relation, input) order

    for m, ends in ((g.compact_src, src), (g.compact_dst, dst)):
        pairs = sorted({(typ[i], ends[i]) for i in range(len(src))})
        assert list(zip(m.rel.tolist(), m.node.tolist())) == pairs
        assert m.rel_ptr.tolist() == [sum(1 for p in pairs if p[0] < k) for k in range(r + 1)]
        for pos, i in enumerate(order):       # each edge's row holds its own (relation, node)
            row = int(m.edge_row[pos])
            assert (int(m.rel[row]), int(m.node[row])) == (typ[i], ends[i])

    indeg = [len(in_rows[v]) for v in range(n)]
    if n:
        assert g.in_degree.max == max(indeg)
        assert g.in_degree.mean == pytest.approx(sum(indeg) / n)
        assert g.in_degree.num_isolated == sum(d == 0 for d in indeg)
        assert g.out_degree.max == max(len(out_rows[v]) for v in range(n))
    assert torch.equal(g.input_edge_index(), torch.tensor([src, dst]).reshape(2, -1))
    assert g.input_edge_type().tolist() == typ


def test_degree_stats_and_super_nodes():
    # One node with 10^5 incoming edges (a super node), a few ordinary ones, isolated nodes.
    n_in = 100_000
    src = torch.cat([torch.arange(1, n_in + 1) % 5000 + 1, torch.tensor([1, 2])])
    dst = torch.cat([torch.zeros(n_in, dtype=torch.int64), torch.tensor([2, 3])])
    g = Graph(torch.stack([src, dst]), num_nodes=6000, super_node_threshold=1000)
    deg = torch.bincount(dst, minlength=6000).double()
    assert g.in_degree.max == n_in
    assert g.in_degree.num_super == 1
    assert g.in_degree.num_isolated == 6000 - 3
    assert g.in_degree.mean == pytest.approx(float(deg.mean()))
    assert g.in_degree.cv == pytest.approx(float(deg.std(unbiased=False) / deg.mean()))
    assert int(g.csr_in.ptr[1]) == n_in
    assert torch.equal(g.csr_in.col[:n_in].sort().values, src[:n_in].int().sort().values)


def test_empty_graph_and_isolated_nodes():
    g = Graph(torch.zeros(2, 0, dtype=torch.int64), num_nodes=4)
    assert g.num_edges == 0 and g.num_nodes == 4
    assert g.csr_in.ptr.tolist() == [0] * 5
    assert g.compact_src.num_rows == 0
    assert g.in_degree.max == 0 and g.in_degree.num_isolated == 4
    g0 = Graph(torch.zeros(2, 0, dtype=torch.int64))
    assert g0.num_nodes == 0 and g0.in_degree.max == 0 and g0.nbytes() >= 0


def test_self_loops_duplicates_and_empty_relations():
    ei = torch.tensor([[0, 0, 1, 1, 2], [0, 0, 1, 2, 2]])
    g = Graph(ei, edge_type=torch.tensor([0, 0, 3, 3, 3]), num_relations=5)
    assert g.rel_ptr.tolist() == [0, 2, 2, 2, 5, 5]       # relations 1, 2, 4 are empty
    assert g.compact_src.num_rows == 3                    # (0,r0) once despite the duplicate
    assert g.compact_src.rel_ptr.tolist() == [0, 1, 1, 1, 3, 3]
    assert g.csr_in.degrees().tolist() == [2, 1, 2]


def test_index_dtype_and_nbytes():
    g = Graph(torch.tensor([[0, 1], [1, 0]]))
    assert g.src.dtype == torch.int32 and g.csr_in.eid.dtype == torch.int32
    tensors = [g.src, g.dst, g.etype, g.edge_perm, g.rel_ptr, g.node_type, g.node_type_ptr,
               *vars(g.csr_in).values(), *vars(g.csr_out).values(),
               *vars(g.compact_src).values(), *vars(g.compact_dst).values()]
    assert g.nbytes() == sum(t.numel() * t.element_size() for t in tensors)


def test_node_types_contiguous_and_not():
    ei = torch.tensor([[0, 1], [2, 3]])
    g = Graph(ei, node_type=torch.tensor([0, 0, 1, 1]))
    assert g.node_types_contiguous and g.node_perm is None
    assert g.nodes_of_type(1).tolist() == [2, 3]
    g2 = Graph(ei, node_type=torch.tensor([1, 0, 1, 0]), node_type_names=["a", "b"])
    assert not g2.node_types_contiguous
    assert g2.nodes_of_type("a").tolist() == [1, 3]
    assert g2.nodes_of_type("b").tolist() == [0, 2]
    assert g2.node_type_ptr.tolist() == [0, 2, 4]


def test_to_is_cached_and_graph_of_reuses():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    g = Graph(ei)
    assert g.to("cpu") is g
    assert graph_of(ei) is graph_of(ei)
    first = graph_of(ei)
    ei[0, 0] = 2                       # an in-place edit must not reuse the stale graph
    assert graph_of(ei) is not first
    assert graph_of(ei).input_edge_index().tolist() == ei.tolist()
    assert graph_of(g) is g
