"""Planetoid citation graphs (Cora, CiteSeer, PubMed) from the ``ind.<name>.*`` files.

Read the way PyG's ``torch_geometric.io.read_planetoid_data`` reads them, so the public split
and every tensor match PyG exactly (the tests compare against it): features are ``allx``
followed by ``tx``, test rows are moved to their ``test.index`` positions, CiteSeer's isolated
test nodes (indices with no ``tx`` row) get zero features and label 0, self loops are removed
and duplicate edges merged.  One addition: the edge list is made symmetric, so the graph is
undirected by construction; the upstream adjacency lists already are, so this changes nothing
for the three public sets.

The files are Python-2 pickles.  Unpickling can run arbitrary code, so they go through
``RestrictedUnpickler``, which resolves only the handful of numpy/scipy/builtins names these
files reference and refuses everything else.
"""
from __future__ import annotations

import pickle
import zlib
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from . import sparse
from .base import Dataset
from .download import require_file

NAMES = ("cora", "citeseer", "pubmed")
_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph")


def _allowed():
    """(module, name) -> object.  Old and new spellings map to today's objects directly, so
    no deprecated module is imported and nothing outside this table can be reached."""
    import collections
    import copyreg

    import scipy.sparse as sp
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    table = {}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        table[(mod, "_reconstruct")] = multiarray._reconstruct
        table[(mod, "scalar")] = multiarray.scalar
    table[("numpy", "ndarray")] = np.ndarray
    table[("numpy", "dtype")] = np.dtype
    for mod in ("scipy.sparse.csr", "scipy.sparse._csr", "scipy.sparse"):
        table[(mod, "csr_matrix")] = sp.csr_matrix
    for mod in ("scipy.sparse.csc", "scipy.sparse._csc", "scipy.sparse"):
        table[(mod, "csc_matrix")] = sp.csc_matrix
    for mod in ("collections",):
        table[(mod, "defaultdict")] = collections.defaultdict
        table[(mod, "OrderedDict")] = collections.OrderedDict
    for mod in ("__builtin__", "builtins"):  # Python 2 and 3 names of the same module
        for name in ("list", "dict", "set", "frozenset", "tuple", "int", "float", "object"):
            table[(mod, name)] = getattr(__import__("builtins"), name)
    # Python 3 writes bytes into protocol-2 pickles as _codecs.encode(text, 'latin1'): a pure
    # string conversion, harmless, needed for files re-saved by Python 3.
    table[("_codecs", "encode")] = __import__("codecs").encode
    # Python 2 protocol-0/1 pickles of new-style objects rebuild them through this helper; it
    # only calls classes that themselves had to pass this table.
    for mod in ("copy_reg", "copyreg"):
        table[(mod, "_reconstructor")] = copyreg._reconstructor
    return table


class ForbiddenGlobal(pickle.UnpicklingError):
    """A pickle asked for a global outside the allow-list."""


class RestrictedUnpickler(pickle.Unpickler):
    """An ``Unpickler`` whose ``find_class`` admits only the names Planetoid files need.

    Anything else (``os.system``, ``builtins.eval``, ``subprocess.Popen`` ...) raises
    ``ForbiddenGlobal`` (a ``pickle.UnpicklingError``) naming the global, before it is
    imported or called.
    """
    _table = None

    def find_class(self, module, name):
        if RestrictedUnpickler._table is None:
            RestrictedUnpickler._table = _allowed()
        obj = RestrictedUnpickler._table.get((module, name))
        if obj is None:
            raise ForbiddenGlobal(f"forbidden global {module}.{name} in pickle: only "
                                  "numpy/scipy.sparse/builtins container names are allowed")
        return obj


def restricted_load(path) -> object:
    """Unpickle a (Python 2) pickle file through ``RestrictedUnpickler``.

    A forbidden global raises ``ForbiddenGlobal`` naming the file and the global; a truncated
    or otherwise unreadable pickle raises ``ValueError`` naming the file.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return RestrictedUnpickler(f, encoding="latin1").load()
    except ForbiddenGlobal as e:
        raise ForbiddenGlobal(f"{path}: {e}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, zlib.error) as e:
        raise ValueError(f"{path}: corrupt or truncated pickle: {type(e).__name__}: {e}") from e


def _matrix(obj, path: Path, limit: int):
    """Check one unpickled matrix; return (shape, densify), ``densify()`` giving the dense
    array.  Nothing touches a sparse matrix's buffers before its structure passed
    ``sparse.check_compressed``; densifying is deferred so every file's shape can be compared
    first (a mismatch then costs no memory)."""
    import scipy.sparse as sp
    if isinstance(obj, (sp.csr_matrix, sp.csc_matrix)):
        # Read the unpickled state directly: the object's methods assume it is consistent.
        state = vars(obj)
        by_row = isinstance(obj, sp.csr_matrix)
        parts = [state.get(k) for k in ("indptr", "indices", "data")]
        shape = sparse.check_compressed(*parts, state.get("_shape", state.get("shape")),
                                        str(path), by_row=by_row, limit=limit)
        return shape, lambda: sparse.to_dense(*parts, shape, by_row=by_row)
    if not isinstance(obj, np.ndarray) or obj.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D matrix, got {type(obj).__name__}")
    if obj.dtype == object:
        # Converting its elements would call methods of unchecked objects (a lying csr_matrix).
        raise ValueError(f"{path}: matrix holds Python objects, expected numbers")
    return obj.shape, lambda: obj


def _dense(obj, path: Path) -> torch.Tensor:
    try:
        out = torch.from_numpy(np.ascontiguousarray(obj, dtype=np.float32))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: matrix is not numeric: {e}") from e
    if not torch.isfinite(out).all():
        raise ValueError(f"{path}: matrix contains NaN or infinite values")
    return out


def _check_shapes(shapes, paths) -> None:
    """The six matrices must belong together before any is densified: features share a
    width, labels share a width, and each feature file has as many rows as its label file."""
    def clash(a, b, what, i):
        if shapes[a][i] != shapes[b][i]:
            raise ValueError(f"{paths[a]} has {shapes[a][i]} {what} but {paths[b]} has "
                             f"{shapes[b][i]}; the files do not belong together")
    for a, b in (("x", "allx"), ("tx", "allx"), ("y", "ally"), ("ty", "ally")):
        clash(a, b, "columns", 1)
    for a, b in (("x", "y"), ("tx", "ty"), ("allx", "ally")):
        clash(a, b, "rows", 0)
    if shapes["x"][0] > shapes["allx"][0]:
        raise ValueError(f"{paths['x']} has {shapes['x'][0]} rows, more than the "
                         f"{shapes['allx'][0]} of {paths['allx']}")


def _read_test_index(path: Path) -> torch.Tensor:
    values = []
    with open(path, encoding="ascii", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            text = line.strip()
            if not text:
                continue
            if not text.isdigit():
                raise ValueError(f"{path}: line {lineno}: expected a non-negative integer node "
                                 f"index, got {text[:40]!r}")
            values.append(int(text))
    if not values:
        raise ValueError(f"{path}: no test indices")
    return torch.tensor(values, dtype=torch.long)


def _edges_from_dict(graph, num_nodes: int, path: Path) -> torch.Tensor:
    if not isinstance(graph, dict):
        raise ValueError(f"{path}: expected a dict of adjacency lists, got {type(graph).__name__}")
    try:
        lengths = np.fromiter((len(v) for v in graph.values()), dtype=np.int64, count=len(graph))
        row = np.repeat(np.fromiter(graph.keys(), dtype=np.int64, count=len(graph)), lengths)
        col = np.fromiter((c for v in graph.values() for c in v), dtype=np.int64,
                          count=int(lengths.sum()))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: adjacency lists must hold integer node ids: {e}") from e
    for ids in (row, col):
        bad = ids[(ids < 0) | (ids >= num_nodes)]
        if bad.size:
            raise ValueError(f"{path}: node id {int(bad[0])} out of range for {num_nodes} nodes")
    # Symmetrise, drop self loops, merge duplicates; order by (dst, src) as PyG's coalesce
    # with sort_by_row=False does, so our edge_index equals PyG's entry for entry.
    src = np.concatenate([row, col])
    dst = np.concatenate([col, row])
    keep = src != dst
    key = np.unique(dst[keep] * num_nodes + src[keep])
    return torch.from_numpy(np.stack([key % num_nodes, key // num_nodes]))


def _find_files(root: Path, name: str):
    """part -> path of every ``ind.<name>.<part>`` file; all missing ones named at once."""
    paths, missing = {}, []
    for part in _PARTS + ("test.index",):
        try:
            paths[part] = require_file(root, f"ind.{name}.{part}")
        except FileNotFoundError:
            missing.append(str(root / f"ind.{name}.{part}"))
    if missing:
        raise FileNotFoundError(f"dataset file{'s' if len(missing) > 1 else ''} not found: "
                                f"{', '.join(missing)} ({name} needs all of "
                                f"{', '.join(f'ind.{name}.{p}' for p in _PARTS)} and "
                                f"ind.{name}.test.index)")
    return paths


def load_planetoid(root, name: str, max_elements: Optional[int] = None) -> Dataset:
    """Load ``cora``, ``citeseer`` or ``pubmed`` from ``root`` holding ``ind.<name>.*``.

    Returns x float32 [N, F], y long [N], the public split (train: the first ``len(y)`` nodes,
    20 per class; val: the next 500, fewer only in a graph too small for them; test: the
    1,000 ``test.index`` nodes, sorted).  Every matrix is validated before use (structure,
    shapes against each other, dense size within ``max_elements``, see ``sparse.max_elements``);
    a bad one raises ``ValueError`` naming its file.
    """
    name = name.lower()
    if name not in NAMES:
        raise ValueError(f"name must be one of {list(NAMES)}, got {name!r}")
    root = Path(root)
    paths = _find_files(root, name)
    raw = {p: restricted_load(paths[p]) for p in _PARTS}
    limit = sparse.max_elements(max_elements)
    recipes = {p: _matrix(raw[p], paths[p], limit) for p in _PARTS[:-1]}
    _check_shapes({p: r[0] for p, r in recipes.items()}, paths)
    x, tx, allx, y, ty, ally = (_dense(recipes[p][1](), paths[p]) for p in _PARTS[:-1])
    test_index = _read_test_index(paths["test.index"])
    sorted_test = test_index.sort().values
    if tx.shape[0] != test_index.numel() and name != "citeseer":
        raise ValueError(f"{paths['tx']} has {tx.shape[0]} rows but {paths['test.index']} "
                         f"lists {test_index.numel()} test nodes")

    if name == "citeseer":
        # Isolated test nodes have no tx/ty row: the test range gets zero rows where missing.
        lo = int(test_index.min())
        span = int(test_index.max()) - lo + 1
        if span * max(tx.shape[1], ty.shape[1], 1) > limit:
            raise ValueError(f"{paths['test.index']}: test indices span {span:,} nodes "
                             f"({lo}..{lo + span - 1}), too many to fill with zero rows "
                             f"(limit {limit:,} elements)")
        if tx.shape[0] != test_index.numel():
            raise ValueError(f"{paths['tx']} has {tx.shape[0]} rows but {paths['test.index']} "
                             f"lists {test_index.numel()} test nodes")
        tx_ext = tx.new_zeros(span, tx.shape[1])
        ty_ext = ty.new_zeros(span, ty.shape[1])
        tx_ext[sorted_test - lo] = tx
        ty_ext[sorted_test - lo] = ty
        tx, ty = tx_ext, ty_ext

    x = torch.cat([allx, tx], dim=0)
    labels = torch.cat([ally, ty], dim=0)
    n = x.shape[0]
    if int(test_index.max()) >= n:
        raise ValueError(f"{paths['test.index']}: index {int(test_index.max())} out of range "
                         f"for {n} nodes")
    # PyG's quirk, kept for identical data: row test_index[i] takes the row at sorted_test[i].
    x[test_index] = x[sorted_test]
    y_out = labels.argmax(dim=1)
    y_out[test_index] = y_out[sorted_test]

    edge_index = _edges_from_dict(raw["graph"], n, paths["graph"])
    num_train = y.shape[0]
    return Dataset(
        name=name, edge_index=edge_index, num_nodes=n, x=x, y=y_out,
        train_idx=torch.arange(num_train), val_idx=torch.arange(num_train, min(num_train + 500, n)),
        test_idx=sorted_test, num_classes=int(labels.shape[1]))


def load_cora(root, max_elements: Optional[int] = None) -> Dataset:
    return load_planetoid(root, "cora", max_elements)


def load_citeseer(root, max_elements: Optional[int] = None) -> Dataset:
    return load_planetoid(root, "citeseer", max_elements)


def load_pubmed(root, max_elements: Optional[int] = None) -> Dataset:
    return load_planetoid(root, "pubmed", max_elements)
