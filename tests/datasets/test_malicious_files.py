"""Crafted dataset files: sparse matrices whose structure lies must be
refused with a ValueError naming the file, before any buffer is touched.  The crash case runs in
a subprocess, so an out-of-bounds write shows up as a failed test rather than a dead pytest."""
import io
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp

from hector.datasets import npz, planetoid

from dataset_files import write_npz, write_planetoid as _write_planetoid


def _tamper(matrix, **state):
    """A csr_matrix whose pickled state is overwritten as an attacker would: scipy's
    constructor is bypassed, exactly as unpickling bypasses it."""
    vars(matrix).update(state)
    return matrix


def _save(folder, part, obj, name="citeseer"):
    (folder / f"ind.{name}.{part}").write_bytes(pickle.dumps(obj, protocol=2))


def _good_x():
    return sp.csr_matrix(np.array([[1, 0, 1], [0, 1, 0]], dtype=np.float32))


BAD_X = {
    # a column index far outside a (2, 3) matrix: scipy's toarray writes out of bounds
    "huge column": (lambda m: _tamper(m, indices=np.array([0, 50_000_000, 1], np.int32)),
                    r"column index 50000000 is outside"),
    # small offsets: lands in the heap next to the buffer; silently corrupting before the fix
    "small offset": (lambda m: _tamper(m, indices=np.array([0, 2, 4], np.int32)),
                     r"column index 4 is outside"),
    "negative index": (lambda m: _tamper(m, indices=np.array([0, -1, 1], np.int32)),
                       r"column index -1 is outside"),
    "indptr decreases": (lambda m: _tamper(m, indptr=np.array([0, 3, 2], np.int32)),
                         r"indptr decreases at row 1"),
    "indptr too short": (lambda m: _tamper(m, indptr=np.array([0, 3], np.int32)),
                         r"indptr has 2 entries"),
    "indptr past nnz": (lambda m: _tamper(m, indptr=np.array([0, 2, 9], np.int32)),
                        r"indptr ends at 9 but there are 3 indices"),
    "indptr not from 0": (lambda m: _tamper(m, indptr=np.array([1, 2, 3], np.int32)),
                          r"indptr starts at 1"),
    "data too short": (lambda m: _tamper(m, data=np.array([1.0], np.float32)),
                       r"1 values"),
    "float indices": (lambda m: _tamper(m, indices=np.array([0.0, 2.0, 1.0])),
                      r"indices must be a 1-D integer array"),
    "negative shape": (lambda m: _tamper(m, _shape=(2, -3)), r"not two non-negative"),
    "huge shape": (lambda m: _tamper(m, _shape=(1 << 20, 1 << 20),
                                     indptr=np.r_[np.zeros(1 << 20, np.int32), 1],
                                     indices=np.zeros(1, np.int32), data=np.ones(1)),
                   r"over the limit"),
}


@pytest.mark.parametrize("case", sorted(BAD_X))
def test_planetoid_refuses_lying_sparse_matrix(tmp_path, case):
    folder = _write_planetoid(tmp_path / "c", name="citeseer")
    tamper, match = BAD_X[case]
    m = tamper(_good_x())
    _save(folder, "x", m)
    with pytest.raises(ValueError, match=r"ind\.citeseer\.x: .*" + match):
        planetoid.load_citeseer(folder)


def test_planetoid_out_of_bounds_write_in_subprocess(tmp_path):
    """A reported 496-byte file: column 50,000,000 in a (2, 2) matrix.  Before the fix the
    child died with SIGSEGV (exit -11); now it must print the ValueError and exit 0."""
    folder = _write_planetoid(tmp_path / "c", name="citeseer")
    m = sp.csr_matrix(np.eye(2, dtype=np.float32))
    m.indices[1] = 50_000_000
    _save(folder, "x", m)
    code = textwrap.dedent(f"""
        from hector.datasets import planetoid
        try:
            planetoid.load_citeseer({str(folder)!r})
        except ValueError as e:
            print("REFUSED", e)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, f"child died with {run.returncode}: {run.stderr[-2000:]}"
    assert "REFUSED" in run.stdout and "column index 50000000" in run.stdout


def test_planetoid_refuses_object_arrays(tmp_path):
    folder = _write_planetoid(tmp_path / "c", name="citeseer")
    hidden = np.empty((2, 1), dtype=object)
    hidden[0, 0], hidden[1, 0] = BAD_X["huge column"][0](_good_x()), 1.0
    _save(folder, "y", hidden)
    with pytest.raises(ValueError, match=r"ind\.citeseer\.y: matrix holds Python objects"):
        planetoid.load_citeseer(folder)


def test_planetoid_shapes_must_agree(tmp_path):
    folder = _write_planetoid(tmp_path / "c", name="citeseer")
    _save(folder, "x", sp.csr_matrix(np.ones((2, 4), dtype=np.float32)))  # allx has 3 columns
    with pytest.raises(ValueError,
                       match=r"ind\.citeseer\.x has 4 columns but .*ind\.citeseer\.allx has 3"):
        planetoid.load_citeseer(folder)
    folder = _write_planetoid(tmp_path / "d", name="citeseer")
    _save(folder, "ty", np.eye(2, dtype=np.int32)[[0, 1]])  # tx has 3 rows
    with pytest.raises(ValueError,
                       match=r"ind\.citeseer\.tx has 3 rows but .*ind\.citeseer\.ty has 2"):
        planetoid.load_citeseer(folder)


def test_planetoid_limit_is_configurable(tmp_path, monkeypatch):
    folder = _write_planetoid(tmp_path / "c", name="citeseer")
    with pytest.raises(ValueError, match=r"ind\.citeseer\.x: .*over the limit of 5"):
        planetoid.load_citeseer(folder, max_elements=5)
    monkeypatch.setenv("HECTOR_MAX_DENSE_ELEMENTS", "5")
    with pytest.raises(ValueError, match=r"over the limit of 5"):
        planetoid.load_citeseer(folder)
    monkeypatch.setenv("HECTOR_MAX_DENSE_ELEMENTS", "lots")
    with pytest.raises(ValueError, match=r"HECTOR_MAX_DENSE_ELEMENTS must be a positive"):
        planetoid.load_citeseer(folder)


def test_planetoid_csc_matrix_densifies_like_scipy(tmp_path):
    folder = _write_planetoid(tmp_path / "c", name="citeseer")
    ref = planetoid.load_citeseer(folder)
    allx = pickle.loads((folder / "ind.citeseer.allx").read_bytes())
    _save(folder, "allx", sp.csc_matrix(allx))
    assert (planetoid.load_citeseer(folder).x == ref.x).all()


def test_planetoid_names_every_missing_file(tmp_path):
    folder = _write_planetoid(tmp_path / "c", name="pubmed")
    for part in ("allx", "graph"):
        (folder / f"ind.pubmed.{part}").unlink()
    with pytest.raises(FileNotFoundError,
                       match=r"files not found: .*ind\.pubmed\.allx, .*ind\.pubmed\.graph \("):
        planetoid.load_pubmed(folder)


def test_npz_refuses_lying_csr(tmp_path):
    path = write_npz(tmp_path / "g.npz")
    arrays = dict(np.load(path))
    arrays["attr_shape"] = np.array([3, 1 << 40])
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"g\.npz: .*over the limit"):
        npz.load_npz(path)
    arrays["attr_shape"] = np.array([3, 2])
    arrays["attr_indices"] = arrays["attr_indices"].astype(np.float64)
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"g\.npz: .*attr.*indices must be a 1-D integer"):
        npz.load_npz(path)


def test_npz_array_header_claiming_terabytes(tmp_path):
    """An .npy header inside the npz that claims 2^40 entries: refused from the header, before
    numpy tries to allocate 8 TiB (a MemoryError traceback before the fix)."""
    import zipfile
    path = write_npz(tmp_path / "g.npz")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<i8", "fortran_order": False, "shape": (1 << 40,)})
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["adj_indices.npy"] = header.getvalue() + bytes(64)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    with pytest.raises(ValueError, match=r"g\.npz: array 'adj_indices' declares "
                                         r"8,796,093,022,208 bytes, over the cap"):
        npz.load_npz(path)
