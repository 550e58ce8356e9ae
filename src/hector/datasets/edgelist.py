"""Edge-list CSV graphs: the GitHub developer network of MUSAE (Rozemberczki et al.).

Two files, under either name (the upstream zip puts the second pair in ``git_web_ml/``):
``edges.csv`` / ``musae_git_edges.csv`` (header ``id_1,id_2``, one undirected edge per row) and
``target.csv`` / ``musae_git_target.csv`` (header with ``id`` and ``target``, upstream
``ml_target``; other columns such as ``name`` are ignored).

Each undirected edge becomes two directed edges (289,003 rows -> 578,006 edges); the file has
no duplicates or self loops, and we add none and remove none.  There are no features
(``x=None``) and no official split: ``random_split`` gives a seeded 10% train / 10% val / 80%
test partition of the nodes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .base import Dataset
from .download import require_file
from .tables import read_table

EDGE_FILES = ("edges.csv", "musae_git_edges.csv")
TARGET_FILES = ("target.csv", "musae_git_target.csv")
TARGET_COLUMNS = ("target", "ml_target")


def random_split(num_nodes: int, seed: int = 0, train: float = 0.1, val: float = 0.1):
    """Seeded random node split: ``train`` and ``val`` fractions, the rest test (sorted ids)."""
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(num_nodes, generator=g)
    n_train, n_val = int(round(train * num_nodes)), int(round(val * num_nodes))
    return (perm[:n_train].sort().values, perm[n_train:n_train + n_val].sort().values,
            perm[n_train + n_val:].sort().values)


def _find(root: Path, names: Sequence[str]) -> Path:
    for name in names:
        try:
            return require_file(root, name)
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"dataset file not found: {root / names[0]} "
                            f"(nor {', '.join(str(root / n) for n in names[1:])})")


def read_edges(path: Path) -> np.ndarray:
    """[E, 2] int64 from a CSV with header ``id_1,id_2``; numpy's C parser does the rows."""
    with open(path, encoding="utf-8", errors="replace") as f:
        header = f.readline().strip().split(",")
        if [h.strip() for h in header] != ["id_1", "id_2"]:
            raise ValueError(f"{path}: header must be 'id_1,id_2', got {','.join(header)!r}")
        try:
            edges = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
        except ValueError as e:  # wrong column count or a non-integer id; numpy names the row
            raise ValueError(f"{path}: bad row (rows counted after the header): {e}") from e
    if edges.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if edges.shape[1] != 2:
        raise ValueError(f"{path}: expected 2 columns (id_1,id_2), got {edges.shape[1]}")
    if edges.min() < 0:
        raise ValueError(f"{path}: negative node id {int(edges.min())}")
    return edges


def read_targets(path: Path) -> np.ndarray:
    """Labels indexed by node id; the ids must be exactly 0..n-1 (each once)."""
    ids, targets = [], []
    for line, (node, target) in read_table(path, ["id", tuple(TARGET_COLUMNS)]):
        try:
            ids.append(int(node))
            targets.append(int(target))
        except ValueError:
            raise ValueError(f"{path}: line {line}: id and target must be integers, got "
                             f"{node!r}, {target!r}") from None
    n = len(ids)
    ids_a = np.asarray(ids, dtype=np.int64)
    if n and (ids_a.min() < 0 or ids_a.max() >= n or np.unique(ids_a).size != n):
        raise ValueError(f"{path}: node ids must be 0..{n - 1}, each once")
    y = np.empty(n, dtype=np.int64)
    y[ids_a] = targets
    if n and y.min() < 0:
        raise ValueError(f"{path}: negative target {int(y.min())}")
    return y


def load_github_musae(root, seed: int = 0) -> Dataset:
    """GitHub MUSAE from ``root``; ``seed`` picks the 10/10/80 random split."""
    root = Path(root)
    edge_file, target_file = _find(root, EDGE_FILES), _find(root, TARGET_FILES)
    y = read_targets(target_file)
    edges = read_edges(edge_file)
    n = y.shape[0]
    if edges.size and edges.max() >= n:
        raise ValueError(f"{edge_file}: node id {int(edges.max())} does not appear in "
                         f"{target_file} ({n} nodes)")
    edge_index = torch.from_numpy(np.concatenate([edges.T, edges.T[::-1]], axis=1).copy())
    train, val, test = random_split(n, seed=seed)
    y_t = torch.from_numpy(y)
    return Dataset(name="github-musae", edge_index=edge_index, num_nodes=n, y=y_t,
                   train_idx=train, val_idx=val, test_idx=test,
                   num_classes=int(y.max()) + 1 if n else 0)
