"""A ``Graph`` build reads the device once: compact maps sized by runs of sorted keys (not
``unique``), node-type pointers and contiguity, degree statistics and the host segment
pointers all in one read.  Every field must equal an independent reference (``torch.unique``,
``bincount``, a stable sort), on graphs with empty relations, isolated nodes, no edges, one
node and node types that are not contiguous."""
import sys
from pathlib import Path

import pytest
import torch

from hector import Graph
from hector.compiler.steps_torch import GraphIndex
from hector.graph import build
from hector.graph.structures import DegreeStats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import host_reads, random_relational  # noqa: E402


def reference_compact(node, etype, n, r):
    """(node, rel, rel_ptr, edge_row) of the unique (node, relation) pairs by torch.unique."""
    key = etype.long() * max(n, 1) + node.long()
    uniq, inverse = torch.unique(key, sorted=True, return_inverse=True)
    rel = uniq // max(n, 1)
    ptr = torch.zeros(r + 1, dtype=torch.long)
    ptr[1:] = torch.cumsum(torch.bincount(rel, minlength=r)[:r], 0)
    return uniq - rel * max(n, 1), rel, ptr, inverse


def cases():
    """(edge_index, edge_type, num_nodes, num_relations, node_type, num_node_types)."""
    ei, et = random_relational(num_nodes=24, num_edges=90, num_relations=4, empty=(1, 3))
    g = torch.Generator().manual_seed(5)
    mixed = torch.randint(0, 3, (24,), generator=g)          # types not contiguous
    out = [(ei, et, 24, 4, None, None),
           (ei, et, 30, 5, torch.sort(mixed).values.repeat_interleave(2)[:30], 3),
           (ei, et, 24, 4, mixed, 3),
           (torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 7, 2,
            None, None),
           (torch.zeros(2, 3, dtype=torch.long), torch.tensor([0, 1, 1]), 1, 2,
            torch.zeros(1, dtype=torch.long), 2),                     # one node, self loops
           (torch.zeros(2, 0, dtype=torch.long), None, 0, 1, None, None)]  # nothing at all
    return out


@pytest.mark.parametrize("pointers", ["cpu", "search"])
@pytest.mark.parametrize("case", range(len(cases())))
def test_build_fields_equal_references(case, pointers, monkeypatch):
    if pointers == "search":   # what CUDA runs: pointers of sorted keys by binary search
        monkeypatch.setattr(build, "sorted_ptr", build.search_ptr)
    ei, et, n, r, nt, t = cases()[case]
    g = Graph(ei, edge_type=et, num_nodes=n, num_relations=r, node_type=nt,
              num_node_types=t)
    for m, end in ((g.compact_src, g.src), (g.compact_dst, g.dst)):
        node, rel, ptr, row = reference_compact(end, g.etype, n, r)
        assert torch.equal(m.node.long(), node) and torch.equal(m.rel.long(), rel)
        assert torch.equal(m.rel_ptr.long(), ptr) and torch.equal(m.edge_row.long(), row)
        assert m.node.dtype == g.index_dtype and m.rel.dtype == torch.int32
    types = nt if nt is not None else torch.zeros(n, dtype=torch.long)
    T = t or 1
    want_ptr = torch.zeros(T + 1, dtype=torch.long)
    want_ptr[1:] = torch.cumsum(torch.bincount(types, minlength=T)[:T], 0)
    assert torch.equal(g.node_type_ptr.long(), want_ptr)
    contiguous = bool((types[1:] >= types[:-1]).all()) if n > 1 else True
    assert g.node_types_contiguous == contiguous
    if contiguous:
        assert g.node_perm is None
    else:
        assert torch.equal(g.node_perm.long(), torch.sort(types, stable=True).indices)
    # The host pointers are the device ones, and the degree statistics read with them are
    # those of a read of their own.
    assert g.host_ptr == {"edge": g.rel_ptr.tolist(), "compact_src": g.compact_src.rel_ptr.tolist(),
                          "compact_dst": g.compact_dst.rel_ptr.tolist(),
                          "node": g.node_type_ptr.tolist()}
    assert [g.in_degree, g.out_degree] == DegreeStats.of_each(
        [g.csr_in.degrees(), g.csr_out.degrees()], g.in_degree.super_threshold)


def test_compact_runs_of_presorted_keys_equal_unique():
    """The destination side skips the sort when its keys come sorted: same map."""
    g = torch.Generator().manual_seed(2)
    node = torch.randint(0, 6, (40,), generator=g)
    etype = torch.randint(0, 3, (40,), generator=g)
    order = torch.sort(etype * 6 + node, stable=True).indices
    node, etype = node[order], etype[order]
    for keys_sorted in (True, False):
        runs = build.compact_runs(node, etype, 6, 3, keys_sorted=keys_sorted)
        m = build.compact_from_runs(runs, int(runs.rel_ptr[-1]), 6)
        want = reference_compact(node, etype, 6, 3)
        for got, ref in zip((m.node, m.rel, m.rel_ptr, m.edge_row), want):
            assert torch.equal(got.long(), ref)


def count_reads(fn):
    """(fn(), host reads from hector code, ``unique`` included: each a device sync on CUDA)."""
    with host_reads(("unique", "unique_consecutive")) as seen:
        out = fn()
    return out, [f"{name} {caller}" for name, _, caller in seen]


def test_block_style_build_reads_the_device_once_and_graph_index_not_at_all():
    ei, et = random_relational(num_nodes=24, num_edges=90, num_relations=4)
    nt = torch.tensor([0] * 10 + [1] * 14)
    names = dict(node_type_names=["a", "b"],
                 relation_names=[("a", f"r{i}", "b") for i in range(4)])
    ei = torch.stack([ei[0] % 10, 10 + ei[1] % 14])     # a -> b edges, as the names say
    kwargs = dict(edge_type=et, num_nodes=24, num_relations=4, node_type=nt,
                  num_node_types=2, **names)
    g, reads = count_reads(lambda: Graph(ei, check_ids=False, **kwargs))
    assert len(reads) == 1, reads
    _, reads = count_reads(lambda: GraphIndex.of(g))
    assert reads == []
    # With the id checks: one read for the ranges, one for the endpoint types, one build.
    checked, reads = count_reads(lambda: Graph(ei, **kwargs))
    assert len(reads) == 3, reads
    for name in ("src", "dst", "etype", "edge_perm", "rel_ptr", "node_type", "node_type_ptr"):
        assert torch.equal(getattr(g, name), getattr(checked, name)), name
    assert g.host_ptr == checked.host_ptr and g.in_degree == checked.in_degree


def test_check_ids_false_still_checks_names_and_check_ids_true_rejects_bad_ids():
    ei = torch.tensor([[0, 1], [1, 5]])
    with pytest.raises(ValueError, match="edge_index\\[1\\]"):
        Graph(ei, num_nodes=3)
    with pytest.raises(ValueError, match="node_type_names has 1 entries"):
        Graph(ei[:, :1], num_nodes=3, node_type=torch.zeros(3, dtype=torch.long),
              num_node_types=2, node_type_names=["a"], check_ids=False)


def test_degree_stats_equal_references_from_exact_sums():
    """Mean, population std, max, isolated and super-node counts, each against its plain
    torch reference, from the integer facts of one array (on the CPU at most 8 aten ops; on
    CUDA one generated kernel and its output's fill: tests/kernels/test_stats.py)."""
    from helpers import aten_ops
    g = torch.Generator().manual_seed(3)
    for degrees in (torch.randint(0, 40, (500,), generator=g), torch.zeros(7, dtype=torch.long),
                    torch.tensor([5]), torch.randint(0, 3, (64,), generator=g).to(torch.int32)):
        parts, ops = aten_ops(lambda: DegreeStats.parts(degrees, 30))
        assert sum(ops.values()) <= 8, ops
        got = DegreeStats.from_values([degrees], parts.tolist(), 30)[0]
        d = degrees.double()
        mean, std = d.mean().item(), d.std(unbiased=False).item()
        assert (got.max, got.num_isolated, got.num_super) == (
            int(degrees.max()), int((degrees == 0).sum()), int((degrees >= 30).sum()))
        assert got.mean == pytest.approx(mean, rel=1e-12)
        assert got.cv == pytest.approx(std / mean if mean > 0 else 0.0, rel=1e-9, abs=1e-12)
