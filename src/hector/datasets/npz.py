"""gnn-benchmark ``.npz`` graphs (Amazon Computers/Photo, Coauthor CS/Physics; Shchur et al.).

The file stores the adjacency and the attributes as CSR triplets (``adj_data``,
``adj_indices``, ``adj_indptr``, ``adj_shape``; ``attr_*`` likewise), ``labels`` and
``class_names``.  It is opened with ``allow_pickle=False``: some keys of some gnn-benchmark
files are pickled objects and are simply never touched.

Edges are taken exactly as stored: one edge per stored CSR entry, directed ``row -> col``, no
symmetrisation and no self-loop removal (Amazon Computers: 287,209 edges).  PyG's ``read_npz``
instead drops self loops and symmetrises (491,722 edges for Amazon Computers); callers who want
that can add the reverse edges themselves.  Features keep their stored values (PyG binarises
them with ``x[x > 0] = 1``; in the Amazon files every stored value is already 1).

The files carry no split; ``split_per_class`` makes the common one of Shchur et al. (20 train
and 30 validation nodes per class, the rest test), seeded.
"""
from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from .base import Dataset
from .download import require_file

FILES = {
    "amazon-computers": "amazon_electronics_computers.npz",
    "amazon-photo": "amazon_electronics_photo.npz",
    "coauthor-cs": "ms_academic_cs.npz",
    "coauthor-physics": "ms_academic_phy.npz",
}


def split_per_class(y: torch.Tensor, num_train: int = 20, num_val: int = 30, seed: int = 0):
    """Per class, a seeded random ``num_train`` train and ``num_val`` val nodes; the rest test.

    Vectorised: one random permutation, a stable sort by class, then each node's rank inside
    its class decides its part.  A class with fewer than ``num_train + num_val`` nodes gives all
    it has to train first, then val.  Nodes with a negative label are left out.
    """
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(y.numel(), generator=g)
    perm = perm[y[perm] >= 0]
    order = perm[torch.sort(y[perm], stable=True).indices]
    labels = y[order]
    counts = torch.bincount(labels)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.numel()) - starts[labels]
    train = order[rank < num_train].sort().values
    val = order[(rank >= num_train) & (rank < num_train + num_val)].sort().values
    test = order[rank >= num_train + num_val].sort().values
    return train, val, test


def _csr(f, prefix: str, path: Path):
    keys = [f"{prefix}_{k}" for k in ("data", "indices", "indptr", "shape")]
    missing = [k for k in keys if k not in f.files]
    if missing:
        raise ValueError(f"{path}: missing arrays {missing} (not a gnn-benchmark npz file)")
    data, indices, indptr, shape = (f[k] for k in keys)
    shape = tuple(int(s) for s in np.asarray(shape).reshape(-1))
    if len(shape) != 2 or indptr.ndim != 1 or indptr.shape[0] != shape[0] + 1:
        raise ValueError(f"{path}: {prefix}_indptr has {indptr.shape[0]} entries for "
                         f"{prefix}_shape {shape}; expected shape[0] + 1")
    nnz = int(indptr[-1]) if indptr.size else 0
    if (indices.shape[0] != nnz or data.shape[0] != nnz or indptr[0] != 0
            or np.any(np.diff(indptr) < 0)):
        raise ValueError(f"{path}: inconsistent CSR arrays for {prefix!r} (indptr ends at {nnz}, "
                         f"{indices.shape[0]} indices, {data.shape[0]} values)")
    if nnz and (indices.min() < 0 or indices.max() >= shape[1]):
        raise ValueError(f"{path}: {prefix}_indices has column {int(indices.max())} outside "
                         f"{prefix}_shape {shape}")
    rows = np.repeat(np.arange(shape[0], dtype=np.int64), np.diff(indptr).astype(np.int64))
    return rows, indices.astype(np.int64), data, shape


def load_npz(path, name: str = None, seed: int = 0) -> Dataset:
    """Load one gnn-benchmark npz file; see the module docstring for the choices made."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as f:
            row, col, _, (n, m) = _csr(f, "adj", path)
            if n != m:
                raise ValueError(f"{path}: adjacency is {n} x {m}, expected square")
            arow, acol, aval, (na, nf) = _csr(f, "attr", path)
            if "labels" not in f.files:
                raise ValueError(f"{path}: no 'labels' array (multi-label CSR labels are not "
                                 "supported)")
            labels = f["labels"]
            class_names = None
            if "class_names" in f.files:
                try:
                    class_names = [str(c) for c in f["class_names"]]
                except ValueError:  # stored as a pickled object array: not needed, skip
                    class_names = None
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{path}: corrupt or truncated npz file: {e}") from e
    except ValueError as e:
        if str(path) in str(e):
            raise
        raise ValueError(f"{path}: cannot read npz file: {e}") from e

    if na != n:
        raise ValueError(f"{path}: attributes have {na} rows but the adjacency has {n} nodes")
    if labels.ndim != 1 or labels.shape[0] != n or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{path}: labels must be {n} integers, got {labels.dtype} "
                         f"{labels.shape}")
    if not np.all(np.isfinite(aval)):
        raise ValueError(f"{path}: attributes contain NaN or infinite values")
    x = torch.zeros(n, nf, dtype=torch.float32)
    # Duplicate CSR entries add up, as in scipy's todense().
    x.index_put_((torch.from_numpy(arow), torch.from_numpy(acol)),
                 torch.from_numpy(aval.astype(np.float32)), accumulate=True)
    y = torch.from_numpy(labels.astype(np.int64))
    train, val, test = split_per_class(y, seed=seed)
    return Dataset(
        name=name or path.stem, edge_index=torch.from_numpy(np.stack([row, col])), num_nodes=n,
        x=x, y=y, train_idx=train, val_idx=val, test_idx=test,
        num_classes=int(y.max()) + 1 if n else 0,
        extra={"class_names": class_names} if class_names is not None else {})


def _make(key: str):
    def loader(root, seed: int = 0) -> Dataset:
        return load_npz(require_file(root, FILES[key]), name=key, seed=seed)
    loader.__name__ = f"load_{key.replace('-', '_')}"
    loader.__doc__ = (f"{key} from ``root/{FILES[key]}``; ``seed`` picks the 20/30-per-class "
                      "split.")
    return loader


load_amazon_computers = _make("amazon-computers")
load_amazon_photo = _make("amazon-photo")
load_coauthor_cs = _make("coauthor-cs")
load_coauthor_physics = _make("coauthor-physics")
