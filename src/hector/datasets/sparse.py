"""Sparse matrices read from dataset files, checked before anything trusts their structure.

A CSR/CSC matrix is three arrays and a shape that a file can set to anything.  scipy's
``toarray`` (and any C loop like it) trusts ``indptr`` and ``indices``: a column index past the
shape writes outside the output buffer, which is a crash or, worse, silent heap corruption.  So
every compressed matrix a loader reads goes through ``check_compressed`` first (lengths, dtypes,
``indptr`` monotone from 0 to nnz, indices in range, dense size within a limit), and is then
densified by ``to_dense``, which uses only bounds-checked numpy operations.  Every error is a
``ValueError`` naming the file.

The dense-size limit (number of elements of the densified matrix) defaults to
``DEFAULT_MAX_ELEMENTS`` and can be raised with ``$HECTOR_MAX_DENSE_ELEMENTS`` or the loaders'
``max_elements`` keyword.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .download import positive_limit

#: 2^28 elements: 1 GiB as float32; the largest Planetoid matrix (PubMed) has 9.4 million.
DEFAULT_MAX_ELEMENTS = 1 << 28
ENV_MAX_ELEMENTS = "HECTOR_MAX_DENSE_ELEMENTS"


def max_elements(value: Optional[int] = None) -> int:
    """The dense-size limit: ``value`` when given, else ``$HECTOR_MAX_DENSE_ELEMENTS``, else
    ``DEFAULT_MAX_ELEMENTS``."""
    if isinstance(value, np.integer):
        value = int(value)
    return positive_limit(value, "max_elements", ENV_MAX_ELEMENTS, DEFAULT_MAX_ELEMENTS)


def check_shape(shape, where: str, limit: Optional[int]) -> Tuple[int, int]:
    """A 2-D shape of non-negative ints whose dense size is within ``limit`` elements (None:
    the matrix is never densified, so only its stored arrays, whose size the file pays for,
    take memory)."""
    try:
        dims = tuple(int(s) for s in np.asarray(shape).reshape(-1))
    except (TypeError, ValueError):
        raise ValueError(f"{where}: matrix shape {shape!r} is not a pair of integers") from None
    if len(dims) != 2 or min(dims) < 0:
        raise ValueError(f"{where}: matrix shape {dims} is not two non-negative sizes")
    if limit is not None and dims[0] * dims[1] > limit:
        raise ValueError(f"{where}: matrix shape {dims} has {dims[0] * dims[1]:,} elements, over "
                         f"the limit of {limit:,} (raise it with max_elements= or "
                         f"${ENV_MAX_ELEMENTS} if the file is genuine)")
    return dims


def check_compressed(indptr, indices, data, shape, where: str, by_row: bool = True,
                     limit: Optional[int] = None) -> Tuple[int, int]:
    """Validate a CSR (``by_row``) or CSC matrix given as arrays; return its shape.

    ``indptr`` has one entry per row (column for CSC) plus one, starts at 0, never decreases
    and ends at nnz; ``indices`` and ``data`` have nnz entries; every index is inside the
    shape; the dense size is within ``limit`` when one is given (see ``max_elements``)."""
    rows, cols = check_shape(shape, where, limit)
    major, minor = (rows, cols) if by_row else (cols, rows)
    kind = "row" if by_row else "column"
    for arr, name in ((indptr, "indptr"), (indices, "indices")):
        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or not (
                np.issubdtype(arr.dtype, np.integer) and arr.dtype != np.bool_):
            raise ValueError(f"{where}: {name} must be a 1-D integer array, got "
                             f"{_describe(arr)}")
    if not isinstance(data, np.ndarray) or data.ndim != 1 or not (
            np.issubdtype(data.dtype, np.number) or data.dtype == np.bool_):
        raise ValueError(f"{where}: data must be a 1-D numeric array, got {_describe(data)}")
    if indptr.shape[0] != major + 1:
        raise ValueError(f"{where}: indptr has {indptr.shape[0]} entries for a {kind} count of "
                         f"{major} (shape {(rows, cols)}); expected {major + 1}")
    if int(indptr[0]) != 0:
        raise ValueError(f"{where}: indptr starts at {int(indptr[0])}, expected 0")
    if major and np.any(indptr[1:] < indptr[:-1]):
        at = int(np.flatnonzero(indptr[1:] < indptr[:-1])[0])
        raise ValueError(f"{where}: indptr decreases at {kind} {at} "
                         f"({int(indptr[at])} -> {int(indptr[at + 1])})")
    nnz = int(indptr[-1])
    if indices.shape[0] != nnz or data.shape[0] != nnz:
        raise ValueError(f"{where}: indptr ends at {nnz} but there are {indices.shape[0]} "
                         f"indices and {data.shape[0]} values")
    if nnz:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= minor:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{where}: {'column' if by_row else 'row'} index {bad} is outside "
                             f"the matrix shape {(rows, cols)}")
    return rows, cols


def to_dense(indptr, indices, data, shape, by_row: bool = True) -> np.ndarray:
    """The float64 dense matrix of CHECKED compressed arrays (``check_compressed`` first).
    Duplicate entries add up, as in scipy.  Pure numpy: an index that somehow slipped through
    would raise, never write out of bounds."""
    rows, cols = shape
    major, minor = (rows, cols) if by_row else (cols, rows)
    lead = np.repeat(np.arange(major, dtype=np.int64), np.diff(indptr).astype(np.int64))
    flat = lead * minor + indices.astype(np.int64)
    out = np.bincount(flat, weights=data.astype(np.float64), minlength=major * minor)
    out = out.reshape(major, minor)
    return out if by_row else out.T


def coordinates(indptr, indices, by_row: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """(row, col) int64 of every stored entry of CHECKED compressed arrays, in storage order."""
    lead = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64),
                     np.diff(indptr).astype(np.int64))
    other = indices.astype(np.int64)
    return (lead, other) if by_row else (other, lead)


def _describe(arr) -> str:
    if isinstance(arr, np.ndarray):
        return f"a {arr.ndim}-D {arr.dtype} array"
    return type(arr).__name__
