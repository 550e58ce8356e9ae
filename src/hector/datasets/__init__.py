"""Datasets: real graphs in their canonical formats, and synthetic graphs with named profiles.

``load(name)`` downloads into a cache (``$HECTOR_DATA/<name>``, default
``~/.cache/hector/<name>``) with checksums and safe extraction; ``load(name, root=folder)``
reads a local folder holding the upstream files instead.  ``load("synthetic:<profile>")``
generates a graph (``hector.datasets.synthetic``).
"""
from __future__ import annotations

import inspect
import os
from typing import List

from .base import Dataset
from .download import extract, fetch, sha256_of
from .registry import REGISTRY, cache_dir, ensure, loader, normalize

__all__ = ["Dataset", "load", "names", "fetch", "extract", "sha256_of", "cache_dir"]

_SYNTHETIC = "synthetic:"


def names() -> List[str]:
    """Names ``load`` accepts: the real datasets, then ``synthetic:<profile>`` for each profile
    the synthetic module declares (or the bare pattern while it is unavailable)."""
    out = sorted(REGISTRY)
    try:
        from . import synthetic
        profiles = getattr(synthetic, "PROFILES", None) or getattr(synthetic, "profiles", None)
        if callable(profiles):
            profiles = profiles()
        out += ([_SYNTHETIC + p for p in sorted(profiles)] if profiles
                else [_SYNTHETIC + "<profile>"])
    except ImportError:
        out.append(_SYNTHETIC + "<profile>")
    return out


def load(name: str, root=None, **kw) -> Dataset:
    """Load dataset ``name`` (case-insensitive, ``_`` accepted for ``-``).

    ``root``: a local folder holding the upstream files (e.g. ``/data/aifb``); when None the
    files are downloaded into the cache unless already there, and verified.  ``device``: move
    every tensor there.  Other keywords go to the loader (``seed`` picks the npz and GitHub
    random splits and is ignored by datasets with a fixed split) or, for
    ``synthetic:<profile>``, to ``synthetic.load(profile, **kw)`` (``seed``, ``device``,
    ``scale``).  An unknown name raises ``ValueError`` listing the known ones.
    """
    key = normalize(name)
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a folder path (str or os.PathLike), got "
                        f"{type(root).__name__}")
    if key.startswith(_SYNTHETIC):
        if root is not None:
            raise ValueError(f"root does not apply to synthetic datasets ({name!r}); "
                             "drop it")
        from . import synthetic  # lazy: the generator lives in its own module
        return synthetic.load(key[len(_SYNTHETIC):], **kw)
    if key not in REGISTRY:
        raise ValueError(f"unknown dataset name {name!r}; known names: "
                         f"{', '.join(sorted(REGISTRY))}, or 'synthetic:<profile>'")
    device = kw.pop("device", None)
    fn = loader(key)
    # ``seed`` is accepted for every dataset, so callers (the CLI, benchmarks) can pass one
    # uniformly; it matters only to loaders with a random split and is dropped for the rest,
    # whose data and split are fixed.
    if "seed" in kw and "seed" not in inspect.signature(fn).parameters:
        kw.pop("seed")
    if root is None and not REGISTRY[key].sources:
        raise ValueError(f"dataset {key!r} is a file format with no download: pass root=PATH "
                         "(CLI: --root PATH) naming the folder that holds the files")
    folder = ensure(key) if root is None else root
    ds = fn(folder, **kw)
    return ds.to(device) if device is not None else ds
