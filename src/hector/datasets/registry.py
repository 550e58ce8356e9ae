"""Where each dataset comes from, what its files should hash to, and the download cache.

Hashes marked known were computed from files identical to the upstream downloads; ``None``
means unknown, and the download falls back to trust on first use (``download.verify``).  For
archives we know only some inner files, so those are checked after extraction rather than the
archive itself.  Loader modules are imported lazily: loading Cora never imports the RDF parser.
"""
from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from .download import DownloadError, extract, fetch, made_folder, require_file, verify


@dataclass(frozen=True)
class Source:
    """One download: ``url`` saved as ``file`` in the cache folder.  An archive with
    ``inner`` set is extracted, the archive deleted, and ``inner`` (file name -> SHA-256 or
    None) names the files the loader needs, checked after extraction and on every later use."""
    url: str
    file: str
    sha256: Optional[str] = None
    inner: Optional[Dict[str, Optional[str]]] = None


@dataclass(frozen=True)
class Spec:
    module: str       # loader module inside hector.datasets
    function: str     # loader function, called as function(root, **kw)
    sources: Tuple[Source, ...] = field(default_factory=tuple)


_DGL = "https://data.dgl.ai/dataset/{}.tgz"  # the URL PyG's Entities downloads from
_PLANETOID = "https://github.com/kimiyoung/planetoid/raw/master/data/ind.{}.{}"
_NPZ = "https://github.com/shchur/gnn-benchmark/raw/master/data/npz/{}"

# Pinned only where our reference copy (../shared/data) came from the very URL we download:
# the Planetoid repository, ConvE's archive, gnn-benchmark.  The RDF sets (our copy is the
# gated-rgcn redistribution, the download is DGL's archive) and the MUSAE zip are trusted on
# first use: their hashes are recorded then and checked on every later use.
_KNOWN = {
    "ind.cora.allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
    "ind.cora.ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
    "ind.cora.graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
    "ind.cora.test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    "ind.cora.tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
    "ind.cora.ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
    "ind.cora.x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
    "ind.cora.y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
    "FB15k-237.tar.gz": "311df7930f842a02979eaa7a802484a6afe62303c07f915f1e6edbc30cbe05e8",
    "amazon_electronics_computers.npz":
        "e3a78127c122ce4a6a1bd6effb2112ec2b0ad1f795f5bd98bee206772777ca5e",
}


def _rdf(name: str) -> Spec:
    inner = {f"{name}_stripped.nt.gz": _KNOWN.get(f"{name}_stripped.nt.gz"),
             "trainingSet.tsv": _KNOWN.get(f"{name}/trainingSet.tsv"),
             "testSet.tsv": _KNOWN.get(f"{name}/testSet.tsv")}
    return Spec("rdf", f"load_{name}", (Source(_DGL.format(name), f"{name}.tgz", None, inner),))


def _planetoid(name: str) -> Spec:
    parts = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    return Spec("planetoid", f"load_{name}", tuple(
        Source(_PLANETOID.format(name, p), f"ind.{name}.{p}", _KNOWN.get(f"ind.{name}.{p}"))
        for p in parts))


def _kg(key: str, file: str) -> Spec:
    # ConvE's repository distributes the common KG benchmarks as one tar.gz each.
    return Spec("kg", f"load_{key.replace('-', '_')}", (Source(
        f"https://github.com/TimDettmers/ConvE/raw/master/{file}", file, _KNOWN.get(file)),))


def _npz(key: str, file: str) -> Spec:
    return Spec("npz", f"load_{key.replace('-', '_')}",
                (Source(_NPZ.format(file), file, _KNOWN.get(file)),))


REGISTRY: Dict[str, Spec] = {
    **{n: _rdf(n) for n in ("aifb", "mutag", "bgs", "am")},
    **{n: _planetoid(n) for n in ("cora", "citeseer", "pubmed")},
    **{key: _kg(key, file) for key, file in (
        ("fb15k-237", "FB15k-237.tar.gz"), ("wn18rr", "WN18RR.tar.gz"), ("fb15k", "FB15k.tar.gz"),
        ("wn18", "WN18.tar.gz"), ("yago3-10", "YAGO3-10.tar.gz"))},
    # Formats without a download: read from a local folder (root=...), labelled by its name.
    "triples": Spec("kg", "load_triples"),
    "geom-gcn": Spec("geom_gcn", "load_geom_gcn"),
    "ogb-node": Spec("ogb", "load_ogb_node"),
    "amazon-computers": _npz("amazon-computers", "amazon_electronics_computers.npz"),
    "amazon-photo": _npz("amazon-photo", "amazon_electronics_photo.npz"),
    "coauthor-cs": _npz("coauthor-cs", "ms_academic_cs.npz"),
    "coauthor-physics": _npz("coauthor-physics", "ms_academic_phy.npz"),
    "github-musae": Spec("edgelist", "load_github_musae", (Source(
        "https://snap.stanford.edu/data/git_web_ml.zip", "git_web_ml.zip", None,
        {"musae_git_edges.csv": None, "musae_git_target.csv": None}),)),
}


def normalize(name: str) -> str:
    """Case-insensitive, '_' accepted for '-'."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__} ({name!r})")
    return name.strip().lower().replace("_", "-")


def loader(key: str) -> Callable:
    spec = REGISTRY[key]
    return getattr(importlib.import_module(f"{__package__}.{spec.module}"), spec.function)


def cache_dir(key: str) -> Path:
    """``$HECTOR_DATA/<name>``, default ``~/.cache/hector/<name>``."""
    base = os.environ.get("HECTOR_DATA") or os.path.join("~", ".cache", "hector")
    return Path(base).expanduser() / key


def ensure(key: str, progress: bool = True) -> Path:
    """Make the cache folder of dataset ``key`` hold verified files; return the folder.

    Present files are re-verified (known hash, or their trust-on-first-use sidecar); missing
    ones are downloaded.  Archives are extracted into a temporary folder first and moved into
    place only after their inner files passed, so an interrupted run never leaves a partial
    file that a later run would trust.  A failed download raises one ``DownloadError`` naming
    the dataset and removes the cache folders it made that stayed empty.
    """
    root = cache_dir(key)
    try:
        with made_folder(root):
            _ensure_sources(key, root, progress)
    except DownloadError as e:
        raise DownloadError(e.url, e.reason, dataset=key) from None
    return root


def _ensure_sources(key: str, root: Path, progress: bool) -> None:
    for src in REGISTRY[key].sources:
        if src.inner is None:
            dest = root / src.file
            if dest.is_file():
                verify(dest, src.sha256)
            else:
                fetch(src.url, dest, src.sha256, progress=progress)
            continue
        present = {}
        for inner in src.inner:
            try:
                present[inner] = require_file(root, inner)
            except FileNotFoundError:
                break
        if len(present) == len(src.inner):
            for inner, path in present.items():
                verify(path, src.inner[inner])
            continue
        _download_archive(root, src, progress)


def _download_archive(root: Path, src: Source, progress: bool) -> None:
    archive = root / src.file
    if not archive.is_file():
        fetch(src.url, archive, src.sha256, progress=progress)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".extract-"))
    ok = False
    try:
        extract(archive, tmp)
        for inner, sha in src.inner.items():
            try:
                path = require_file(tmp, inner)
            except FileNotFoundError:
                raise ValueError(f"archive {archive} (from {src.url}) does not contain "
                                 f"{inner}") from None
            if sha is None:  # trust on first use across re-downloads: reuse a recorded hash
                try:
                    sha = require_file(root, inner + ".sha256").read_text().split()[0]
                except (FileNotFoundError, IndexError):
                    pass
            verify(path, sha)
        for entry in tmp.iterdir():
            target = root / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(entry, target)
        ok = True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        # On success the archive has served its purpose (PyG deletes it too); on failure a
        # kept archive would fail the same way forever, so the next load fetches it afresh.
        # Its trust-on-first-use sidecar stays, so a re-download is checked against it.
        if ok or archive.is_file():
            archive.unlink(missing_ok=True)
