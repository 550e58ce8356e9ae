"""Tiny dataset files in the upstream formats, written by the dataset tests (never downloaded)."""
from collections import defaultdict
import pickle

import numpy as np
import scipy.sparse as sp


def write_planetoid(folder, name="citeseer", nan=False):
    """A small Planetoid set: 510 allx rows (2 train), test nodes 512, 510, 514 (511 and 513
    isolated, as in CiteSeer); big enough for PyG's fixed 500 validation nodes."""
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    feats = (rng.random((513, 3)) > 0.5).astype(np.float32)
    if nan:
        feats[1, 1] = np.nan
    onehot = np.eye(2, dtype=np.int32)[rng.integers(0, 2, 513)]
    graph = defaultdict(list, {0: [1, 510, 510], 1: [0, 2], 2: [1, 2], 510: [0, 0, 514],
                               514: [510], 6: []})
    parts = {"x": sp.csr_matrix(feats[:2]), "allx": sp.csr_matrix(feats[:510]),
             "tx": sp.csr_matrix(feats[510:]), "y": onehot[:2], "ally": onehot[:510],
             "ty": onehot[510:], "graph": graph}
    for part, obj in parts.items():
        (folder / f"ind.{name}.{part}").write_bytes(pickle.dumps(obj, protocol=2))
    (folder / f"ind.{name}.test.index").write_text("512\n510\n514\n")
    return folder



def write_npz(path, attr_data=None):
    adj = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 1], [0, 0, 0]], dtype=np.float32))
    attr = sp.csr_matrix(np.array([[1, 0], [0, 2], [3, 0]], dtype=np.float32))
    data = attr.data if attr_data is None else attr_data
    np.savez(path, adj_data=adj.data, adj_indices=adj.indices, adj_indptr=adj.indptr,
             adj_shape=np.array(adj.shape), attr_data=data, attr_indices=attr.indices,
             attr_indptr=attr.indptr, attr_shape=np.array(attr.shape), labels=np.array([0, 1, 1]),
             class_names=np.array(["a", "b"]))
    return path
