"""Knowledge-graph triple sets (FB15k-237) from ``train.txt``/``valid.txt``/``test.txt``.

Each line is ``head<TAB>relation<TAB>tail``.  The files are read straight out of
``FB15k-237.tar.gz`` when that is what ``root`` holds (nothing is written to disk, so no
extraction safety question arises), or from the three text files in ``root`` or one subfolder.
"""
from __future__ import annotations

import tarfile
import zlib
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch

from .base import Dataset

SPLITS = ("train", "valid", "test")
ARCHIVE = "FB15k-237.tar.gz"


def _split_lines(text: str, where: str) -> List[List[str]]:
    """Rows of three strings; a line without exactly three non-empty fields is an error."""
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    rows = [ln.split("\t") for ln in lines]
    ok = np.fromiter((len(r) == 3 and all(r) for r in rows), dtype=bool, count=len(rows))
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        raise ValueError(f"{where}: line {bad + 1}: expected 3 tab-separated fields "
                         f"(head, relation, tail), got {lines[bad][:120]!r}")
    return rows


def _read_texts(root: Path) -> Dict[str, Tuple[str, str]]:
    """split -> (where, text) from the archive or from plain files."""
    archive = root / ARCHIVE if root.is_dir() else root
    if archive.is_file() and archive.name.endswith((".tar.gz", ".tgz", ".tar")):
        return _read_archive(archive)
    out = {}
    for split in SPLITS:
        path = root / f"{split}.txt"
        if not path.is_file():
            nested = sorted(root.glob(f"*/{split}.txt")) if root.is_dir() else []
            if len(nested) != 1:
                raise FileNotFoundError(f"dataset file not found: {path} (nor {root / ARCHIVE})")
            path = nested[0]
        out[split] = (str(path), _decode(path.read_bytes(), str(path)))
    return out


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 text: {e}") from e


def _read_archive(archive: Path) -> Dict[str, Tuple[str, str]]:
    out = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for m in tar.getmembers():
                base = m.name.rsplit("/", 1)[-1]
                split = base[:-4] if base.endswith(".txt") else None
                if split not in SPLITS or not m.isfile():
                    continue
                if split in out:
                    raise ValueError(f"{archive}: more than one {base} inside ({m.name})")
                out[split] = (f"{archive}:{m.name}", _decode(tar.extractfile(m).read(),
                                                              f"{archive}:{m.name}"))
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise ValueError(f"{archive}: corrupt or truncated archive: {e}") from e
    missing = [f"{s}.txt" for s in SPLITS if s not in out]
    if missing:
        raise ValueError(f"{archive}: archive lacks {', '.join(missing)}")
    return out


def load_fb15k_237(root) -> Dataset:
    """FB15k-237 from ``root`` (a folder with ``FB15k-237.tar.gz`` or the three txt files).

    Entities and relations are numbered in first-appearance order over train, valid, test
    (head before tail within a triple).  ``edge_index``/``edge_type`` are the TRAIN triples
    (head -> tail); ``extra`` holds ``train_triples``, ``valid_triples``, ``test_triples`` as
    [3, n] long tensors (head, relation, tail), and ``entity_names``/``relation_names``.
    No labels: ``y`` is None and ``num_classes`` 0.
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"dataset folder not found: {root}")
    texts = _read_texts(root)
    per_split = {s: _split_lines(texts[s][1], texts[s][0]) for s in SPLITS}
    rows = [r for s in SPLITS for r in per_split[s]]
    sizes = [len(per_split[s]) for s in SPLITS]
    # First-appearance numbering through dicts: a hash lookup per token is several times
    # faster than np.unique's sort of 600k unicode strings, and there is no vectorised
    # string factorisation in numpy/torch.
    ents: Dict[str, int] = {}
    rels: Dict[str, int] = {}
    ids = np.fromiter((i for h, r, t in rows for i in (ents.setdefault(h, len(ents)),
                                                        rels.setdefault(r, len(rels)),
                                                        ents.setdefault(t, len(ents)))),
                      dtype=np.int64, count=3 * len(rows))
    triples = torch.from_numpy(ids.reshape(-1, 3).T.copy())
    entity_names, relation_names = list(ents), list(rels)
    parts = dict(zip(SPLITS, torch.split(triples, sizes, dim=1)))
    train = parts["train"]
    if train.shape[1] == 0:
        raise ValueError(f"{texts['train'][0]}: no training triples")
    return Dataset(
        name="fb15k-237", edge_index=train[[0, 2]].contiguous(), num_nodes=len(entity_names),
        edge_type=train[1].contiguous(), num_relations=len(relation_names),
        extra={"train_triples": train.contiguous(), "valid_triples": parts["valid"].contiguous(),
               "test_triples": parts["test"].contiguous(), "entity_names": entity_names,
               "relation_names": relation_names})
