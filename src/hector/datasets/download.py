"""Downloading and unpacking dataset files safely.

Three guarantees, because dataset files come from third-party servers:

* ``fetch`` never leaves a half-written file under the final name: it streams into a temporary
  file in the destination folder and renames it only after the whole body arrived and its
  SHA-256 matched.
* Integrity.  When our registry knows a file's SHA-256, a mismatch is an error.  When it does
  not, we fall back to *trust on first use*: the hash of the first download is recorded in a
  ``<file>.sha256`` sidecar next to the file, and every later download or use of that file is
  checked against it, so a file that changes upstream or on disk afterwards is caught.
* ``extract`` refuses archive members that could write outside the destination or create
  special files (absolute paths, ``..`` components, symbolic and hard links, devices, FIFOs),
  checking every member before writing anything, and caps the member count, the total
  unpacked size and the unpack ratio (decompression bombs), counting the bytes it writes.
"""
from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import stat
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import List, Optional, Union

PathLike = Union[str, os.PathLike]

_CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A dataset file could not be downloaded (no network, DNS failure, HTTP error, timeout).
    The message names the dataset (when known), the URL and the reason, and says how to read
    a local copy instead; the CLI prints it as one line.  It is raised without the network
    error chained (``reason`` keeps it): the message already says all it says, and a chained
    traceback buried that line under two screens of urllib internals."""

    def __init__(self, url: str, reason: object, dataset: Optional[str] = None):
        self.url, self.reason, self.dataset = url, reason, dataset
        what = f" for dataset {dataset!r}" if dataset else ""
        super().__init__(f"download failed{what}: could not fetch {url} ({reason}); to read a "
                         "local copy instead, pass --root PATH (or root=PATH to "
                         "hector.datasets.load) naming the folder that holds the dataset files")


@contextlib.contextmanager
def made_folder(path: Path):
    """``mkdir -p path`` for the block; when the block fails, the folders this made that are
    still empty are removed again (a failed download leaves no empty cache folder behind;
    complete, verified files that did arrive stay, with their folders, for the next try)."""
    made = []
    p = path
    while not p.exists() and p != p.parent:
        made.append(p)        # deepest first
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        for folder in made:
            try:
                folder.rmdir()
            except OSError:   # not empty: kept, and so are its parents
                break
        raise


# What a failing server or network raises (URLError covers HTTPError and DNS failures); a
# local write error (disk full) is not among them and keeps its own type.
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError,
                   TimeoutError)


def sha256_of(path: PathLike) -> str:
    """The hex SHA-256 of a file, read in 1 MiB chunks (large archives never sit in memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _read_sidecar(path: Path) -> Optional[str]:
    side = _sidecar(path)
    if not side.exists():
        return None
    text = side.read_text().split()
    if not text or len(text[0]) != 64:
        raise ValueError(f"checksum sidecar {side} is malformed; delete it and {path.name} "
                         "to download again")
    return text[0].lower()


def _write_sidecar(path: Path, digest: str) -> None:
    # Same layout as `sha256sum` output, so `sha256sum -c` can check it too.
    _sidecar(path).write_text(f"{digest}  {path.name}\n")


def _mismatch(path: Path, expected: str, actual: str, where: str,
              fate: str = "the file was deleted, load again to download it afresh") -> ValueError:
    return ValueError(f"SHA-256 mismatch for {path}: expected {expected} ({where}), got {actual}; "
                      f"{fate}")


def verify(path: PathLike, sha256: Optional[str] = None) -> str:
    """Check an existing file against ``sha256``, or trust-on-first-use when it is None.

    With ``sha256=None`` the file is checked against its ``<file>.sha256`` sidecar when one
    exists, and a sidecar is recorded otherwise.  On a mismatch the file is deleted (so the next
    load downloads it again) and a ``ValueError`` names the file and both hashes.
    """
    path = Path(path)
    actual = sha256_of(path)
    expected, where = (sha256.lower(), "registry") if sha256 else (_read_sidecar(path), "sidecar")
    if expected is None:
        _write_sidecar(path, actual)
    elif actual != expected:
        path.unlink()
        raise _mismatch(path, expected, actual, where)
    return actual


def fetch(url: str, dest_path: PathLike, sha256: Optional[str] = None,
          progress: bool = True, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest_path`` and return the path.

    The body is streamed (with a tqdm progress bar when ``progress``) into a temporary file in
    the destination folder and hashed on the way; only a complete download whose SHA-256
    matches is renamed to ``dest_path`` (an atomic rename on one file system).  When ``sha256``
    is given and differs, a ``ValueError`` names the file and the expected and actual hashes and
    nothing is kept.  When ``sha256`` is None, trust on first use: the hash is compared with the
    ``<dest>.sha256`` sidecar if one exists (same error on a mismatch), and recorded there
    otherwise.  ``timeout`` (seconds) bounds each network wait, so a stalled server fails
    instead of hanging.  A network failure raises ``DownloadError`` naming ``url``.
    """
    dest = Path(dest_path)
    with made_folder(dest.parent):
        _fetch(url, dest, sha256, progress, timeout)
    return dest


def _fetch(url: str, dest: Path, sha256: Optional[str], progress: bool, timeout: float) -> None:
    expected, where = (sha256.lower(), "registry") if sha256 else (_read_sidecar(dest), "sidecar")
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            total = resp.headers.get("Content-Length")
            bar = _progress_bar(int(total) if total and total.isdigit() else None, dest.name,
                                progress)
            try:
                for chunk in iter(lambda: resp.read(_CHUNK), b""):
                    out.write(chunk)
                    h.update(chunk)
                    bar.update(len(chunk))
            finally:
                bar.close()
        actual = h.hexdigest()
        if expected is not None and actual != expected:
            raise _mismatch(dest, expected, actual, where, "the download was discarded")
        os.replace(tmp, dest)
    except _NETWORK_ERRORS as e:
        tmp.unlink(missing_ok=True)
        raise DownloadError(url, getattr(e, "reason", None) or e) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if expected is None:
        _write_sidecar(dest, actual)


def _progress_bar(total: Optional[int], desc: str, enabled: bool):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is a dependency, but a missing bar must not stop a download
        enabled = False
    if not enabled:
        class _Null:
            def update(self, n):
                pass

            def close(self):
                pass
        return _Null()
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                leave=False)


def _check_member_name(archive: Path, name: str) -> None:
    """Refuse names that could land outside the destination, on POSIX or Windows."""
    for pure in (PurePosixPath(name), PureWindowsPath(name)):
        if pure.is_absolute() or pure.anchor:
            raise ValueError(f"unsafe member {name!r} in archive {archive}: absolute path")
        if ".." in pure.parts:
            raise ValueError(f"unsafe member {name!r} in archive {archive}: '..' component")


def _within(dest: Path, name: str) -> Path:
    target = (dest / name).resolve()
    if target != dest and dest not in target.parents:
        raise ValueError(f"unsafe member {name!r}: resolves outside {dest}")
    return target


#: Extraction caps: total unpacked bytes, number of members, and unpacked bytes per archive
#: byte (the registry's archives hold already-gzipped text and CSV, far below these; a
#: "zip bomb" of zeros unpacks ~1000x).  Each can be set by keyword or environment variable.
DEFAULT_MAX_EXTRACT_BYTES = 4 << 30
DEFAULT_MAX_EXTRACT_MEMBERS = 100_000
DEFAULT_MAX_EXTRACT_RATIO = 200
_RATIO_SLACK = 1 << 20   # tiny archives may unpack to 1 MiB whatever their ratio


class _Limits:
    """The caps for one extraction and the running totals they are checked against."""

    def __init__(self, archive: Path, max_bytes, max_members, max_ratio):
        self.archive = archive
        self.max_bytes = extract_byte_cap(max_bytes)
        self.max_members = positive_limit(max_members, "max_members", "HECTOR_MAX_EXTRACT_MEMBERS",
                                  DEFAULT_MAX_EXTRACT_MEMBERS)
        self.max_ratio = positive_limit(max_ratio, "max_ratio", "HECTOR_MAX_EXTRACT_RATIO",
                                DEFAULT_MAX_EXTRACT_RATIO)
        self.ratio_bytes = self.max_ratio * archive.stat().st_size + _RATIO_SLACK
        self.written = 0

    def member(self, count: int) -> None:
        if count > self.max_members:
            raise ValueError(f"archive {self.archive} has more than {self.max_members:,} "
                             "members (max_members / $HECTOR_MAX_EXTRACT_MEMBERS); refusing "
                             "to extract it")

    def declared(self, total: int) -> None:
        if total > self.max_bytes:
            raise ValueError(f"archive {self.archive} declares {total:,} unpacked bytes, over "
                             f"the cap of {self.max_bytes:,} (max_bytes / "
                             "$HECTOR_MAX_EXTRACT_BYTES); refusing to extract it")

    def wrote(self, n: int) -> None:
        """Count bytes actually unpacked: headers can lie, decompressed streams cannot."""
        self.written += n
        if self.written > self.max_bytes:
            raise ValueError(f"archive {self.archive} unpacks to more than {self.max_bytes:,} "
                             "bytes (max_bytes / $HECTOR_MAX_EXTRACT_BYTES); extraction "
                             "stopped and its files removed")
        if self.written > self.ratio_bytes:
            raise ValueError(f"archive {self.archive} unpacks to more than {self.max_ratio}x "
                             "its own size (a decompression bomb?; max_ratio / "
                             "$HECTOR_MAX_EXTRACT_RATIO); extraction stopped and its files "
                             "removed")


def extract_byte_cap(value: Optional[int] = None) -> int:
    """The cap on unpacked bytes: ``value``, else ``$HECTOR_MAX_EXTRACT_BYTES``, else the
    default; also applied by loaders that decompress straight into memory."""
    return positive_limit(value, "max_bytes", "HECTOR_MAX_EXTRACT_BYTES",
                          DEFAULT_MAX_EXTRACT_BYTES)


def positive_limit(value, name: str, env: str, default: int) -> int:
    """A size cap: ``value`` (keyword ``name``) when given, else ``$env``, else ``default``;
    anything but a positive integer is a ``ValueError`` naming where it came from."""
    source = name
    if value is None:
        text = os.environ.get(env)
        if not text:
            return default
        source, value = f"${env}", text.strip()
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{source} must be a positive integer, got {text!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{source} must be a positive integer, got {value!r}")
    return value


def extract(archive: PathLike, dest: PathLike, max_bytes: Optional[int] = None,
            max_members: Optional[int] = None, max_ratio: Optional[int] = None) -> List[Path]:
    """Unpack a ``.tar.gz``/``.tgz``/``.tar``/``.zip`` archive into ``dest``; return the files.

    Every member is checked before anything is written.  A member with an absolute path, a
    ``..`` component, a symbolic or hard link, or a device/FIFO type raises a ``ValueError``
    naming the member, and nothing is extracted.  A corrupt archive raises a ``ValueError``
    naming it.  Caps (keyword, else environment variable, else default): ``max_members``
    (``$HECTOR_MAX_EXTRACT_MEMBERS``), total unpacked ``max_bytes``
    (``$HECTOR_MAX_EXTRACT_BYTES``, checked against the headers first and against the bytes
    actually unpacked while streaming), and ``max_ratio`` unpacked bytes per archive byte
    (``$HECTOR_MAX_EXTRACT_RATIO``, while streaming).  Past a cap: ``ValueError``, and the
    files written so far are removed.
    """
    archive, dest = Path(archive), Path(dest)
    if not archive.exists():
        raise FileNotFoundError(f"archive not found: {archive}")
    limits = _Limits(archive, max_bytes, max_members, max_ratio)
    dest.mkdir(parents=True, exist_ok=True)
    dest = dest.resolve()
    name = archive.name.lower()
    written: List[Path] = []
    try:
        if name.endswith(".zip"):
            return _extract_zip(archive, dest, limits, written)
        if name.endswith((".tar.gz", ".tgz", ".tar")):
            return _extract_tar(archive, dest, limits, written)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as e:
        _remove(written)
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"cannot read archive {archive}: {e}") from e
    except BaseException:
        _remove(written)
        raise
    raise ValueError(f"unsupported archive type for {archive} (want .tar.gz, .tgz, .tar or .zip)")


def _remove(paths: List[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _copy(src, target: Path, limits: _Limits, written: List[Path]) -> None:
    written.append(target)
    with src, open(target, "wb") as f:
        for chunk in iter(lambda: src.read(_CHUNK), b""):
            limits.wrote(len(chunk))
            f.write(chunk)


def _extract_tar(archive: Path, dest: Path, limits: _Limits, written: List[Path]) -> List[Path]:
    with tarfile.open(archive, "r:*") as tar:
        members = []
        for m in tar:   # one header at a time, so a huge member count stops early
            members.append(m)
            limits.member(len(members))
            _check_member_name(archive, m.name)
            if m.issym() or m.islnk():
                raise ValueError(f"unsafe member {m.name!r} in archive {archive}: "
                                 f"{'symbolic' if m.issym() else 'hard'} link to {m.linkname!r}")
            if not (m.isfile() or m.isdir()):
                raise ValueError(f"unsafe member {m.name!r} in archive {archive}: "
                                 "device, FIFO or other special file")
            _within(dest, m.name)
        limits.declared(sum(m.size for m in members if m.isfile()))
        for m in members:
            target = dest / m.name
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            # Copy the bytes ourselves rather than tar.extract: no owner, mode or mtime from
            # the archive is applied, whatever the Python version's extraction filter does.
            _copy(tar.extractfile(m), target, limits, written)
    return list(written)


def _extract_zip(archive: Path, dest: Path, limits: _Limits, written: List[Path]) -> List[Path]:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        limits.member(len(infos))
        for info in infos:
            _check_member_name(archive, info.filename)
            mode = info.external_attr >> 16  # Unix mode bits, when the creator stored them
            if stat.S_ISLNK(mode):
                raise ValueError(f"unsafe member {info.filename!r} in archive {archive}: "
                                 "symbolic link")
            if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) and stat.S_IFMT(mode):
                raise ValueError(f"unsafe member {info.filename!r} in archive {archive}: "
                                 "device, FIFO or other special file")
            _within(dest, info.filename)
        limits.declared(sum(info.file_size for info in infos))
        for info in infos:
            target = dest / info.filename
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy(zf.open(info), target, limits, written)
    return list(written)


def require_file(root: PathLike, name: str) -> Path:
    """``root/name``, or the one ``root/*/name`` (archives often unpack into a subfolder).

    A missing file raises ``FileNotFoundError`` naming the full path that was expected.
    """
    root = Path(root)
    path = root / name
    if path.is_file():
        return path
    nested = sorted(p for p in root.glob(f"*/{name}") if p.is_file()) if root.is_dir() else []
    if len(nested) == 1:
        return nested[0]
    if len(nested) > 1:
        raise ValueError(f"{name} found in several subfolders of {root}: "
                         f"{', '.join(map(str, nested))}; point root at one of them")
    raise FileNotFoundError(f"dataset file not found: {path}")
