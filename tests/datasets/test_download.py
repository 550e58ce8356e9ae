"""Downloads, checksums, safe extraction and the cache, all offline (file:// URLs)."""
import hashlib
import io
import os
import stat
import tarfile
import traceback
import urllib.error
import urllib.request
import zipfile

import pytest

import hector.datasets as D
from hector.datasets import download, registry
from hector.datasets.registry import Source, Spec


def _leftovers(folder):
    return [p.name for p in folder.iterdir() if p.name.endswith(".part")]


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "src" / "data.bin"
    path.parent.mkdir()
    path.write_bytes(b"hello graph" * 1000)
    return path


def test_sha256_of(source):
    assert download.sha256_of(source) == hashlib.sha256(source.read_bytes()).hexdigest()


def test_fetch_with_known_hash(source, tmp_path):
    dest = tmp_path / "out" / "data.bin"
    download.fetch(source.as_uri(), dest, download.sha256_of(source), progress=False)
    assert dest.read_bytes() == source.read_bytes()
    assert not dest.with_name("data.bin.sha256").exists() and not _leftovers(dest.parent)


def test_fetch_hash_mismatch_keeps_nothing(source, tmp_path):
    dest = tmp_path / "out" / "data.bin"
    actual = download.sha256_of(source)
    with pytest.raises(ValueError, match=rf"data\.bin: expected {'0' * 64} .*got {actual}"):
        download.fetch(source.as_uri(), dest, "0" * 64)
    assert not dest.exists() and not dest.parent.exists()   # nor the folder made for it


def test_fetch_trust_on_first_use(source, tmp_path):
    dest = tmp_path / "out" / "data.bin"
    download.fetch(source.as_uri(), dest, progress=False)
    digest = download.sha256_of(source)
    assert dest.with_name("data.bin.sha256").read_text().split() == [digest, "data.bin"]
    download.fetch(source.as_uri(), dest, progress=False)  # same bytes: accepted
    source.write_bytes(b"tampered")
    with pytest.raises(ValueError, match=rf"data\.bin: expected {digest} \(sidecar\)"):
        download.fetch(source.as_uri(), dest, progress=False)
    assert dest.read_bytes() == b"hello graph" * 1000  # the good copy is untouched
    dest.write_bytes(b"changed on disk")
    with pytest.raises(ValueError, match=r"data\.bin.*sidecar.*deleted"):
        download.verify(dest)
    assert not dest.exists()


def test_interrupted_download_leaves_no_file(source, tmp_path, monkeypatch):
    class Broken(io.BytesIO):
        headers = {"Content-Length": "100"}

        def read(self, n=-1):
            raise ConnectionResetError("connection dropped")

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, **kw: Broken())
    dest = tmp_path / "out" / "data.bin"
    with pytest.raises(download.DownloadError, match=r"example\.invalid/data\.bin \(connection "
                       r"dropped\).*--root PATH") as info:
        download.fetch("https://example.invalid/data.bin", dest)
    # one error, not chained to the network's (its reason is kept on it)
    assert info.value.__cause__ is None and isinstance(info.value.reason, ConnectionResetError)
    assert not dest.exists() and not dest.parent.exists()   # the folder made for it is gone


def _offline(monkeypatch):
    def offline(url, *a, **k):
        raise urllib.error.URLError("[Errno -2] Name or service not known")
    monkeypatch.setattr(urllib.request, "urlopen", offline)


@pytest.mark.parametrize("name, file", [("cora", "ind.cora.x"), ("aifb", "aifb.tgz")])
def test_offline_load_is_one_error_and_leaves_no_folder(name, file, tmp_path, monkeypatch):
    """No network, no root: one DownloadError naming the dataset, the URL and the way to a
    local folder, with no network traceback chained before it; the cache folders the load
    made (here $HECTOR_DATA itself too) are gone again."""
    _offline(monkeypatch)
    cache = tmp_path / "cache"
    monkeypatch.setenv("HECTOR_DATA", str(cache))
    with pytest.raises(download.DownloadError) as info:
        D.load(name)
    err = info.value
    text = str(err)
    assert f"dataset {name!r}" in text and f"https://" in text and file in text
    assert "--root PATH" in text and "root=PATH" in text and "Name or service not known" in text
    assert err.__cause__ is None and err.__suppress_context__
    shown = "".join(traceback.format_exception(err))
    assert shown.count("Traceback") == 1 and "URLError" not in shown, shown
    assert not cache.exists()


def test_failed_download_keeps_folders_it_did_not_make(tmp_path, monkeypatch):
    _offline(monkeypatch)
    (tmp_path / "cora").mkdir()                       # there before: stays, even empty
    monkeypatch.setenv("HECTOR_DATA", str(tmp_path))
    with pytest.raises(download.DownloadError, match="dataset 'cora'"):
        D.load("cora")
    assert (tmp_path / "cora").is_dir() and not list((tmp_path / "cora").iterdir())
    with pytest.raises(download.DownloadError):
        download.fetch("https://example.invalid/x.bin", tmp_path / "a" / "b" / "x.bin")
    assert not (tmp_path / "a").exists()


# ---------------------------------------------------------------- extraction ---------------

def _tar(path, members):
    """members: (TarInfo kwargs, bytes or None)."""
    with tarfile.open(path, "w:gz") as tar:
        for kw, data in members:
            info = tarfile.TarInfo(kw.pop("name"))
            for k, v in kw.items():
                setattr(info, k, v)
            info.size = len(data) if data is not None else 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def test_extract_good_archives(tmp_path):
    tgz = _tar(tmp_path / "a.tgz", [({"name": "d", "type": tarfile.DIRTYPE}, None),
                                     ({"name": "d/x.txt"}, b"x"), ({"name": "y.txt"}, b"yy")])
    out = download.extract(tgz, tmp_path / "t")
    assert sorted(p.relative_to(tmp_path / "t").as_posix() for p in out) == ["d/x.txt", "y.txt"]
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as zf:
        zf.writestr("sub/z.csv", "1,2\n")
    out = download.extract(tmp_path / "a.zip", tmp_path / "z")
    assert [p.read_text() for p in out] == ["1,2\n"]


@pytest.mark.parametrize("member, match", [
    ({"name": "../evil.txt"}, r"'\.\./evil\.txt'.*'\.\.' component"),
    ({"name": "ok/../../evil.txt"}, r"'ok/\.\./\.\./evil\.txt'"),
    ({"name": "/etc/evil.txt"}, r"'/etc/evil\.txt'.*absolute"),
    ({"name": "link", "type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}, r"'link'.*symbolic"),
    ({"name": "hard", "type": tarfile.LNKTYPE, "linkname": "x.txt"}, r"'hard'.*hard link"),
    ({"name": "dev", "type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}, r"'dev'.*device"),
    ({"name": "fifo", "type": tarfile.FIFOTYPE}, r"'fifo'.*FIFO"),
])
def test_extract_refuses_unsafe_tar(tmp_path, member, match):
    data = b"evil" if member.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else None
    tgz = _tar(tmp_path / "bad.tar.gz", [({"name": "x.txt"}, b"fine"), (member, data)])
    with pytest.raises(ValueError, match=match):
        download.extract(tgz, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []  # checked before anything was written
    assert not (tmp_path / "evil.txt").exists()


@pytest.mark.parametrize("name, mode, match", [
    ("../evil.txt", 0, r"'\.\./evil\.txt'.*'\.\.'"),
    ("/abs/evil.txt", 0, r"'/abs/evil\.txt'.*absolute"),
    ("C:\\evil.txt", 0, r"absolute"),
    ("link", stat.S_IFLNK | 0o777, r"'link'.*symbolic link"),
    ("dev", stat.S_IFCHR | 0o600, r"'dev'.*device"),
])
def test_extract_refuses_unsafe_zip(tmp_path, name, mode, match):
    with zipfile.ZipFile(tmp_path / "bad.zip", "w") as zf:
        zf.writestr("fine.txt", "ok")
        info = zipfile.ZipInfo(name)
        info.external_attr = mode << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(ValueError, match=match):
        download.extract(tmp_path / "bad.zip", tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_extract_corrupt_archive(tmp_path):
    (tmp_path / "broken.tgz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(ValueError, match=r"broken\.tgz"):
        download.extract(tmp_path / "broken.tgz", tmp_path / "out")
    (tmp_path / "broken.rar").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"unsupported archive type"):
        download.extract(tmp_path / "broken.rar", tmp_path / "out")


# ---------------------------------------------------------------- the cache ----------------

def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HECTOR_DATA", str(tmp_path))
    assert registry.cache_dir("cora") == tmp_path / "cora"
    monkeypatch.delenv("HECTOR_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert registry.cache_dir("cora") == tmp_path / "home" / ".cache" / "hector" / "cora"


def test_load_downloads_verifies_and_reuses_cache(data_dir, tmp_path, monkeypatch):
    cora = data_dir("cora")
    spec = registry.REGISTRY["cora"]
    local = Spec(spec.module, spec.function, tuple(
        Source((cora / s.file).as_uri(), s.file, s.sha256) for s in spec.sources))
    assert all(s.sha256 for s in local.sources)  # every Cora file has a known hash
    monkeypatch.setitem(registry.REGISTRY, "cora", local)
    monkeypatch.setenv("HECTOR_DATA", str(tmp_path))
    assert D.load("cora").num_edges == 10556
    assert sorted(p.name for p in (tmp_path / "cora").iterdir())[0] == "ind.cora.allx"
    monkeypatch.setattr(registry, "fetch", lambda *a, **k: pytest.fail("downloaded again"))
    assert D.load("cora", device="cpu").num_nodes == 2708  # from the cache
    (tmp_path / "cora" / "ind.cora.tx").write_bytes(b"tampered")
    with pytest.raises(ValueError, match=r"ind\.cora\.tx: expected b9afbaa4.*registry"):
        D.load("cora")
    assert not (tmp_path / "cora" / "ind.cora.tx").exists()


def test_rdf_archive_download_checks_inner_files(data_dir, tmp_path, monkeypatch):
    aifb = data_dir("aifb")
    files = {f: (aifb / f).read_bytes() for f in ("aifb_stripped.nt.gz", "trainingSet.tsv",
                                                  "testSet.tsv")}
    tgz = _tar(tmp_path / "aifb.tgz", [({"name": f}, b) for f, b in files.items()])
    spec = registry.REGISTRY["aifb"]
    # The registry trusts AIFB's inner files on first use; pin them here to test the check.
    inner = {f: D.sha256_of(aifb / f) for f in files}
    monkeypatch.setitem(registry.REGISTRY, "aifb", Spec(spec.module, spec.function, (
        Source(tgz.as_uri(), "aifb.tgz", None, inner),)))
    monkeypatch.setenv("HECTOR_DATA", str(tmp_path / "cache"))
    assert D.load("aifb").num_nodes == 8285
    root = tmp_path / "cache" / "aifb"
    assert not (root / "aifb.tgz").exists() and (root / "aifb.tgz.sha256").exists()
    assert D.load("aifb").num_edges == 58086  # cached inner files re-verified, no download
    # A new archive whose label file differs from the known hash is refused, nothing kept.
    (root / "trainingSet.tsv").unlink()
    (root / "aifb.tgz.sha256").unlink()
    files["trainingSet.tsv"] += b"extra\tline\there\n"
    _tar(tgz, [({"name": f}, b) for f, b in files.items()])
    with pytest.raises(ValueError, match=r"trainingSet\.tsv: expected " + inner["trainingSet.tsv"][:8]):
        D.load("aifb")
    assert not (root / "trainingSet.tsv").exists() and not (root / "aifb.tgz").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".extract-")]


def test_github_zip_download(data_dir, tmp_path, monkeypatch):
    musae = data_dir("github-musae")
    target = (musae / "target.csv").read_text().splitlines()[1:]
    with zipfile.ZipFile(tmp_path / "git_web_ml.zip", "w") as zf:
        zf.writestr("git_web_ml/musae_git_edges.csv", (musae / "edges.csv").read_bytes())
        zf.writestr("git_web_ml/musae_git_target.csv", "id,name,ml_target\n" + "".join(
            f"{i},user{i},{t}\n" for i, t in (row.split(",") for row in target)))
    spec = registry.REGISTRY["github-musae"]
    monkeypatch.setitem(registry.REGISTRY, "github-musae", Spec(spec.module, spec.function, (
        Source((tmp_path / "git_web_ml.zip").as_uri(), "git_web_ml.zip", None,
               spec.sources[0].inner),)))
    monkeypatch.setenv("HECTOR_DATA", str(tmp_path / "cache"))
    ds = D.load("github_musae", seed=1)
    assert (ds.num_nodes, ds.num_edges) == (37700, 578006)
    sidecar = tmp_path / "cache" / "github-musae" / "git_web_ml" / "musae_git_target.csv.sha256"
    assert sidecar.exists()  # unknown hash: recorded on first use
    # The archive is gone after extraction; its trust-on-first-use record stays.
    assert sorted(os.listdir(sidecar.parents[1])) == ["git_web_ml", "git_web_ml.zip.sha256"]


# ---------------------------------------------------------------- extraction caps ----------

def _bomb(path, members=1, size=8 << 20):
    """A small tar.gz of zeros: ~8 KiB per 8 MiB member, unpacking ~1000x."""
    with tarfile.open(path, "w:gz") as tar:
        for i in range(members):
            info = tarfile.TarInfo(f"d/zeros{i}.bin")
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    return path


def test_extract_refuses_decompression_bomb(tmp_path):
    bomb = _bomb(tmp_path / "bomb.tar.gz")
    assert bomb.stat().st_size < 64 << 10
    with pytest.raises(ValueError, match=r"bomb\.tar\.gz unpacks to more than 200x"):
        download.extract(bomb, tmp_path / "out")
    assert not any(p.is_file() for p in (tmp_path / "out").rglob("*"))  # partial file removed
    # The ratio is a knob: allowed explicitly, the same archive unpacks.
    files = download.extract(bomb, tmp_path / "ok", max_ratio=10_000)
    assert [f.stat().st_size for f in files] == [8 << 20]


def test_extract_caps_bytes_and_members(tmp_path, monkeypatch):
    small = _bomb(tmp_path / "small.tar.gz", members=5, size=1000)
    with pytest.raises(ValueError, match=r"declares 5,000 unpacked bytes, over the cap of 4,000"):
        download.extract(small, tmp_path / "a", max_bytes=4000)
    with pytest.raises(ValueError, match=r"more than 3 members"):
        download.extract(small, tmp_path / "b", max_members=3)
    monkeypatch.setenv("HECTOR_MAX_EXTRACT_MEMBERS", "4")
    with pytest.raises(ValueError, match=r"more than 4 members"):
        download.extract(small, tmp_path / "c")
    monkeypatch.setenv("HECTOR_MAX_EXTRACT_MEMBERS", "0")
    with pytest.raises(ValueError, match=r"HECTOR_MAX_EXTRACT_MEMBERS must be a positive"):
        download.extract(small, tmp_path / "d")
    monkeypatch.delenv("HECTOR_MAX_EXTRACT_MEMBERS")
    zpath = tmp_path / "z.zip"
    with zipfile.ZipFile(zpath, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(3):
            zf.writestr(f"f{i}.txt", b"x" * 3000)
    with pytest.raises(ValueError, match=r"z\.zip declares 9,000 unpacked bytes"):
        download.extract(zpath, tmp_path / "e", max_bytes=8000)
    assert len(download.extract(zpath, tmp_path / "f", max_bytes=9000)) == 3


def test_extract_counts_bytes_not_headers(tmp_path, monkeypatch):
    """A header that under-declares is caught while streaming: pretend every member declares
    0 bytes, as a lying zip central directory would."""
    zpath = tmp_path / "z.zip"
    with zipfile.ZipFile(zpath, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("big.txt", b"y" * 5000)
    monkeypatch.setattr(download._Limits, "declared", lambda self, total: None)
    with pytest.raises(ValueError, match=r"z\.zip unpacks to more than 4,000 bytes"):
        download.extract(zpath, tmp_path / "out", max_bytes=4000)
    assert not (tmp_path / "out" / "big.txt").exists()
