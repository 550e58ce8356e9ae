"""Knowledge-graph triple sets from ``train``/``valid``/``test`` text files.

Each line is ``head<TAB>relation<TAB>tail``.  A split's file is ``<split>.txt`` or, in the
original FB15k/WN18 releases, ``<prefix>-<split>.txt`` (``freebase_mtr100_mte100-train.txt``,
``wordnet-mlj12-train.txt``).  The files are read straight out of the dataset's archive
(``WN18RR.tar.gz`` ...) when that is what ``root`` holds (nothing is written to disk, so no
extraction safety question arises), or from the text files in ``root`` or one subfolder.

Named loaders label the data by the set they load (``wn18rr``, ``fb15k-237`` ...);
``load_triples`` reads any such folder or archive and labels it by its own name.
"""
from __future__ import annotations

import tarfile
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from .base import Dataset
from .download import extract_byte_cap

SPLITS = ("train", "valid", "test")
#: name -> archive file, as ConvE's repository distributes them.
ARCHIVES = {"fb15k-237": "FB15k-237.tar.gz", "wn18rr": "WN18RR.tar.gz", "fb15k": "FB15k.tar.gz",
            "wn18": "WN18.tar.gz", "yago3-10": "YAGO3-10.tar.gz"}
_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def _split_of(file_name: str) -> Optional[str]:
    """'train' for ``train.txt`` or ``<prefix>-train.txt``; None for other files."""
    if not file_name.endswith(".txt"):
        return None
    stem = file_name[:-4]
    for split in SPLITS:
        if stem == split or stem.endswith(("-" + split, "_" + split)):
            return split
    return None


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


def _read_texts(root: Path, archive_name: Optional[str]) -> Dict[str, Tuple[str, str]]:
    """split -> (where, text) from the archive or from plain files."""
    archive = root / archive_name if root.is_dir() and archive_name else root
    if archive.is_file() and archive.name.endswith(_TAR_SUFFIXES):
        return _read_archive(archive)
    out = {}
    for split in SPLITS:
        found = [p for pattern in ("*.txt", "*/*.txt") for p in sorted(root.glob(pattern))
                 if _split_of(p.name) == split and p.is_file()] if root.is_dir() else []
        # The top folder wins over a subfolder; more than one candidate on a level is ambiguous.
        top = [p for p in found if p.parent == root]
        found = top or found
        if not found:
            also = f" (nor {root / archive_name})" if archive_name else ""
            raise FileNotFoundError(f"dataset file not found: {root / (split + '.txt')}{also}")
        if len(found) > 1:
            raise ValueError(f"{root}: several {split} files: {', '.join(map(str, found))}; "
                             "point root at one dataset")
        out[split] = (str(found[0]), _decode(found[0].read_bytes(), str(found[0])))
    return out


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 text: {e}") from e


def _read_archive(archive: Path) -> Dict[str, Tuple[str, str]]:
    """The split files of a tar archive, read into memory.  A tar member's header size is
    exactly what reading it yields, so the extraction byte cap is checked against it first."""
    out = {}
    cap = extract_byte_cap()
    total = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            for m in tar.getmembers():
                base = m.name.rsplit("/", 1)[-1]
                split = _split_of(base)
                if split is None or not m.isfile():
                    continue
                if split in out:
                    raise ValueError(f"{archive}: more than one {base} inside ({m.name})")
                total += m.size
                if total > cap:
                    raise ValueError(f"{archive}: the triple files unpack to more than "
                                     f"{cap:,} bytes ($HECTOR_MAX_EXTRACT_BYTES)")
                out[split] = (f"{archive}:{m.name}", _decode(tar.extractfile(m).read(),
                                                              f"{archive}:{m.name}"))
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise ValueError(f"{archive}: corrupt or truncated archive: {e}") from e
    missing = [f"{s}.txt" for s in SPLITS if s not in out]
    if missing:
        raise ValueError(f"{archive}: archive lacks {', '.join(missing)}")
    return out


def load_triples(root, name: Optional[str] = None) -> Dataset:
    """Any knowledge graph stored as train/valid/test triple files: ``root`` is a folder with
    the files (or with only one ``.tar.gz`` holding them), or the archive itself.  Labelled
    ``name``, by default the archive's or else the folder's own name, lower-cased
    (``WN18RR.tar.gz`` -> ``wn18rr``).
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"dataset folder not found: {root}")
    archive = None
    if root.is_dir():
        archives = sorted(p.name for p in root.iterdir() if p.name.endswith(_TAR_SUFFIXES))
        has_text = any(_split_of(p.name) for p in root.glob("*.txt"))
        if len(archives) == 1 and not has_text:
            archive = archives[0]
    # Named after the archive when that is what holds the triples, else after the folder.
    label = archive or root.name
    for suffix in _TAR_SUFFIXES:
        if label.endswith(suffix) and (archive or root.is_file()):
            label = label[: -len(suffix)]
    return _load(root, archive, name or label.lower())


def _make(key: str):
    def loader(root) -> Dataset:
        return _load(Path(root), ARCHIVES[key], key)
    loader.__name__ = f"load_{key.replace('-', '_')}"
    loader.__doc__ = (f"{key} from ``root`` (a folder with ``{ARCHIVES[key]}`` or the train, "
                      "valid and test files); see ``_load`` for what the Dataset holds.")
    return loader


def _load(root: Path, archive: Optional[str], name: str) -> Dataset:
    """The triples of ``root`` (reading ``archive`` inside it when present), labelled ``name``.

    Entities and relations are numbered in first-appearance order over train, valid, test
    (head before tail within a triple).  ``edge_index``/``edge_type`` are the TRAIN triples
    (head -> tail); ``extra`` holds ``train_triples``, ``valid_triples``, ``test_triples`` as
    [3, n] long tensors (head, relation, tail), and ``entity_names``/``relation_names``.
    No labels: ``y`` is None and ``num_classes`` 0.
    """
    if not root.exists():
        raise FileNotFoundError(f"dataset folder not found: {root}")
    texts = _read_texts(root, archive)
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
        name=name, edge_index=train[[0, 2]].contiguous(), num_nodes=len(entity_names),
        edge_type=train[1].contiguous(), num_relations=len(relation_names),
        extra={"train_triples": train.contiguous(), "valid_triples": parts["valid"].contiguous(),
               "test_triples": parts["test"].contiguous(), "entity_names": entity_names,
               "relation_names": relation_names})


load_fb15k_237 = _make("fb15k-237")
load_wn18rr = _make("wn18rr")
load_fb15k = _make("fb15k")
load_wn18 = _make("wn18")
load_yago3_10 = _make("yago3-10")
