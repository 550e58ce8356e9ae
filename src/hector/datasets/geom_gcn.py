"""Geom-GCN's node-classification graphs (chameleon, squirrel, film/actor, cornell, texas,
wisconsin) in the layout of the geom-gcn repository's ``new_data/<name>/`` folders.

``out1_graph_edges.txt``: a header line (``node_id<TAB>node_id``), then one directed edge
``src<TAB>dst`` per line, taken as stored (no symmetrisation, duplicates kept).
``out1_node_feature_label.txt``: a header line, then ``id<TAB>features<TAB>label`` with the
features comma-separated: dense values, or, for film/actor, the indices of the non-zero
features of a 932-wide binary vector (``feature_format`` picks; by default ``indices`` for a
folder named film or actor).  Ids must be 0..n-1, each once.

Splits: the repository's ``<name>_split_0.6_0.2_<k>.npz`` files (``train_mask``,
``val_mask``, ``test_mask``) when one is in ``root`` or a subfolder (``split`` picks k);
otherwise a seeded random 60/20/20 node split.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .base import Dataset
from .download import require_file
from .edgelist import random_split

EDGES = "out1_graph_edges.txt"
NODES = "out1_node_feature_label.txt"
FILM_WIDTH = 932


def _rows(path: Path, fields: int):
    """(line number, fields) of every data line after the header; a wrong count names the
    line."""
    with open(path, encoding="utf-8") as f:
        if not f.readline().strip():
            raise ValueError(f"{path}: empty file (expected a header line)")
        for lineno, line in enumerate(f, 2):
            if not line.strip():
                continue
            parts = line.rstrip("\n\r").split("\t")
            if len(parts) != fields:
                raise ValueError(f"{path}: line {lineno}: expected {fields} tab-separated "
                                 f"fields, got {len(parts)}")
            yield lineno, parts


def _int(text: str, path: Path, lineno: int, what: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"{path}: line {lineno}: {what} must be a non-negative integer, got "
                         f"{text[:40]!r}")
    return int(text)


def _read_nodes(path: Path, feature_format: str):
    ids, labels, feats = [], [], []
    for lineno, (node, feat, label) in _rows(path, 3):
        ids.append(_int(node, path, lineno, "node id"))
        labels.append(_int(label, path, lineno, "label"))
        try:
            values = np.array([v for v in feat.split(",") if v.strip()], dtype=np.float64)
        except ValueError:
            raise ValueError(f"{path}: line {lineno}: features must be comma-separated "
                             f"numbers, got {feat[:60]!r}") from None
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{path}: line {lineno}: features contain NaN or infinite values")
        feats.append((lineno, values))
    n = len(ids)
    order = np.asarray(ids, dtype=np.int64)
    if n == 0 or order.max() >= n or np.unique(order).size != n:
        raise ValueError(f"{path}: node ids must be 0..{n - 1}, each once")
    if feature_format == "indices":
        width = FILM_WIDTH
        x = np.zeros((n, width), dtype=np.float32)
        for node, (lineno, values) in zip(order, feats):
            if values.size and (values.min() < 0 or values.max() >= width
                                or np.any(values != np.floor(values))):
                raise ValueError(f"{path}: line {lineno}: feature indices must be integers in "
                                 f"[0, {width})")
            x[node, values.astype(np.int64)] = 1.0
    else:
        widths = {v.size for _, v in feats}
        if len(widths) != 1:
            raise ValueError(f"{path}: rows have different feature counts {sorted(widths)}; "
                             "for index lists (film/actor) use feature_format='indices'")
        x = np.empty((n, widths.pop()), dtype=np.float32)
        x[order] = np.stack([v for _, v in feats])
    y = np.empty(n, dtype=np.int64)
    y[order] = labels
    return x, y


def _read_edges(path: Path, n: int) -> np.ndarray:
    edges = [(_int(a, path, ln, "source id"), _int(b, path, ln, "target id"))
             for ln, (a, b) in _rows(path, 2)]
    arr = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    if arr.size and arr.max() >= n:
        raise ValueError(f"{path}: node id {int(arr.max())} out of range for {n} nodes "
                         f"(from {NODES})")
    return arr.T.copy()


def _split_file(root: Path, split: int) -> Optional[Path]:
    found = sorted(root.glob(f"*_split_0.6_0.2_{split}.npz")) + sorted(
        root.glob(f"*/*_split_0.6_0.2_{split}.npz"))
    return found[0] if found else None


def _masks(path: Path, n: int):
    with np.load(path, allow_pickle=False) as f:
        out = []
        for key in ("train_mask", "val_mask", "test_mask"):
            if key not in f.files:
                raise ValueError(f"{path}: missing array {key!r}")
            mask = f[key]
            if mask.shape != (n,):
                raise ValueError(f"{path}: {key} has shape {mask.shape}, expected ({n},)")
            out.append(torch.from_numpy(np.flatnonzero(mask).astype(np.int64)))
    return out


def load_geom_gcn(root, name: Optional[str] = None, split: int = 0, seed: int = 0,
                  feature_format: Optional[str] = None) -> Dataset:
    """One geom-gcn graph from ``root`` (see the module docstring); labelled ``name``, by
    default the folder's name."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {root}")
    name = name or root.name.lower()
    if feature_format is None:
        feature_format = "indices" if name in ("film", "actor") else "dense"
    if feature_format not in ("dense", "indices"):
        raise ValueError(f"feature_format must be 'dense' or 'indices', got {feature_format!r}")
    nodes, edges = require_file(root, NODES), require_file(root, EDGES)
    x, y = _read_nodes(nodes, feature_format)
    n = y.shape[0]
    edge_index = _read_edges(edges, n)
    split_path = _split_file(root, split)
    if split_path is not None:
        train, val, test = _masks(split_path, n)
    else:
        train, val, test = random_split(n, seed=seed, train=0.6, val=0.2)
    return Dataset(name=name, edge_index=torch.from_numpy(edge_index), num_nodes=n,
                   x=torch.from_numpy(x), y=torch.from_numpy(y), train_idx=train,
                   val_idx=val, test_idx=test, num_classes=int(y.max()) + 1,
                   extra={"split_file": str(split_path) if split_path else None})
