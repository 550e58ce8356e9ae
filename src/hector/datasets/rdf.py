"""RDF entity-classification sets (AIFB, MUTAG, BGS, AM) from N-Triples and TSV label files.

The graph is built the way PyG's ``torch_geometric.datasets.Entities.process`` builds it, so
results are comparable with published R-GCN numbers:

* the triples form a *set* (an rdflib graph is one): duplicate lines count once;
* predicates are numbered by descending frequency over that set (ties broken by IRI, where PyG
  leaves them to hash order);
* every triple ``(s, p, o)`` gives the edge ``s -> o`` of relation ``2p`` and the inverse edge
  ``o -> s`` of relation ``2p + 1``;
* nodes are the union of subjects and objects, literals included, and edges are sorted by
  ``(src, dst, rel)``.

Where we deliberately differ: PyG numbers nodes in Python-set order (it changes between runs);
we number them by first appearance in the file, so ids are reproducible.  RDF terms are
compared exactly (IRI, blank node label, literal lexical form + language + datatype), whereas
rdflib normalises some typed literals' lexical forms and PyG keys its node table by ``str(term)``,
which merges an IRI with a literal of the same text; neither occurs in AIFB.

We parse N-Triples ourselves (no rdflib dependency): one compiled regular expression per line,
escape decoding only on lines that contain a backslash, and numpy for everything after parsing.
"""
from __future__ import annotations

import gzip
import re
import zlib
from array import array
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from .base import Dataset
from .download import require_file
from .tables import read_table

# (nodes column, label column) of the TSV files, as in PyG (the 'cateogory' typo is upstream's).
HEADERS = {
    "aifb": ("person", "label_affiliation"),
    "mutag": ("bond", "label_mutagenic"),
    "bgs": ("rock", "label_lithogenesis"),
    "am": ("proefschrift", "label_cateogory"),
}

# N-Triples (W3C RDF 1.1), written for speed and as lenient as rdflib's parser (which PyG uses)
# about IRI characters: IRIs exclude only whitespace, quotes and angle brackets; literals allow
# any escaped character; escapes are decoded afterwards.
_IRI = r"<([^<>\"\x00-\x20]*)>"
_BNODE = r"_:([^\s<>\"]+?)"
_LITERAL = r"\"((?:[^\"\\\n\r]|\\.)*)\"(?:@([A-Za-z]+(?:-[A-Za-z0-9]+)*)|\^\^" + _IRI + ")?"
_LINE = re.compile(
    r"[ \t]*(?:" + _IRI + "|" + _BNODE + r")[ \t]*" + _IRI + r"[ \t]*(?:"
    + _IRI + "|" + _BNODE + "|" + _LITERAL + r")[ \t]*\.[ \t]*(?:#.*)?\r?\n?$")
_BLANK = re.compile(r"[ \t]*(?:#.*)?\r?\n?$")
_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))", re.S)
_ECHAR = {"t": "\t", "b": "\b", "n": "\n", "r": "\r", "f": "\f", '"': '"', "'": "'", "\\": "\\"}


def _unescape(text: Optional[str], iri: bool, where: str) -> Optional[str]:
    """Decode UCHAR (both) and ECHAR (literals only) escapes; anything else is an error."""
    if text is None or "\\" not in text:
        return text

    def repl(m):
        if m.group(1) or m.group(2):
            return chr(int(m.group(1) or m.group(2), 16))
        c = m.group(3)
        if not iri and c in _ECHAR:
            return _ECHAR[c]
        raise ValueError(f"{where}: invalid escape '\\{c}' in N-Triples term")

    return _ESCAPE.sub(repl, text)


def parse_ntriples(path: Path) -> Tuple[np.ndarray, List[str], Dict[object, int]]:
    """Read a (gzipped) N-Triples file.

    Returns ``triples`` [T, 3] int64 (subject id, predicate id, object id; duplicates kept),
    the predicate IRIs in first-appearance order, and the node table mapping each term's key to
    its id (first-appearance order).  Keys: an IRI is its string, so TSV label files can look
    nodes up directly; a blank node is ``('_:', label)``; a literal ``('"', text, lang, dtype)``.
    A malformed line raises ``ValueError`` naming the file and line number.
    """
    path = Path(path)
    nodes: Dict[object, int] = {}
    preds: Dict[str, int] = {}
    # array('q') keeps 8 bytes per id where a list would keep a 36-byte int object (AM: ~6M
    # triples), and hands its buffer to numpy without a copy.
    subj, pred, obj = array("q"), array("q"), array("q")
    # Bound methods in locals: this loop runs once per line (millions for AM).
    match, node_id, pred_id = _LINE.match, nodes.setdefault, preds.setdefault
    add_s, add_p, add_o = subj.append, pred.append, obj.append
    opener = gzip.open if path.name.endswith(".gz") else open
    lineno = 0
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                m = match(line)
                if m is None:
                    if _BLANK.match(line):
                        continue
                    raise ValueError(f"{path}: line {lineno}: malformed N-Triples line: "
                                     f"{line.strip()[:120]!r}")
                si, sb, p, oi, ob, lit, lang, dt = m.groups()
                if "\\" in line:  # rare: decode escapes so equal terms get one id
                    where = f"{path}: line {lineno}"
                    si, p, oi, dt = (_unescape(t, True, where) for t in (si, p, oi, dt))
                    lit = _unescape(lit, False, where)
                sk = si if si is not None else ("_:", sb)
                if oi is not None:
                    ok = oi
                elif ob is not None:
                    ok = ("_:", ob)
                else:  # language tags compare case-insensitively (RDF 1.1)
                    ok = ('"', lit, lang.lower() if lang else None, dt)
                add_s(node_id(sk, len(nodes)))
                add_p(pred_id(p, len(preds)))
                add_o(node_id(ok, len(nodes)))
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{path}: cannot read (corrupt or truncated file near line "
                         f"{lineno + 1}): {e}") from e
    triples = np.stack([np.frombuffer(a, dtype=np.int64) for a in (subj, pred, obj)], axis=1) \
        if len(subj) else np.zeros((0, 3), dtype=np.int64)
    return triples, list(preds), nodes


def _unique_triples(triples: np.ndarray, num_nodes: int, num_preds: int) -> np.ndarray:
    """Deduplicate [T, 3] rows (an rdflib graph is a set), through one int64 key when it fits."""
    if num_nodes * num_nodes * max(num_preds, 1) < 2 ** 62:
        key = (triples[:, 0] * num_preds + triples[:, 1]) * num_nodes + triples[:, 2]
        key = np.unique(key)
        o = key % num_nodes
        rest = key // num_nodes
        return np.stack([rest // num_preds, rest % num_preds, o], axis=1)
    return np.unique(triples, axis=0)


def _read_labels(path: Path, node_col: str, label_col: str,
                 nodes: Optional[Dict[object, int]]) -> Tuple[List[int], List[str]]:
    """Node ids and label strings from a tab-separated label file (header row first)."""
    idx, labels = [], []
    for line, (node, label) in read_table(path, [node_col, label_col], delimiter="\t"):
        if nodes is not None:
            nid = nodes.get(node)
            if nid is None:
                raise ValueError(f"{path}: line {line}: node {node!r} does not occur in the graph")
            idx.append(nid)
        labels.append(label)
    return idx, labels


def load_entities(root, name: str) -> Dataset:
    """Load one of aifb, mutag, bgs, am from ``root`` holding ``<name>_stripped.nt.gz``,
    ``trainingSet.tsv`` and ``testSet.tsv`` (and optionally ``completeDataset.tsv``, whose
    labels then join the label vocabulary as in PyG).

    ``y`` is -1 on unlabeled nodes; classes are numbered in sorted order of their label strings.
    ``extra`` holds ``relations`` (predicate IRIs, relation ``2i`` is ``relations[i]`` forward
    and ``2i + 1`` its inverse), ``label_names``, ``train_y``, ``test_y`` and ``num_triples``.
    """
    name = name.lower()
    if name not in HEADERS:
        raise ValueError(f"name must be one of {sorted(HEADERS)}, got {name!r}")
    root = Path(root)
    graph_file = require_file(root, f"{name}_stripped.nt.gz")
    train_file = require_file(root, "trainingSet.tsv")
    test_file = require_file(root, "testSet.tsv")
    node_col, label_col = HEADERS[name]

    raw, pred_iris, nodes = parse_ntriples(graph_file)
    n, num_preds = len(nodes), len(pred_iris)
    triples = _unique_triples(raw, n, num_preds)

    # Relations by descending frequency over the triple set; ties by IRI, for determinism.
    freq = np.bincount(triples[:, 1], minlength=num_preds)
    order = sorted(range(num_preds), key=lambda i: (-int(freq[i]), pred_iris[i]))
    rank = np.empty(num_preds, dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(num_preds)
    rel = rank[triples[:, 1]]

    src = np.concatenate([triples[:, 0], triples[:, 2]])
    dst = np.concatenate([triples[:, 2], triples[:, 0]])
    etype = np.concatenate([2 * rel, 2 * rel + 1])
    num_rel = 2 * num_preds
    if n * n * max(num_rel, 1) < 2 ** 62:  # one int64 key sorts faster than lexsort
        perm = np.argsort((src * n + dst) * num_rel + etype, kind="stable")
    else:
        perm = np.lexsort((etype, dst, src))
    edge_index = torch.from_numpy(np.stack([src[perm], dst[perm]]))
    edge_type = torch.from_numpy(etype[perm])

    train_nodes, train_labels = _read_labels(train_file, node_col, label_col, nodes)
    test_nodes, test_labels = _read_labels(test_file, node_col, label_col, nodes)
    vocab = set(train_labels) | set(test_labels)
    complete = root / "completeDataset.tsv"
    if complete.exists():
        vocab |= set(_read_labels(complete, node_col, label_col, None)[1])
    label_names = sorted(vocab)
    label_id = {lab: i for i, lab in enumerate(label_names)}

    train_idx = torch.tensor(train_nodes, dtype=torch.long)
    test_idx = torch.tensor(test_nodes, dtype=torch.long)
    train_y = torch.tensor([label_id[v] for v in train_labels], dtype=torch.long)
    test_y = torch.tensor([label_id[v] for v in test_labels], dtype=torch.long)
    y = torch.full((n,), -1, dtype=torch.long)
    y[train_idx] = train_y
    y[test_idx] = test_y

    return Dataset(
        name=name, edge_index=edge_index, num_nodes=n, edge_type=edge_type,
        num_relations=num_rel, y=y, train_idx=train_idx, test_idx=test_idx,
        num_classes=len(label_names),
        extra={"relations": [pred_iris[i] for i in order], "label_names": label_names,
               "train_y": train_y, "test_y": test_y, "num_triples": int(triples.shape[0])})


def load_aifb(root) -> Dataset:
    return load_entities(root, "aifb")


def load_mutag(root) -> Dataset:
    return load_entities(root, "mutag")


def load_bgs(root) -> Dataset:
    return load_entities(root, "bgs")


def load_am(root) -> Dataset:
    return load_entities(root, "am")
