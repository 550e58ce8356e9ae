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
from typing import Optional

import numpy as np
import torch

from . import sparse
from .base import Dataset
from .download import extract_byte_cap, require_file

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


#: Array-name prefixes of a CSR matrix, in the order tried: the original files use
#: ``adj_data`` ..., later gnn-benchmark files (cora_ml, citeseer, dblp ...) ``adj_matrix.data``.
PREFIXES = {"adj": ("adj_", "adj_matrix."), "attr": ("attr_", "attr_matrix.")}
_CSR_PARTS = ("data", "indices", "indptr", "shape")


def _declared_nbytes(f, key: str) -> int:
    """The bytes array ``key`` says it holds, from its .npy header alone: numpy allocates that
    much before reading, so a header claiming terabytes must be refused first."""
    member = key + ".npy"
    if member not in f.zip.namelist():
        return 0
    with f.zip.open(member) as fp:
        version = np.lib.format.read_magic(fp)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(fp)
    return int(np.prod(shape, dtype=object)) * dtype.itemsize


def _array(f, key: str, path: Path) -> np.ndarray:
    """``f[key]``; an array whose header claims more than the extraction byte cap is refused
    before numpy allocates it, and a pickled object array by name (never unpickled: it could
    run code), with what to do about it."""
    cap = extract_byte_cap()
    declared = _declared_nbytes(f, key)
    if declared > cap:
        raise ValueError(f"{path}: array {key!r} declares {declared:,} bytes, over the cap of "
                         f"{cap:,} ($HECTOR_MAX_EXTRACT_BYTES)")
    try:
        return f[key]
    except ValueError as e:
        if "allow_pickle" not in str(e) and "Object arrays" not in str(e):
            raise
        raise ValueError(
            f"{path}: array {key!r} is a pickled Python object (e.g. a whole scipy matrix); "
            "hector never unpickles dataset files because unpickling can run code. Re-save it "
            f"as plain arrays ({key}.data, {key}.indices, {key}.indptr, {key}.shape, or a "
            "dense numeric array) with numpy.savez") from None


def _matrix(f, what: str, path: Path, limit: Optional[int]):
    """(rows, cols, values, shape) of the stored entries of matrix ``what`` ('adj' or
    'attr'), from CSR arrays under any known prefix or from a dense ``<what>_matrix`` array;
    None when the file has neither.  ``limit``: the dense-size cap for a matrix that will be
    densified (None for the adjacency, which never is)."""
    for prefix in PREFIXES[what]:
        keys = [prefix + k for k in _CSR_PARTS]
        if all(k in f.files for k in keys):
            data, indices, indptr, shape = (_array(f, k, path) for k in keys)
            shape = sparse.check_compressed(indptr, indices, data, shape,
                                            f"{path}: {prefix}*", limit=limit)
            rows, cols = sparse.coordinates(indptr, indices)
            return rows, cols, data, shape
    for key in (f"{what}_matrix", what):
        if key in f.files:
            dense = _array(f, key, path)
            if dense.ndim != 2 or not np.issubdtype(dense.dtype, np.number):
                raise ValueError(f"{path}: {key} must be a 2-D numeric matrix, got "
                                 f"{dense.ndim}-D {dense.dtype}")
            shape = sparse.check_shape(dense.shape, f"{path}: {key}", limit)
            rows, cols = np.nonzero(dense)
            return rows.astype(np.int64), cols.astype(np.int64), dense[rows, cols], shape
    return None


def _labels(f, path: Path) -> np.ndarray:
    if "labels" in f.files:
        return _array(f, "labels", path)
    if any(k.startswith("labels") for k in f.files):
        raise ValueError(f"{path}: labels are stored as a sparse (multi-label) matrix, which "
                         "is not supported; a 1-D integer 'labels' array is needed")
    raise ValueError(f"{path}: no 'labels' array")


def load_npz(path, name: str = None, seed: int = 0, max_elements: Optional[int] = None) -> Dataset:
    """Load one gnn-benchmark npz file; see the module docstring for the choices made.

    Accepted layouts: CSR arrays named ``adj_*``/``attr_*`` or ``adj_matrix.*``/
    ``attr_matrix.*``, or a dense ``attr_matrix``; no attributes gives ``x=None``.  Every CSR
    matrix is validated before use, and the features' dense size is capped by
    ``max_elements`` (see ``sparse.max_elements``).  Pickled object arrays are refused."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    limit = sparse.max_elements(max_elements)
    try:
        with np.load(path, allow_pickle=False) as f:
            adj = _matrix(f, "adj", path, None)
            if adj is None:
                wanted = " or ".join(p + "{data,indices,indptr,shape}" for p in PREFIXES["adj"])
                raise ValueError(f"{path}: no adjacency (expected arrays {wanted}; not a "
                                 "gnn-benchmark npz file)")
            row, col, _, (n, m) = adj
            if n != m:
                raise ValueError(f"{path}: adjacency is {n} x {m}, expected square")
            attr = _matrix(f, "attr", path, limit)
            labels = _labels(f, path)
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

    if labels.ndim != 1 or labels.shape[0] != n or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{path}: labels must be {n} integers, got {labels.dtype} "
                         f"{labels.shape}")
    x = None
    if attr is not None:
        arow, acol, aval, (na, nf) = attr
        if na != n:
            raise ValueError(f"{path}: attributes have {na} rows but the adjacency has {n} "
                             "nodes")
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
    def loader(root, seed: int = 0, max_elements: Optional[int] = None) -> Dataset:
        return load_npz(require_file(root, FILES[key]), name=key, seed=seed,
                        max_elements=max_elements)
    loader.__name__ = f"load_{key.replace('-', '_')}"
    loader.__doc__ = (f"{key} from ``root/{FILES[key]}``; ``seed`` picks the 20/30-per-class "
                      "split.")
    return loader


load_amazon_computers = _make("amazon-computers")
load_amazon_photo = _make("amazon-photo")
load_coauthor_cs = _make("coauthor-cs")
load_coauthor_physics = _make("coauthor-physics")
