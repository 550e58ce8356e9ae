"""The cheaper build paths of a mini-batch block give the fields the general build gives, value
for value and dtype for dtype: edges given sorted by (destination, relation) (``dst_sorted``:
one sort by relation, no sort for the CSR by destination), compact maps by a presence table
instead of a sort, the CSR by source built on first use.  On random graphs with empty rows and
relations, duplicates, one node, no edges."""
import sys
from pathlib import Path

import pytest
import torch

from hector import Graph
from hector.graph import build

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import random_relational  # noqa: E402

#: On CUDA the build searches pointers and counts by index_add_ (no reads): both paths run.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

FIELDS = ("src", "dst", "etype", "edge_perm", "rel_ptr", "node_type", "node_type_ptr",
          "host_ptr", "in_degree", "out_degree", "node_types_contiguous")


def by_dst_then_relation(ei, et, r):
    """The edges reordered by (destination, relation), ties in a shuffled order (the sampler's
    ties follow the full graph's CSR, not the input)."""
    g = torch.Generator().manual_seed(3)
    shuffle = torch.randperm(et.numel(), generator=g)
    ei, et = ei[:, shuffle], et[shuffle]
    order = torch.sort(ei[1] * r + et, stable=True).indices
    return ei[:, order], et[order]


def cases():
    """(edge_index, edge_type, num_nodes, num_relations, node_type, num_node_types)."""
    ei, et = random_relational(num_nodes=24, num_edges=90, num_relations=4, empty=(1, 3))
    types = torch.tensor([0] * 9 + [1] * 8 + [2] * 7)
    return [(ei, et, 24, 4, None, None),
            (ei, et, 30, 5, torch.cat([types, torch.full((6,), 2)]), 3),     # empty rows
            (torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 7, 2,
             None, None),                                                   # no edges
            (torch.zeros(2, 3, dtype=torch.long), torch.tensor([0, 1, 1]), 1, 2,
             torch.zeros(1, dtype=torch.long), 2),                          # one node
            (torch.zeros(2, 0, dtype=torch.long), None, 0, 1, None, None)]  # nothing at all


def assert_same_graph(got, want):
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), name
        else:
            assert a == b, name
    for name in ("csr_in", "csr_out", "compact_src", "compact_dst"):
        for field, a in vars(getattr(got, name)).items():
            b = getattr(getattr(want, name), field)
            assert a.dtype == b.dtype and torch.equal(a, b), f"{name}.{field}"


def on(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(cases())))
def test_dst_sorted_build_equals_the_general_build(case, device):
    ei, et, n, r, nt, t = cases()[case]
    if et is not None:
        ei, et = by_dst_then_relation(ei, et, r)
    ei, et, nt = on(device, ei, et, nt)
    kw = dict(edge_type=et, num_nodes=n, num_relations=r, node_type=nt, num_node_types=t)
    assert_same_graph(Graph(ei, dst_sorted=True, **kw), Graph(ei, **kw))


def test_dst_sorted_build_rejects_edges_in_another_order():
    ei = torch.tensor([[0, 1, 2], [2, 1, 2]])
    with pytest.raises(ValueError, match="dst_sorted"):
        Graph(ei, num_nodes=3, dst_sorted=True)
    # Sorted by destination but not by relation within one.
    with pytest.raises(ValueError, match="dst_sorted"):
        Graph(torch.tensor([[0, 1], [2, 2]]), edge_type=torch.tensor([1, 0]), num_nodes=3,
              dst_sorted=True)


@pytest.mark.parametrize("case", range(len(cases())))
def test_compact_maps_by_presence_equal_those_by_sort(case, monkeypatch):
    ei, et, n, r, nt, t = cases()[case]
    kw = dict(edge_type=et, num_nodes=n, num_relations=r, node_type=nt, num_node_types=t)
    by_presence = Graph(ei, **kw)           # small graphs: the presence table
    monkeypatch.setattr(build, "PRESENCE_MIN_KEYS", 0)
    monkeypatch.setattr(build, "PRESENCE_KEYS_PER_EDGE", 0)
    by_sort = Graph(ei, **kw)
    for m, ref in ((by_presence.compact_src, by_sort.compact_src),
                   (by_presence.compact_dst, by_sort.compact_dst)):
        for field, a in vars(m).items():
            assert a.dtype == getattr(ref, field).dtype and torch.equal(a, getattr(ref, field))
    # And both are torch.unique's rows (node, relation) with the inverse per edge.
    n1 = max(n, 1)
    key = by_sort.etype.long() * n1 + by_sort.src.long()
    uniq, inverse = torch.unique(key, sorted=True, return_inverse=True)
    assert torch.equal(by_presence.compact_src.node.long(), uniq % n1)
    assert torch.equal(by_presence.compact_src.edge_row.long(), inverse)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(cases())))
def test_csr_by_source_is_built_on_first_use_and_equals_a_stable_sort(case, device):
    ei, et, n, r, nt, t = cases()[case]
    ei, et, nt = on(device, ei, et, nt)
    g = Graph(ei, edge_type=et, num_nodes=n, num_relations=r, node_type=nt, num_node_types=t)
    assert g._csr_out is None          # the build did not sort by source
    order = torch.sort(g.src.long().cpu(), stable=True).indices
    counts = torch.bincount(g.src.long().cpu(), minlength=n)
    assert torch.equal(g.csr_out.eid.long().cpu(), order)
    assert torch.equal(g.csr_out.col.long().cpu(), g.dst.long().cpu()[order])
    assert torch.equal(g.csr_out.degrees().long().cpu(), counts)
    assert g.csr_out.eid.dtype == g.index_dtype
    assert g.out_degree.max == (int(counts.max()) if n else 0)
    moved = g.to(device)
    assert moved.csr_out is g.csr_out


@pytest.mark.parametrize("device", DEVICES)
def test_counts_by_add_equal_bincount(device):
    keys = torch.tensor([3, 0, 3, 5, 3, 0])
    for n in (6, 9):
        want = torch.bincount(keys, minlength=n)
        assert torch.equal(build.counts_by_add(keys.to(device), n).cpu(), want)
        assert torch.equal(build.counts_of(keys.to(device), n).cpu(), want)
    assert build.counts_by_add(keys[:0].to(device), 4).tolist() == [0, 0, 0, 0]
