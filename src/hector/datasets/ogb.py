"""OGB node-property datasets (ogbn-arxiv, ogbn-products, ...) in OGB's raw CSV layout, read
without the ``ogb`` package.

``root`` is the dataset folder as OGB unpacks it::

    raw/edge.csv.gz            one "src,dst" row per directed edge (no header)
    raw/num-node-list.csv.gz   the number of nodes (one row: the graph)
    raw/node-feat.csv.gz       optional: one row of floats per node
    raw/node-label.csv.gz      one row per node: an integer class, or several (multi-task),
                               NaN where unlabelled (stored as -1)
    split/<scheme>/{train,valid,test}.csv.gz   node indices, one per row

Edges are taken as stored (ogbn-arxiv is directed; add reverse edges yourself for an
undirected view).  ``scheme`` picks the split folder (default: the only one there is).
"""
from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .base import Dataset
from .download import require_file


def _csv(path: Path, dtype=np.float64) -> np.ndarray:
    """A headerless numeric CSV (optionally gzipped) as a 2-D array; errors name the file."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            arr = np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: corrupt or truncated file: {e}") from e
    except ValueError as e:
        raise ValueError(f"{path}: bad row: {e}") from e
    return arr


def _ids(arr: np.ndarray, path: Path, n: int, what: str) -> np.ndarray:
    if arr.size and (np.any(arr != np.floor(arr)) or arr.min() < 0 or arr.max() >= n):
        raise ValueError(f"{path}: {what} must be integers in [0, {n}), got values in "
                         f"[{arr.min()}, {arr.max()}]")
    return arr.astype(np.int64)


def _scheme(root: Path, scheme: Optional[str]) -> Path:
    split_root = root / "split"
    if not split_root.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {split_root} (OGB keeps the "
                                "split/<scheme>/train.csv.gz files there)")
    schemes = sorted(p.name for p in split_root.iterdir() if p.is_dir())
    if scheme is None:
        if len(schemes) != 1:
            raise ValueError(f"{split_root} holds split schemes {schemes}; pick one with "
                             "scheme=")
        scheme = schemes[0]
    if scheme not in schemes:
        raise ValueError(f"scheme {scheme!r} not found in {split_root}; available: {schemes}")
    return split_root / scheme


def load_ogb_node(root, name: Optional[str] = None, scheme: Optional[str] = None) -> Dataset:
    """An OGB node-property dataset from its raw CSV folder (see the module docstring);
    labelled ``name``, by default the folder's name (``ogbn_arxiv`` -> ``ogbn-arxiv``)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {root}")
    raw = root / "raw"
    count_path = require_file(raw, "num-node-list.csv.gz")
    counts = _csv(count_path, np.int64).reshape(-1)
    if counts.size != 1 or counts[0] < 0:
        raise ValueError(f"{count_path}: expected one non-negative node count (one graph), "
                         f"got {counts.tolist()[:5]}")
    n = int(counts[0])
    edge_path = require_file(raw, "edge.csv.gz")
    edges = _csv(edge_path)
    if edges.size and edges.shape[1] != 2:
        raise ValueError(f"{edge_path}: expected 2 columns (src,dst), got {edges.shape[1]}")
    edges = _ids(edges.reshape(-1, 2), edge_path, n, "node ids")

    x = None
    if (raw / "node-feat.csv.gz").is_file():
        feat_path = raw / "node-feat.csv.gz"
        feats = _csv(feat_path, np.float32)
        if feats.shape[0] != n or not np.all(np.isfinite(feats)):
            raise ValueError(f"{feat_path}: expected {n} rows of finite numbers, got "
                             f"{feats.shape[0]} rows")
        x = torch.from_numpy(feats)
    label_path = require_file(raw, "node-label.csv.gz")
    labels = _csv(label_path)
    if labels.shape[0] != n:
        raise ValueError(f"{label_path}: {labels.shape[0]} rows for {n} nodes")
    known = ~np.isnan(labels)
    if np.any(labels[known] < 0) or np.any(labels[known] != np.floor(labels[known])):
        raise ValueError(f"{label_path}: labels must be non-negative integers (or empty)")
    y = np.where(known, labels, -1).astype(np.int64)
    y = y[:, 0] if y.shape[1] == 1 else y

    folder = _scheme(root, scheme)
    parts = []
    for split in ("train", "valid", "test"):
        path = require_file(folder, f"{split}.csv.gz")
        parts.append(torch.from_numpy(_ids(_csv(path).reshape(-1), path, n, "node indices")))
    label = name or root.name.lower().replace("_", "-")
    return Dataset(name=label, edge_index=torch.from_numpy(edges.T.copy()), num_nodes=n, x=x,
                   y=torch.from_numpy(y), train_idx=parts[0], val_idx=parts[1],
                   test_idx=parts[2], num_classes=int(y.max()) + 1 if y.size else 0,
                   extra={"split_scheme": folder.name})
