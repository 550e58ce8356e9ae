"""Loaders for the common public layouts: named knowledge graphs and any
folder of triples, gnn-benchmark npz variants, geom-gcn edge lists, OGB's node-property CSVs.
Every fixture is a tiny folder written here; nothing is downloaded."""
import gzip
import io
import pathlib
import tarfile

import numpy as np
import pytest
import scipy.sparse as sp

import hector.datasets as D
from hector.datasets import npz

from dataset_files import write_npz

TRIPLES = {"train": "a\tr\tb\nb\ts\tc\n", "valid": "c\tr\td\n", "test": "a\tt\td\n"}


def _kg_archive(path, prefix=""):
    with tarfile.open(path, "w:gz") as tar:
        for split, text in TRIPLES.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{prefix}{split}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _check_kg(ds, name):
    assert ds.name == name
    assert ds.num_nodes == 4 and ds.num_relations == 3
    assert ds.edge_index.tolist() == [[0, 1], [1, 2]]
    assert ds.extra["test_triples"].tolist() == [[0], [2], [3]]


def test_wn18rr_archive_is_labelled_wn18rr(tmp_path):
    _kg_archive(tmp_path / "WN18RR.tar.gz")
    _check_kg(D.load("wn18rr", root=tmp_path), "wn18rr")
    # The archive itself through the generic loader: named after the archive.
    _check_kg(D.load("triples", root=tmp_path / "WN18RR.tar.gz"), "wn18rr")
    # A folder holding only that archive: the same.
    _check_kg(D.load("triples", root=tmp_path), "wn18rr")


def test_generic_triples_folder_with_prefixed_names(tmp_path):
    folder = tmp_path / "My-KG"
    folder.mkdir()
    for split, text in TRIPLES.items():     # the original FB15k file names
        (folder / f"freebase_mtr100_mte100-{split}.txt").write_text(text)
    _check_kg(D.load("triples", root=folder), "my-kg")
    _check_kg(D.load("fb15k", root=folder), "fb15k")
    (folder / "train.txt").write_text(TRIPLES["train"])
    with pytest.raises(ValueError, match=r"several train files"):
        D.load("triples", root=folder)


def test_format_loaders_need_root():
    for name in ("triples", "geom-gcn", "ogb-node"):
        with pytest.raises(ValueError, match=r"no download: pass root=PATH"):
            D.load(name)


# ---------------------------------------------------------------- npz variants -------------

def test_npz_adj_matrix_prefix_and_dense_attributes(tmp_path):
    ref = npz.load_npz(write_npz(tmp_path / "ref.npz"))
    arrays = dict(np.load(tmp_path / "ref.npz"))
    renamed = {k.replace("adj_", "adj_matrix.").replace("attr_", "attr_matrix."): v
               for k, v in arrays.items()}
    np.savez(tmp_path / "dotted.npz", **renamed)
    got = npz.load_npz(tmp_path / "dotted.npz")
    assert got.edge_index.tolist() == ref.edge_index.tolist() and (got.x == ref.x).all()
    dense = {k: v for k, v in renamed.items() if not k.startswith("attr_matrix.")}
    dense["attr_matrix"] = ref.x.numpy()
    np.savez(tmp_path / "dense.npz", **dense)
    assert (npz.load_npz(tmp_path / "dense.npz").x == ref.x).all()


class _Trap:
    """Unpickling this would create a file: proof that no pickled code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def test_npz_pickled_matrix_refused_without_unpickling(tmp_path):
    marker = tmp_path / "pickle-ran"
    arrays = dict(np.load(write_npz(tmp_path / "ref.npz")))
    arrays = {k: v for k, v in arrays.items() if not k.startswith("adj_")}
    trap = np.empty(2, dtype=object)
    trap[0], trap[1] = sp.csr_matrix(np.eye(3)), _Trap(marker)
    np.savez(tmp_path / "pickled.npz", adj_matrix=trap, **arrays)
    with pytest.raises(ValueError, match=r"pickled\.npz: array 'adj_matrix' is a pickled "
                                         r"Python object.*numpy\.savez"):
        npz.load_npz(tmp_path / "pickled.npz")
    assert not marker.exists()


# ---------------------------------------------------------------- geom-gcn -----------------

def _geom(folder, features, edges="node_id\tnode_id\n0\t1\n1\t2\n2\t0\n", split=True):
    folder.mkdir(parents=True)
    rows = "".join(f"{i}\t{f}\t{i % 2}\n" for i, f in reversed(list(enumerate(features))))
    (folder / "out1_node_feature_label.txt").write_text("node_id\tfeature\tlabel\n" + rows)
    (folder / "out1_graph_edges.txt").write_text(edges)
    if split:
        np.savez(folder / f"{folder.name}_split_0.6_0.2_0.npz",
                 train_mask=np.array([1, 0, 0]), val_mask=np.array([0, 1, 0]),
                 test_mask=np.array([0, 0, 1]))
    return folder


def test_geom_gcn_dense_features_and_split(tmp_path):
    ds = D.load("geom-gcn", root=_geom(tmp_path / "chameleon", ["1,0", "0,2", "3,0"]))
    assert ds.name == "chameleon" and ds.num_nodes == 3
    assert ds.x.tolist() == [[1, 0], [0, 2], [3, 0]] and ds.y.tolist() == [0, 1, 0]
    assert ds.edge_index.tolist() == [[0, 1, 2], [1, 2, 0]]
    assert (ds.train_idx.tolist(), ds.val_idx.tolist(), ds.test_idx.tolist()) == ([0], [1], [2])


def test_geom_gcn_film_index_features_and_random_split(tmp_path):
    ds = D.load("geom-gcn", root=_geom(tmp_path / "film", ["3,931", "", "0"], split=False))
    assert ds.x.shape == (3, 932) and ds.x[0].nonzero().view(-1).tolist() == [3, 931]
    assert ds.x[1].sum() == 0 and ds.x[2, 0] == 1
    parts = sorted(ds.train_idx.tolist() + ds.val_idx.tolist() + ds.test_idx.tolist())
    assert parts == [0, 1, 2]


@pytest.mark.parametrize("edges, match", [
    ("node_id\tnode_id\n0\t7\n", r"out1_graph_edges\.txt: node id 7 out of range for 3"),
    ("node_id\tnode_id\n0\t1\t2\n", r"out1_graph_edges\.txt: line 2: expected 2"),
    ("node_id\tnode_id\n0\tx\n", r"out1_graph_edges\.txt: line 2: target id must be"),
])
def test_geom_gcn_bad_edges(tmp_path, edges, match):
    with pytest.raises(ValueError, match=match):
        D.load("geom-gcn", root=_geom(tmp_path / "squirrel", ["1", "2", "3"], edges=edges))


# ---------------------------------------------------------------- OGB ----------------------

def _gz(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode()))


def _ogb(folder, labels="0\n1\nnan\n2\n", edges="0,1\n1,2\n3,0\n"):
    _gz(folder / "raw" / "edge.csv.gz", edges)
    _gz(folder / "raw" / "num-node-list.csv.gz", "4\n")
    _gz(folder / "raw" / "node-feat.csv.gz", "0.5,1\n1,0\n0,0\n2,2\n")
    _gz(folder / "raw" / "node-label.csv.gz", labels)
    for split, ids in (("train", "0\n1\n"), ("valid", "2\n"), ("test", "3\n")):
        _gz(folder / "split" / "time" / f"{split}.csv.gz", ids)
    return folder


def test_ogb_node_property_layout(tmp_path):
    ds = D.load("ogb-node", root=_ogb(tmp_path / "ogbn_tiny"))
    assert ds.name == "ogbn-tiny" and ds.num_nodes == 4 and ds.num_classes == 3
    assert ds.edge_index.tolist() == [[0, 1, 3], [1, 2, 0]]
    assert ds.x.tolist() == [[0.5, 1], [1, 0], [0, 0], [2, 2]]
    assert ds.y.tolist() == [0, 1, -1, 2]
    assert (ds.train_idx.tolist(), ds.val_idx.tolist(), ds.test_idx.tolist()) == ([0, 1], [2], [3])
    assert ds.extra["split_scheme"] == "time"


@pytest.mark.parametrize("kw, match", [
    ({"edges": "0,1\n1,9\n"}, r"edge\.csv\.gz: node ids must be integers in \[0, 4\)"),
    ({"labels": "0\n1\n"}, r"node-label\.csv\.gz: 2 rows for 4 nodes"),
    ({"edges": "0,1\n1\n"}, r"edge\.csv\.gz: bad row"),
])
def test_ogb_errors_name_the_file(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        D.load("ogb-node", root=_ogb(tmp_path / "ogbn_bad", **kw))


def test_kg_archive_read_in_memory_respects_the_byte_cap(tmp_path, monkeypatch):
    _kg_archive(tmp_path / "WN18RR.tar.gz")
    monkeypatch.setenv("HECTOR_MAX_EXTRACT_BYTES", "20")   # train.txt alone is 14 bytes
    with pytest.raises(ValueError, match=r"WN18RR\.tar\.gz: the triple files unpack to more "
                                         r"than 20 bytes"):
        D.load("wn18rr", root=tmp_path)
