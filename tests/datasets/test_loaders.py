"""Loaders: the real datasets against their published statistics and against PyG, and every
error path on small hand-made files."""
import gzip
import io
import pickle
import re
import shutil
import sys
import types
from collections import Counter

import numpy as np
import pytest
import torch

import hector.datasets as D
from hector.datasets import edgelist, kg, npz, planetoid, rdf

from dataset_files import write_npz as _write_npz, write_planetoid as _write_planetoid


def _degree(ds):
    return torch.bincount(ds.edge_index[1], minlength=ds.num_nodes)


# ---------------------------------------------------------------- real data: statistics ----

@pytest.fixture(scope="module")
def aifb(data_dir):
    return D.load("aifb", root=data_dir("aifb"))


def test_aifb_statistics(aifb):
    assert (aifb.num_nodes, aifb.num_edges, aifb.num_relations) == (8285, 58086, 90)
    assert aifb.train_idx.numel() == 140 and aifb.test_idx.numel() == 36
    assert aifb.val_idx is None and aifb.x is None and aifb.num_classes == 4
    assert int(_degree(aifb).max()) == 1247
    assert aifb.y.shape == (8285,) and aifb.y.dtype == torch.long
    assert int((aifb.y >= 0).sum()) == 176 and set(aifb.y[aifb.train_idx].tolist()) == {0, 1, 2, 3}
    assert torch.equal(aifb.y[aifb.train_idx], aifb.extra["train_y"])
    # Sorted by (src, dst, rel), as PyG sorts, with no duplicate edge.
    key = (aifb.edge_index[0] * 8285 + aifb.edge_index[1]) * 90 + aifb.edge_type
    assert bool((key[1:] > key[:-1]).all())
    # Relation 2r+1 is the inverse of 2r, and relations come by descending frequency.
    fwd = aifb.edge_type % 2 == 0
    src, dst, rel = aifb.edge_index[0], aifb.edge_index[1], aifb.edge_type
    inv = torch.stack([dst[~fwd], src[~fwd], rel[~fwd] - 1])
    fwd_set = set(map(tuple, torch.stack([src[fwd], dst[fwd], rel[fwd]]).T.tolist()))
    assert set(map(tuple, inv.T.tolist())) == fwd_set
    hist = torch.bincount(aifb.edge_type[fwd] // 2, minlength=45)
    assert bool((hist[:-1] >= hist[1:]).all()) and int(hist.sum()) == 29043


def _reference_aifb(path):
    """PyG's Entities.process on AIFB, re-done with sets and Counters on raw term strings
    (an independent parse: AIFB lines have no escapes, so the raw text identifies a term)."""
    triples = set()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                s, p, rest = line.rstrip().split(" ", 2)
                triples.add((s, p, rest[:-1].rstrip()))
    freq = Counter(p for _, p, _ in triples)
    deg = Counter()
    for s, _, o in triples:
        deg[s] += 2 if s == o else 1
        deg[o] += 0 if s == o else 1
    nodes = {s for s, _, _ in triples} | {o for _, _, o in triples}
    return len(nodes), 2 * len(triples), sorted(freq.values(), reverse=True), deg


def test_aifb_matches_pyg_processing(aifb, data_dir):
    n, e, hist, deg = _reference_aifb(data_dir("aifb") / "aifb_stripped.nt.gz")
    assert (aifb.num_nodes, aifb.num_edges) == (n, e)
    assert torch.bincount(aifb.edge_type[aifb.edge_type % 2 == 0] // 2).tolist() == hist
    # Each node has as many out-edges as the triples it takes part in (inverses included).
    assert sorted(torch.bincount(aifb.edge_index[0]).tolist()) == \
        sorted(list(deg.values()) + [0] * (n - len(deg)))


def test_aifb_against_pyg_entities(aifb, data_dir, tmp_path):
    pytest.importorskip("rdflib", reason="PyG's Entities needs rdflib")
    pytest.importorskip("pandas", reason="PyG's Entities needs pandas")
    from torch_geometric.datasets import Entities
    raw = tmp_path / "aifb" / "raw"
    raw.mkdir(parents=True)
    for f in ("aifb_stripped.nt.gz", "trainingSet.tsv", "testSet.tsv"):
        shutil.copy(data_dir("aifb") / f, raw / f)
    lines = (raw / "trainingSet.tsv").read_text().splitlines()
    lines += (raw / "testSet.tsv").read_text().splitlines()[1:]
    (raw / "completeDataset.tsv").write_text("\n".join(lines) + "\n")
    ref = Entities(str(tmp_path), "aifb")[0]
    assert (ref.num_nodes, ref.edge_index.shape[1]) == (aifb.num_nodes, aifb.num_edges)
    assert sorted(torch.bincount(ref.edge_type).tolist()) == \
        sorted(torch.bincount(aifb.edge_type).tolist())
    ref_deg = torch.bincount(ref.edge_index[1], minlength=ref.num_nodes)
    assert torch.equal(ref_deg[ref.train_idx], _degree(aifb)[aifb.train_idx])


def test_cora_statistics_and_pyg(data_dir):
    from torch_geometric.io import read_planetoid_data
    ds = D.load("cora", root=data_dir("cora"))
    assert (ds.num_nodes, ds.num_edges, ds.num_classes) == (2708, 10556, 7)
    assert ds.x.shape == (2708, 1433) and ds.x.dtype == torch.float32 and ds.y.dtype == torch.long
    assert [t.numel() for t in (ds.train_idx, ds.val_idx, ds.test_idx)] == [140, 500, 1000]
    assert int(_degree(ds).max()) == 168
    ref = read_planetoid_data(str(data_dir("cora")), "cora")
    assert torch.equal(ds.edge_index, ref.edge_index)
    assert torch.equal(ds.x, ref.x) and torch.equal(ds.y, ref.y)
    for idx, mask in ((ds.train_idx, ref.train_mask), (ds.val_idx, ref.val_mask),
                      (ds.test_idx, ref.test_mask)):
        assert torch.equal(idx, mask.nonzero().view(-1))


def test_fb15k_237_statistics(data_dir):
    ds = D.load("FB15K_237", root=data_dir("fb15k-237"), seed=5)  # seed: no effect, accepted
    assert ds.name == "fb15k-237" and (ds.num_nodes, ds.num_relations) == (14541, 237)
    sizes = [ds.extra[f"{s}_triples"].shape for s in ("train", "valid", "test")]
    assert sizes == [(3, 272115), (3, 17535), (3, 20466)]
    tr = ds.extra["train_triples"]
    assert torch.equal(ds.edge_index, tr[[0, 2]]) and torch.equal(ds.edge_type, tr[1])
    assert tr[:, 0].tolist() == [0, 0, 1]  # first appearance: head, then tail
    assert ds.y is None and ds.num_classes == 0
    deg = torch.bincount(torch.cat([ds.edge_index[0], ds.edge_index[1]]), minlength=14541)
    assert int(deg.max()) == 7614


def test_amazon_computers_statistics_and_split(data_dir):
    from torch_geometric.io import read_npz
    root = data_dir("amazon-computers")
    ds = D.load("amazon_computers", root=root)
    assert (ds.num_nodes, ds.num_edges, ds.num_classes) == (13752, 287209, 10)
    assert ds.x.shape == (13752, 767) and ds.x.dtype == torch.float32
    assert [t.numel() for t in (ds.train_idx, ds.val_idx)] == [200, 300]
    assert ds.test_idx.numel() == 13752 - 500
    assert torch.bincount(ds.y[ds.train_idx]).tolist() == [20] * 10
    parts = torch.cat([ds.train_idx, ds.val_idx, ds.test_idx])
    assert torch.equal(parts.sort().values, torch.arange(13752))
    again = D.load("amazon-computers", root=root)
    other = D.load("amazon-computers", root=root, seed=1)
    assert torch.equal(again.train_idx, ds.train_idx)
    assert not torch.equal(other.train_idx, ds.train_idx)
    ref = read_npz(str(root / "amazon_electronics_computers.npz"))
    assert torch.equal(ds.x, ref.x) and torch.equal(ds.y, ref.y)
    assert ds.extra["class_names"][0] == "Desktops"


def test_github_musae_statistics(data_dir):
    ds = D.load("github-musae", root=data_dir("github-musae"))
    assert (ds.num_nodes, ds.num_edges, ds.num_classes) == (37700, 578006, 2)
    deg = _degree(ds)
    assert int(deg.max()) == 9458 and int((deg >= 1000).sum()) == 21
    assert ds.x is None and [t.numel() for t in (ds.train_idx, ds.val_idx, ds.test_idx)] == \
        [3770, 3770, 30160]


def test_dataset_builds_graph(aifb):
    graph = aifb.graph
    assert graph is aifb.graph and graph is not None


# ---------------------------------------------------------------- load() dispatch ----------

def test_unknown_name_lists_known():
    with pytest.raises(ValueError, match=r"unknown dataset name 'nope'.*aifb.*cora.*synthetic"):
        D.load("nope")
    with pytest.raises(TypeError, match="name must be a str"):
        D.load(3)
    assert {"aifb", "cora", "fb15k-237", "github-musae", "coauthor-physics"} <= set(D.names())


def test_synthetic_dispatch(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(load=lambda profile, **kw: calls.append((profile, kw)) or "ds")
    monkeypatch.setitem(sys.modules, "hector.datasets.synthetic", fake)
    monkeypatch.setattr(D, "synthetic", fake, raising=False)
    assert D.load("Synthetic:AIFB", seed=3, scale=0.5) == "ds"
    assert calls == [("aifb", {"seed": 3, "scale": 0.5})]
    with pytest.raises(ValueError, match="root does not apply"):
        D.load("synthetic:aifb", root="/tmp")


@pytest.mark.parametrize("name, missing", [
    ("aifb", "aifb_stripped.nt.gz"), ("mutag", "mutag_stripped.nt.gz"), ("cora", "ind.cora.x"),
    ("fb15k-237", "train.txt"), ("coauthor-cs", "ms_academic_cs.npz"),
    ("github-musae", "edges.csv")])
def test_missing_file(tmp_path, name, missing):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / missing))):
        D.load(name, root=tmp_path)


# ---------------------------------------------------------------- N-Triples and RDF --------

NT = """# comment line
<http://x/a> <http://x/p> <http://x/b> .
<http://x/a> <http://x/p> <http://x/b> .
_:n1 <http://x/q> "tab\\ther\\u00e9"@EN .
<http://x/b> <http://x/q> "tab\theré"@en .
<http://x/b> <http://x/r> "5"^^<http://www.w3.org/2001/XMLSchema#int> .
<http://x/b> <http://x/r> "5" .
<http://x/\\u0061> <http://x/p> _:n1 .

"""


def _write_rdf(folder, nt=NT, train="http://x/a\t0\tA\n", test="http://x/b\t1\tB\n"):
    folder.mkdir(exist_ok=True)
    (folder / "aifb_stripped.nt.gz").write_bytes(gzip.compress(nt.encode()))
    header = "person\tid\tlabel_affiliation\n"
    (folder / "trainingSet.tsv").write_text(header + train)
    (folder / "testSet.tsv").write_text(header + test)
    return folder


def test_ntriples_terms(tmp_path):
    ds = rdf.load_aifb(_write_rdf(tmp_path / "d"))
    # a, b, _:n1, one literal (escapes decoded, language case-folded), "5"^^int, plain "5".
    assert ds.num_nodes == 6 and ds.extra["num_triples"] == 6  # the duplicate line counts once
    assert ds.extra["relations"] == ["http://x/p", "http://x/q", "http://x/r"]
    assert ds.y.tolist() == [0, 1, -1, -1, -1, -1] and ds.num_classes == 2


def test_malformed_ntriples_line(tmp_path):
    bad = NT.replace('<http://x/b> <http://x/r> "5" .', '<http://x/b> "oops" <http://x/c> .')
    with pytest.raises(ValueError, match=r"aifb_stripped\.nt\.gz: line 7: malformed"):
        rdf.load_aifb(_write_rdf(tmp_path / "d", nt=bad))
    with pytest.raises(ValueError, match=r"line 2: invalid escape"):
        rdf.load_aifb(_write_rdf(tmp_path / "e", nt='\n<http://x/a> <http://x/p> "x\\q" .\n'))


def test_truncated_gzip(tmp_path):
    folder = _write_rdf(tmp_path / "d", nt=NT * 200)
    data = (folder / "aifb_stripped.nt.gz").read_bytes()
    (folder / "aifb_stripped.nt.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"aifb_stripped\.nt\.gz.*(corrupt|truncated)"):
        rdf.load_aifb(folder)
    (folder / "aifb_stripped.nt.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"aifb_stripped\.nt\.gz"):
        rdf.load_aifb(folder)


def test_labels_naming_unknown_node(tmp_path):
    with pytest.raises(ValueError, match=r"testSet\.tsv: line 2: node 'http://x/zzz' does not"):
        rdf.load_aifb(_write_rdf(tmp_path / "d", test="http://x/zzz\t1\tB\n"))
    with pytest.raises(ValueError, match=r"trainingSet\.tsv: line 2: 2 columns"):
        rdf.load_aifb(_write_rdf(tmp_path / "e", train="http://x/a\tA\n"))


# ---------------------------------------------------------------- Planetoid ----------------

def test_planetoid_citeseer_isolated_nodes_match_pyg(tmp_path):
    from torch_geometric.io import read_planetoid_data
    folder = _write_planetoid(tmp_path / "c")
    ds = planetoid.load_citeseer(folder)
    ref = read_planetoid_data(str(folder), "citeseer")
    assert ds.num_nodes == 515 and torch.equal(ds.x, ref.x) and torch.equal(ds.y, ref.y)
    assert torch.equal(ds.edge_index, ref.edge_index)  # self loop 2-2 and duplicates gone
    assert ds.edge_index.shape[1] == 8  # 0-1, 0-510, 1-2, 510-514, both ways
    assert ds.x[[511, 513]].abs().sum() == 0 and ds.test_idx.tolist() == [510, 512, 514]
    assert torch.equal(ds.val_idx, ref.val_mask.nonzero().view(-1))


def test_planetoid_refuses_code_in_pickle(tmp_path):
    folder = _write_planetoid(tmp_path / "c", name="cora")
    (folder / "ind.cora.graph").write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(pickle.UnpicklingError,
                       match=r"ind\.cora\.graph.*forbidden global os\.system"):
        planetoid.load_cora(folder)
    with pytest.raises(pickle.UnpicklingError, match=r"forbidden global builtins\.eval"):
        planetoid.RestrictedUnpickler(io.BytesIO(b"cbuiltins\neval\n(S'1'\ntR.")).load()


def test_planetoid_corrupt_and_nan(tmp_path):
    folder = _write_planetoid(tmp_path / "c", name="pubmed")
    data = (folder / "ind.pubmed.allx").read_bytes()
    (folder / "ind.pubmed.allx").write_bytes(data[:40])
    with pytest.raises(ValueError, match=r"ind\.pubmed\.allx: corrupt or truncated pickle"):
        planetoid.load_pubmed(folder)
    folder = _write_planetoid(tmp_path / "n", name="pubmed", nan=True)
    with pytest.raises(ValueError, match=r"ind\.pubmed\.x: matrix contains NaN"):
        planetoid.load_pubmed(folder)
    folder = _write_planetoid(tmp_path / "t", name="pubmed")
    (folder / "ind.pubmed.test.index").write_text("512\nfour\n")
    with pytest.raises(ValueError, match=r"ind\.pubmed\.test\.index: line 2"):
        planetoid.load_pubmed(folder)


# ---------------------------------------------------------------- npz, CSV, KG -------------

def test_npz_small_and_errors(tmp_path):
    ds = npz.load_npz(_write_npz(tmp_path / "g.npz"), seed=0)
    assert ds.edge_index.tolist() == [[0, 1, 1], [1, 0, 2]] and ds.x[2, 0] == 3
    nan = _write_npz(tmp_path / "nan.npz", attr_data=np.array([1, np.nan, 3], dtype=np.float32))
    with pytest.raises(ValueError, match=r"nan\.npz: attributes contain NaN"):
        npz.load_npz(nan)
    bad = tmp_path / "ms_academic_cs.npz"
    bad.write_bytes(_write_npz(tmp_path / "ok.npz").read_bytes()[:100])
    with pytest.raises(ValueError, match=r"ms_academic_cs\.npz: corrupt or truncated"):
        D.load("coauthor-cs", root=tmp_path)
    bad.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"ms_academic_cs\.npz"):
        D.load("coauthor-cs", root=tmp_path)


@pytest.mark.parametrize("edges, target, match", [
    ("id_1,id_2\n0,1\n1,x\n", "id,target\n0,0\n1,1\n", r"edges\.csv: bad row"),
    ("id_1,id_2\n0,1\n1,0,2\n", "id,target\n0,0\n1,1\n", r"edges\.csv: bad row"),
    ("a,b\n0,1\n", "id,target\n0,0\n1,1\n", r"edges\.csv: header"),
    ("id_1,id_2\n0,5\n", "id,target\n0,0\n1,1\n", r"edges\.csv: node id 5 does not appear"),
    ("id_1,id_2\n0,1\n", "id,target\n0,0\n1\n", r"target\.csv: line 3: 1 columns"),
    ("id_1,id_2\n0,1\n", "id,target\n0,0\n0,1\n", r"target\.csv: node ids must be"),
])
def test_edge_list_errors(tmp_path, edges, target, match):
    (tmp_path / "edges.csv").write_text(edges)
    (tmp_path / "target.csv").write_text(target)
    with pytest.raises(ValueError, match=match):
        edgelist.load_github_musae(tmp_path)


def test_edge_list_upstream_names(tmp_path):
    (tmp_path / "git_web_ml").mkdir()
    (tmp_path / "git_web_ml" / "musae_git_edges.csv").write_text("id_1,id_2\n0,1\n1,2\n")
    (tmp_path / "git_web_ml" / "musae_git_target.csv").write_text(
        "id,name,ml_target\n0,ann,0\n2,bob,1\n1,cy,1\n")
    ds = edgelist.load_github_musae(tmp_path)
    assert ds.num_edges == 4 and ds.y.tolist() == [0, 1, 1]


def test_kg_files_and_errors(tmp_path):
    (tmp_path / "train.txt").write_text("a\tr\tb\nb\ts\tc\n")
    (tmp_path / "valid.txt").write_text("c\tr\td\n")
    (tmp_path / "test.txt").write_text("a\tt\td\n")
    ds = kg.load_fb15k_237(tmp_path)
    assert ds.num_nodes == 4 and ds.num_relations == 3
    assert ds.edge_index.tolist() == [[0, 1], [1, 2]]
    assert ds.extra["test_triples"].tolist() == [[0], [2], [3]]
    (tmp_path / "valid.txt").write_text("c\tr\td\nc\tr\n")
    with pytest.raises(ValueError, match=r"valid\.txt: line 2: expected 3 tab-separated"):
        kg.load_fb15k_237(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "FB15k-237.tar.gz").write_bytes(gzip.compress(b"x" * 1000)[:50])
    with pytest.raises(ValueError, match=r"FB15k-237\.tar\.gz: corrupt or truncated"):
        kg.load_fb15k_237(tmp_path / "sub")
