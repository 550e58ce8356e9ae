"""Tests of the synthetic generator (hector.datasets.synthetic) and its profiles."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hector.datasets import profiles as P
from hector.datasets import synthetic as S
from hector.datasets.base import Dataset

ALL = ["aifb", "mutag", "bgs", "am", "fb15k", "biokg", "wikikg2", "mag",
       "cora", "pubmed", "arxiv", "proteins", "reddit", "products"]
HOMOGENEOUS = ["cora", "pubmed", "arxiv", "proteins", "reddit", "products"]

# scales small enough to keep every test graph under ~300k edges
TEST_SCALE = {"aifb": 1.0, "mutag": 1.0, "bgs": 0.2, "am": 0.01, "fb15k": 0.2, "biokg": 0.02,
              "wikikg2": 0.005, "mag": 0.005, "cora": 1.0, "pubmed": 1.0, "arxiv": 0.05,
              "proteins": 0.002, "reddit": 0.002, "products": 0.001}

_CACHE: dict = {}


def gen(name: str, seed: int = 0, **kw) -> Dataset:
    key = (name, seed, tuple(sorted(kw.items())))
    if key not in _CACHE:
        _CACHE[key] = S.load(name, seed=seed, scale=kw.pop("scale", TEST_SCALE[name]), **kw)
    return _CACHE[key]


def counted(ds: Dataset, prof: P.Profile):
    """(nodes per type, edges per relation) counted from the produced graph: type sizes by a
    bincount of ``node_type``, relation sizes by a bincount of ``edge_type`` (one type / one
    relation where the dataset has none)."""
    nodes = ([ds.num_nodes] if ds.node_type is None else
             torch.bincount(ds.node_type, minlength=len(prof.node_types)).tolist())
    rels = ([ds.num_edges] if ds.edge_type is None else
            torch.bincount(ds.edge_type, minlength=len(prof.relations)).tolist())
    return nodes, rels


def check_scaled_counts(prof: P.Profile, scale: float, nodes, rels):
    """The profile's contract, stated as bounds rather than as the generator's arithmetic:
    every node type keeps at least one node and is within rounding (0.5) of its scaled count;
    a relation is within rounding of its scaled count (within 1 and even for a symmetric
    graph, whose edges come in pairs); a reverse relation has its forward one's count."""
    assert len(nodes) == len(prof.node_types) and len(rels) == len(prof.relations)
    for t, n in zip(prof.node_types, nodes):
        target = t.count * scale
        assert n >= 1 and (abs(n - target) <= 0.5 or (n == 1 and target < 1)), (t.name, n, target)
    for r, e in zip(prof.relations, rels):
        if r.reverse_of is not None:
            assert e == rels[r.reverse_of], (r.name, e)
        elif prof.symmetric:
            assert e % 2 == 0 and abs(e - r.count * scale) <= 1, (r.name, e)
        else:
            assert abs(e - r.count * scale) <= 0.5, (r.name, e, r.count * scale)


# ------------------------------------------------------------------------------------------------
# Profiles at full scale (no generation)
# ------------------------------------------------------------------------------------------------

def test_profile_names():
    assert sorted(S.profiles()) == sorted(ALL)


# name: (nodes, edges, node types, relations)
PUBLISHED = {
    "aifb": (7_262, 48_810, 7, 104),
    "mutag": (27_163, 148_100, 5, 50),
    "bgs": (94_806, 672_884, 27, 122),
    "am": (881_680, 5_668_682, 7, 108),
    "fb15k": (14_541, 620_232, 1, 474),
    "biokg": (93_773, 4_762_678, 5, 51),
    "wikikg2": (2_500_604, 16_109_182, 1, 535),
    "mag": (1_939_743, 21_111_007, 4, 4),
    "cora": (2_708, 10_556, 1, 1),
    "pubmed": (19_717, 88_648, 1, 1),
    "arxiv": (169_343, 1_166_243, 1, 1),
    "proteins": (132_534, 79_122_504, 1, 1),
    "reddit": (232_965, 114_615_892, 1, 1),
    "products": (2_449_029, 123_718_280, 1, 1),
}


@pytest.mark.parametrize("name", ALL)
def test_profile_totals(name):
    p = S.get_profile(name)
    nodes, edges, ntypes, nrels = PUBLISHED[name]
    assert (p.num_nodes, p.num_edges, p.num_node_types, p.num_relations) == \
        (nodes, edges, ntypes, nrels)
    assert p.heterogeneous == (name not in HOMOGENEOUS)


def test_profile_mag_breakdown():
    p = S.get_profile("mag")
    assert p.node_counts() == {"paper": 736_389, "author": 1_134_649, "institution": 8_740,
                               "field_of_study": 59_965}
    assert {r: c.count for r, c in zip(p.relation_names, p.relations)} == {
        ("author", "affiliated_with", "institution"): 1_043_998,
        ("author", "writes", "paper"): 7_145_660,
        ("paper", "cites", "paper"): 5_416_271,
        ("paper", "has_topic", "field_of_study"): 7_505_078,
    }
    assert p.target_type == "paper" and p.num_classes == 349
    assert sum(p.split) <= p.node_counts()["paper"]


def test_profile_biokg_breakdown():
    p = S.get_profile("biokg")
    assert p.node_counts() == {"disease": 10_687, "drug": 10_533, "function": 45_085,
                               "protein": 17_499, "sideeffect": 9_969}
    assert sum(1 for r in p.relations if r.src == r.dst == "drug") == 38
    assert sum(1 for r in p.relations if r.src == r.dst == "protein") == 7


def test_profile_aifb_breakdown_and_fb15k():
    a = S.get_profile("aifb")
    assert a.target_type == "Personen" and a.node_counts()["Personen"] == 237
    assert sum(r.count for r in a.relations if r.reverse_of is None) == 24_405
    f = S.get_profile("fb15k")
    assert sum(r.count for r in f.relations if r.reverse_of is None) == 310_116


@pytest.mark.parametrize("name", ALL)
def test_profile_consistency(name):
    p = S.get_profile(name)
    types = set(p.node_type_names)
    assert len(types) == p.num_node_types
    for r in p.relations:
        assert r.src in types and r.dst in types and r.count >= 1
        if r.reverse_of is not None:
            f = p.relations[r.reverse_of]
            assert (f.src, f.dst, f.count) == (r.dst, r.src, r.count)
    if p.symmetric:
        assert p.num_edges % 2 == 0
    # every node type has incoming edges in the RDF / KG profiles with reverse relations
    if any(r.reverse_of is not None for r in p.relations):
        assert all(p.in_edges(t) > 0 for t in types)
    if p.split is not None:
        assert sum(p.split) <= p.node_types[0].count


def test_profile_frozen():
    p = S.get_profile("mag")
    with pytest.raises(Exception):
        p.name = "x"                                        # frozen dataclass
    hash(p)


@pytest.mark.parametrize("name", ALL)
def test_degree_model_hits_targets_at_full_scale(name):
    p = S.get_profile(name)
    for spec, d in zip(p.node_types, S.degree_model(name)):
        assert d["num_nodes"] == spec.count
        assert d["in_edges"] == p.in_edges(spec.name)
        if spec.max_degree is not None:
            assert d["expected_max_in_degree"] == pytest.approx(spec.max_degree, rel=1e-3)
        if spec.super_nodes:
            assert d["expected_super_nodes"] == spec.super_nodes
        if name in ("reddit", "proteins", "products", "arxiv"):
            assert d["expected_super_nodes"] > 0        # these have super nodes (>= 1000)


# ------------------------------------------------------------------------------------------------
# Generated graphs
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_generated_structure(name):
    prof = S.get_profile(name)
    scale = TEST_SCALE[name]
    ds = gen(name)
    nodes, rels = counted(ds, prof)
    check_scaled_counts(prof, scale, nodes, rels)
    N, E = sum(nodes), sum(rels)
    assert isinstance(ds, Dataset)
    assert ds.name == f"synthetic:{name}"
    assert ds.extra["profile"] is prof
    assert ds.num_nodes == N and ds.num_edges == E
    ei = ds.edge_index
    assert ei.dtype == torch.int64 and ei.shape == (2, E)
    assert int(ei.min()) >= 0 and int(ei.max()) < N
    offsets = torch.tensor([0] + nodes).cumsum(0)
    assert ds.extra["node_type_offsets"] == offsets.tolist()
    if prof.heterogeneous:
        assert ds.num_relations == len(prof.relations)
        assert ds.node_type_names == prof.node_type_names
        assert ds.relation_names == prof.relation_names
        # node types: contiguous ranges in profile order with the right sizes
        assert ds.node_type.dtype == torch.int64 and ds.node_type.shape == (N,)
        assert torch.bincount(ds.node_type, minlength=len(nodes)).tolist() == nodes
        assert bool((ds.node_type[1:] >= ds.node_type[:-1]).all())
        # exact edge count per relation
        assert ds.edge_type.dtype == torch.int64 and ds.edge_type.shape == (E,)
        assert torch.bincount(ds.edge_type, minlength=len(rels)).tolist() == rels
        # every relation's endpoints lie in its source / destination type's range
        tindex = {t: i for i, t in enumerate(prof.node_type_names)}
        src_t = torch.tensor([tindex[r.src] for r in prof.relations])[ds.edge_type]
        dst_t = torch.tensor([tindex[r.dst] for r in prof.relations])[ds.edge_type]
        assert torch.equal(ds.node_type[ei[0]], src_t)
        assert torch.equal(ds.node_type[ei[1]], dst_t)
        # reverse relations hold exactly the flipped forward edges
        starts = [0] + torch.tensor(rels).cumsum(0).tolist()
        for i, r in enumerate(prof.relations):
            if r.reverse_of is not None:
                f = r.reverse_of
                assert torch.equal(ei[:, starts[i]:starts[i + 1]],
                                   ei.flip(0)[:, starts[f]:starts[f + 1]])
    else:
        assert ds.edge_type is None and ds.num_relations == 1 and ds.node_type is None
        if prof.symmetric:
            h = E // 2
            assert torch.equal(ei[:, h:], ei[:, :h].flip(0))


@pytest.mark.parametrize("name", ALL)
def test_features_labels_splits(name):
    prof = S.get_profile(name)
    ds = gen(name)
    N = ds.num_nodes
    if prof.feature_dim is None:
        assert ds.x is None
    else:
        assert ds.x.shape == (N, prof.feature_dim) and ds.x.dtype == torch.float32
        assert bool(torch.isfinite(ds.x).all()) and float(ds.x.std()) > 0.5
    if prof.num_classes is None:
        assert ds.y is None and ds.train_idx is None and ds.num_classes == 0
        return
    assert ds.num_classes == prof.num_classes
    n_target = ds.extra["node_counts"][prof.target_type]
    if prof.multilabel:
        assert ds.y.shape == (N, prof.num_classes)
        assert set(ds.y.unique().tolist()) <= {0, 1}
    else:
        assert ds.y.shape == (N,) and ds.y.dtype == torch.int64
        lab = ds.y[:n_target]
        assert int(lab.min()) >= 0 and int(lab.max()) < prof.num_classes
        assert bool((ds.y[n_target:] == -1).all())
    parts = [p for p in (ds.train_idx, ds.val_idx, ds.test_idx) if p is not None]
    allidx = torch.cat(parts)
    assert allidx.numel() == allidx.unique().numel()                 # disjoint
    assert int(allidx.min()) >= 0 and int(allidx.max()) < n_target   # in the labelled type
    assert ds.train_idx.numel() >= 1


def test_published_split_sizes():
    cora = gen("cora")
    assert (cora.train_idx.numel(), cora.val_idx.numel(), cora.test_idx.numel()) == \
        (140, 500, 1000)
    aifb = gen("aifb")
    assert aifb.train_idx.numel() == 140 and aifb.val_idx is None and aifb.test_idx.numel() == 36
    assert aifb.num_classes == 4


def test_overrides_on_heterogeneous_and_kg():
    ds = gen("biokg", scale=0.005, feature_dim=16, num_classes=5)
    n0 = ds.extra["node_counts"]["disease"]
    assert ds.x.shape == (ds.num_nodes, 16)
    assert ds.num_classes == 5 and int(ds.y[:n0].max()) < 5
    sizes = (ds.train_idx.numel(), ds.val_idx.numel(), ds.test_idx.numel())
    assert sum(sizes) == n0 and abs(sizes[0] - 0.6 * n0) <= 1
    ds2 = S.load("cora", feature_dim=7, num_classes=2)
    assert ds2.x.shape == (2708, 7) and int(ds2.y.max()) <= 1


def test_determinism():
    for name, scale in (("mag", 0.002), ("cora", 1.0), ("fb15k", 0.05), ("proteins", 0.001)):
        a = S.load(name, seed=3, scale=scale)
        b = S.load(name, seed=3, scale=scale)
        c = S.load(name, seed=4, scale=scale)
        for k in ("edge_index", "edge_type", "node_type", "x", "y", "train_idx", "val_idx",
                  "test_idx"):
            va, vb = getattr(a, k), getattr(b, k)
            assert (va is None and vb is None) or torch.equal(va, vb), (name, k)
        assert not torch.equal(a.edge_index, c.edge_index)
        if a.x is not None:
            assert not torch.equal(a.x, c.x)


def test_edges_do_not_depend_on_features_or_classes():
    a = S.load("mag", scale=0.001)
    b = S.load("mag", scale=0.001, feature_dim=4, num_classes=3)
    assert torch.equal(a.edge_index, b.edge_index)


@pytest.mark.parametrize("name", HOMOGENEOUS)
def test_skewed_degrees(name):
    ds = gen(name)
    indeg = torch.bincount(ds.edge_index[1], minlength=ds.num_nodes).double()
    assert float(indeg.max()) > 5 * float(indeg.mean())
    cv = float(indeg.std() / indeg.mean())
    assert cv > 0.5


def test_reddit_small_has_super_nodes():
    ds = gen("reddit")                                            # scale 0.002: 466 nodes
    indeg = torch.bincount(ds.edge_index[1], minlength=ds.num_nodes)
    mean = float(indeg.double().mean())
    assert 480 < mean < 505                                        # mean degree kept (~492)
    assert int(indeg.max()) > 10 * mean                            # published max/mean ~44
    assert int((indeg >= 1000).sum()) >= 1                         # super nodes


def test_fb15k_full_scale_matches_real_degrees():
    ds = S.load("fb15k")                                          # 620k edges, fast
    indeg = torch.bincount(ds.edge_index[1], minlength=ds.num_nodes)
    assert abs(int(indeg.max()) - 8_642) < 0.1 * 8_642            # real: 8,642
    assert abs(int((indeg >= 1000).sum()) - 21) <= 6              # real: 21 super nodes


def test_aifb_per_type_max_degree():
    ds = gen("aifb")
    indeg = torch.bincount(ds.edge_index[1], minlength=ds.num_nodes)
    for i, spec in enumerate(S.get_profile("aifb").node_types):
        got = int(indeg[ds.node_type == i].max())
        assert 0.6 * spec.max_degree <= got <= 1.5 * spec.max_degree + 5, spec.name


def test_hubs_are_not_at_low_ids():
    ds = gen("reddit")
    indeg = torch.bincount(ds.edge_index[1], minlength=ds.num_nodes)
    top = set(indeg.topk(10).indices.tolist())
    assert top != set(range(10))                                  # hubs are permuted


def test_tiny_scale_keeps_every_type():
    ds = S.load("bgs", scale=1e-9)
    assert ds.num_nodes == 27 and ds.num_edges == 0
    assert torch.bincount(ds.node_type, minlength=27).tolist() == [1] * 27
    ds = S.load("mag", scale=1e-6)
    nodes, rels = counted(ds, S.get_profile("mag"))
    check_scaled_counts(S.get_profile("mag"), 1e-6, nodes, rels)
    assert ds.num_nodes == sum(nodes) and ds.num_edges == sum(rels)


def test_profile_object_and_case_insensitive_name():
    p = S.get_profile("cora")
    a = S.load(p, scale=0.5)
    b = S.load("CORA", scale=0.5)
    assert torch.equal(a.edge_index, b.edge_index)


def test_custom_profile_with_super_node_target():
    prof = P.Profile(
        name="custom", source="test",
        node_types=(P.NodeTypeSpec("n", 20_000, max_degree=5_000, super_nodes=40),),
        relations=(P.RelationSpec("n", "e", "n", 1_000_000),), symmetric=True)
    (d,) = S.degree_model(prof)
    assert d["expected_max_in_degree"] == pytest.approx(5_000, rel=1e-3)
    assert d["expected_super_nodes"] == 40
    ds = S.load(prof)
    indeg = torch.bincount(ds.edge_index[1], minlength=ds.num_nodes)
    assert abs(int((indeg >= 1000).sum()) - 40) <= 8
    assert abs(int(indeg.max()) - 5_000) < 500


@st.composite
def small_profiles(draw):
    nt = draw(st.integers(1, 4))
    types = tuple(P.NodeTypeSpec(f"t{i}", draw(st.integers(1, 300)),
                                 max_degree=draw(st.one_of(st.none(), st.integers(1, 500))),
                                 skew=draw(st.one_of(st.none(), st.floats(0.0, 2.0))))
                  for i in range(nt))
    fwd = [(f"t{draw(st.integers(0, nt - 1))}", f"r{k}", f"t{draw(st.integers(0, nt - 1))}",
            draw(st.integers(1, 2_000))) for k in range(draw(st.integers(1, 5)))]
    rels = P._with_reverse(fwd) if draw(st.booleans()) else \
        tuple(P.RelationSpec(*r) for r in fwd)
    return P.Profile(name="h", source="hypothesis", node_types=types, relations=rels,
                     num_classes=draw(st.one_of(st.none(), st.integers(1, 5))))


@settings(max_examples=40, deadline=None)
@given(prof=small_profiles(), scale=st.floats(0.01, 2.0), seed=st.integers(0, 2 ** 40))
def test_random_profiles_invariants(prof, scale, seed):
    ds = S.load(prof, seed=seed, scale=scale)
    nodes, rels = counted(ds, prof)
    check_scaled_counts(prof, scale, nodes, rels)
    assert ds.num_nodes == sum(nodes) and ds.num_edges == sum(rels)
    et = ds.edge_type if ds.edge_type is not None else torch.zeros(ds.num_edges, dtype=torch.long)
    lo = torch.tensor([0] + nodes).cumsum(0)
    tindex = {t.name: i for i, t in enumerate(prof.node_types)}
    s_t = torch.tensor([tindex[r.src] for r in prof.relations])[et]
    d_t = torch.tensor([tindex[r.dst] for r in prof.relations])[et]
    ei = ds.edge_index
    assert bool(((ei[0] >= lo[s_t]) & (ei[0] < lo[s_t + 1])).all())
    assert bool(((ei[1] >= lo[d_t]) & (ei[1] < lo[d_t + 1])).all())
    again = S.load(prof, seed=seed, scale=scale)
    assert torch.equal(ds.edge_index, again.edge_index)


def test_dispatch_through_datasets_load():
    from hector import datasets
    ds = datasets.load("synthetic:cora", scale=0.5, seed=1)
    assert torch.equal(ds.edge_index, S.load("cora", scale=0.5, seed=1).edge_index)


def test_graph_builds():
    pytest.importorskip("hector.graph")
    for ds in (S.load("aifb"), S.load("cora", scale=0.3), S.load("fb15k", scale=0.01)):
        try:
            g = ds.graph
        except (ImportError, AttributeError) as exc:             # Graph not there yet
            pytest.skip(f"hector.graph.Graph unavailable: {exc}")
        assert g is not None


# ------------------------------------------------------------------------------------------------
# Bad arguments
# ------------------------------------------------------------------------------------------------

def test_unknown_profile_lists_known():
    with pytest.raises(ValueError) as e:
        S.load("nope")
    msg = str(e.value)
    assert "nope" in msg and all(n in msg for n in ALL)
    with pytest.raises(TypeError, match="profile"):
        S.load(3)


@pytest.mark.parametrize("scale", [0, -1, 0.0, float("nan"), float("inf")])
def test_bad_scale_value(scale):
    with pytest.raises(ValueError, match="scale"):
        S.load("cora", scale=scale)


@pytest.mark.parametrize("scale", ["1", None, True, [1]])
def test_bad_scale_type(scale):
    with pytest.raises(TypeError, match="scale"):
        S.load("cora", scale=scale)


@pytest.mark.parametrize("seed,exc", [(-1, ValueError), (2 ** 63, ValueError),
                                      (1.5, TypeError), ("0", TypeError), (True, TypeError),
                                      (None, TypeError)])
def test_bad_seed(seed, exc):
    with pytest.raises(exc, match="seed"):
        S.load("cora", seed=seed)


@pytest.mark.parametrize("arg", ["feature_dim", "num_classes"])
@pytest.mark.parametrize("value,exc", [(0, ValueError), (-3, ValueError), (2.0, TypeError),
                                       ("8", TypeError)])
def test_bad_sizes(arg, value, exc):
    with pytest.raises(exc, match=arg):
        S.load("cora", scale=0.1, **{arg: value})


def test_bad_device():
    with pytest.raises(ValueError, match="device"):
        S.load("cora", scale=0.1, device="not-a-device")


def test_nearly_flat_skew_does_not_overflow():
    # hypothesis found it: a Zipf exponent of ~1e-54 made (threshold / c) ** (-1 / a) overflow
    prof = P.Profile(name="flat", source="test",
                     node_types=(P.NodeTypeSpec("t0", 3, skew=2.9e-54),),
                     relations=(P.RelationSpec("t0", "r", "t0", 6_000),))
    (d,) = S.degree_model(prof)
    assert d["expected_super_nodes"] == 3          # 2,000 in-edges each: all are super nodes
    ds = S.load(prof, seed=0)
    assert ds.num_edges == 6_000
