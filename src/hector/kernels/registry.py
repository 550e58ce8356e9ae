"""The one registry of hector's Triton kernels: kernel name -> Jinja2 template.

``source(name, **params)`` renders a kernel's module source (deterministic: the same template
text and parameters give the same text); ``kernel(name, **params)`` returns its ``@triton.jit``
function.  The parameters are the static choices of a spec (gather or not, score terms,
schedule kind, ...), rendered into the source instead of branching on ``tl.constexpr`` flags, so
each spec gets exactly the code it runs; tile sizes stay ``tl.constexpr`` launch options, so one
rendered kernel serves every autotuning config.

The rendered module is written to the cache folder (``$HECTOR_CACHE_DIR``, default
``~/.cache/hector/kernels``) as ``<sha256>.py`` and imported from there: Triton's ``@jit``
reads the function's source from its file (``inspect``), and tracebacks and Triton's own cache
then point at real code.  The hash (:func:`spec_hash`) covers the kernel name, the template
texts (the kernel's own and the shared macros), the parameters, and the hector and Triton
versions, so a change to any of them gets a new file and nothing stale is ever loaded.

A cache hit neither renders nor writes.  Files are written through a temporary file and
``os.replace`` (readers never see half a file), and end in a trailer line naming their hash:
a file without it (truncated, corrupt, foreign) is regenerated.  An unwritable cache folder
falls back to a private temporary folder, with one warning.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from types import MappingProxyType
from typing import Dict, Mapping, Optional, Tuple

from .._version import __version__

_HERE = Path(__file__).parent
#: Where templates are looked up, in order: the shared macros, then each kernel family's own.
TEMPLATE_DIRS = (_HERE / "templates", _HERE / "attention" / "templates",
                 _HERE / "segment_mm" / "templates", _HERE / "traversal" / "templates",
                 _HERE / "edgewise" / "templates", _HERE / "stats" / "templates",
                 _HERE / "sampling" / "templates", _HERE / "ranking" / "templates")
#: Shared macros every template may import; their text is part of every kernel's hash.
MACROS = ("_macros.py.j2",)
#: Default cache folder (``$HECTOR_CACHE_DIR`` overrides it).
DEFAULT_CACHE_DIR = Path("~/.cache/hector/kernels")

_BOOL = (False, True)
#: Columns a segment GEMM's epilogue may append (``GemmSpec.extra_cols``; 0: none).
_EXTRA_COLS = tuple(range(0, 129))
#: fp32 ``tl.dot`` modes (see hector.kernels.segment_mm.spec.INPUT_PRECISIONS).
_PRECISIONS = ("ieee", "tf32", "tf32x3")
_SCORE = dict(has_qk=_BOOL, has_src=_BOOL, has_dst=_BOOL, has_leaky=_BOOL, has_dropout=_BOOL,
              edge_parallel=_BOOL, dst_edge=_BOOL, shared_kv=_BOOL, normed_k=_BOOL,
              merge_last=_BOOL)
#: A GEMM input's elementwise function ("": none; hector.kernels.segment_mm.spec.PROLOGUES).
_PROLOGUES = ("", "gelu", "relu", "sigmoid", "tanh")
_GEMM = dict(has_gather=_BOOL, has_scatter=_BOOL, dot_fp32=_BOOL, input_precision=_PRECISIONS,
             prologue=_PROLOGUES)
#: Traversal kernels: epilogue terms, and whether programs read their rows from a row list.
_TRAVERSAL = dict(num_addends=(0, 1, 2, 3), has_bias=_BOOL, row_list=_BOOL)
_SOFTMAX = dict(has_leaky=_BOOL, row_list=_BOOL)
#: Per-head weights a block-diagonal score matrix is built from (``segment_mm.head_blocks``).
_PARTS = tuple(range(1, 9))


class Text(tuple):
    """Allowed values of a free-text parameter (a generated program's statements): any str;
    ``[0]`` is an example the registry tests render."""

    def __new__(cls, example: str):
        return super().__new__(cls, (example,))

    def __contains__(self, value) -> bool:
        return isinstance(value, str)


_EDGEWISE_EXAMPLE = dict(form=("map", "reduce", "softmax"), args=Text("in0, out, n_rows"),
                         body=Text("mask_hd = (offs_h[:, None] < 1) & (offs_d[None, :] < 1)\n"
                                   "t1 = tl.load(in0 + own[:, None, None] + lane0[None, :, :], "
                                   "mask=mask_own[:, None, None], other=0.0)\n"
                                   "tl.store(out + own[:, None, None] + lane0[None, :, :], t1, "
                                   "mask=mask_own[:, None, None])"))


@dataclass(frozen=True)
class Entry:
    """One kernel: its template, the ``@triton.jit`` function the rendered module defines,
    and the render parameters it takes with their allowed values (all are required)."""
    template: str
    function: str
    params: Mapping[str, tuple]


KERNELS: Mapping[str, Entry] = MappingProxyType({
    "segment_mm": Entry("segment_mm.py.j2", "segment_mm_kernel",
                        dict(_GEMM, accumulate=_BOOL, has_bias=_BOOL, narrow=_BOOL,
                             has_csr=_BOOL, has_addend=_BOOL, has_csr_out=_BOOL,
                             extra_cols=_EXTRA_COLS)),
    "segment_mm_wgrad": Entry("segment_mm_wgrad.py.j2", "segment_mm_wgrad_kernel",
                              dict(_GEMM, atomic=_BOOL, has_sums=_BOOL, has_csr=_BOOL,
                                   narrow=_BOOL)),
    "attention_fwd": Entry("attention_fwd.py.j2", "attention_fwd_kernel",
                           dict(_SCORE, has_bias=_BOOL)),
    "attention_combine": Entry("attention_combine.py.j2", "attention_combine_kernel",
                               dict(has_bias=_BOOL)),
    "attention_bwd_dst": Entry("attention_bwd.py.j2", "attention_bwd_dst_kernel",
                               dict(_SCORE, need_dq=_BOOL, need_ddst=_BOOL)),
    "attention_bwd_src": Entry("attention_bwd.py.j2", "attention_bwd_src_kernel",
                               dict(_SCORE, need_dk=_BOOL, need_dv=_BOOL, need_dsrc=_BOOL)),
    "combine_sum": Entry("attention_combine.py.j2", "combine_sum_kernel", {}),
    "fill_rows": Entry("attention_combine.py.j2", "fill_rows_kernel", {}),
    "row_dot": Entry("row_dot.py.j2", "row_dot_kernel", dict(has_bias=_BOOL)),
    "cosine_qk": Entry("cosine.py.j2", "cosine_qk_kernel", {}),
    "head_blocks": Entry("head_blocks.py.j2", "head_blocks_kernel", dict(parts=_PARTS)),
    "head_blocks_bwd": Entry("head_blocks.py.j2", "head_blocks_bwd_kernel",
                             dict(parts=_PARTS)),
    "count_facts": Entry("count_facts.py.j2", "count_facts_kernel",
                         dict(from_ptr=_BOOL, kind=("bins", "degrees"))),
    "floyd": Entry("floyd.py.j2", "floyd_kernel", {}),
    "cosine_qk_bwd": Entry("cosine.py.j2", "cosine_qk_bwd_kernel", {}),
    "traversal_csr": Entry("traversal_csr.py.j2", "traversal_csr_kernel", _TRAVERSAL),
    "traversal_csr_rows": Entry("traversal_csr.py.j2", "traversal_csr_rows_kernel",
                                dict(_TRAVERSAL, by_position=_BOOL)),
    "edge_softmax": Entry("edge_softmax.py.j2", "edge_softmax_kernel", _SOFTMAX),
    "edge_softmax_rows": Entry("edge_softmax.py.j2", "edge_softmax_rows_kernel", _SOFTMAX),
    "edge_softmax_bwd": Entry("edge_softmax.py.j2", "edge_softmax_bwd_kernel", _SOFTMAX),
    "edge_softmax_bwd_rows": Entry("edge_softmax.py.j2", "edge_softmax_bwd_rows_kernel",
                                   _SOFTMAX),
    "edgewise": Entry("edgewise.py.j2", "edgewise_kernel", _EDGEWISE_EXAMPLE),
    "rank_counts": Entry("rank_counts.py.j2", "rank_counts_kernel",
                         dict(kind=("dot", "l1", "l2"), mode=("truth", "count"),
                              input_precision=_PRECISIONS)),
})

_lock = threading.RLock()
_kernels: Dict[tuple, object] = {}          # (cache dir, name, params) -> jit function
_hashes: Dict[tuple, str] = {}              # (name, params) -> spec hash
_fallback_dir: Optional[Path] = None
_dirs: Dict[str, Path] = {}                 # $HECTOR_CACHE_DIR value -> folder in use
#: Renders done by this process (tests check that a cache hit renders nothing).
stats = {"renders": 0, "writes": 0}


def entry(name: str) -> Entry:
    """The registry entry of ``name``; a clear error naming it when there is none."""
    try:
        return KERNELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown kernel name {name!r}; the registry has: "
                         f"{', '.join(sorted(KERNELS))}") from None


def _checked(name: str, params: dict) -> Tuple[Entry, tuple]:
    """(entry, params as a sorted tuple) after checking every parameter by name."""
    e = entry(name)
    unknown = sorted(set(params) - set(e.params))
    if unknown:
        raise TypeError(f"kernel {name!r} takes no parameter {unknown[0]!r}; its parameters: "
                        f"{', '.join(sorted(e.params)) or 'none'}")
    missing = sorted(set(e.params) - set(params))
    if missing:
        raise TypeError(f"kernel {name!r} needs parameter {missing[0]!r}")
    for key, allowed in e.params.items():
        value = params[key]
        # Exact types: 1 == True would otherwise pass and render a different-looking key.
        if type(value) is not type(allowed[0]) or value not in allowed:
            raise ValueError(f"kernel {name!r}: parameter {key!r} must be one of {allowed}, "
                             f"got {value!r}")
    return e, tuple(sorted(params.items()))


def _environment():
    import jinja2   # lazy: rendering happens on first use only (see hector.kernels)
    return jinja2.Environment(loader=jinja2.FileSystemLoader([str(d) for d in TEMPLATE_DIRS]),
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


def _tidy(text: str) -> str:
    """Drop trailing spaces and the blank lines that empty macro calls leave inside function
    bodies (a blank line between two indented lines); top-level spacing is kept."""
    lines = [line.rstrip() for line in text.split("\n")]
    out = []
    for i, line in enumerate(lines):
        if not line and out and out[-1].startswith(" "):
            nxt = next((x for x in lines[i + 1:] if x), "")
            if nxt.startswith(" "):
                continue
        out.append(line)
    return "\n".join(out).rstrip("\n") + "\n"


def source(name: str, **params) -> str:
    """The rendered Python source of kernel ``name`` (deterministic in its inputs)."""
    e, _ = _checked(name, params)
    stats["renders"] += 1
    text = _environment().get_template(e.template).render(kernel=name, template=e.template,
                                                         **params)
    return _tidy(text)


def _template_text(template: str) -> str:
    # The first folder that has it, as the Jinja2 loader picks (names are unique anyway).
    path = next((d / template for d in TEMPLATE_DIRS if (d / template).is_file()), None)
    if path is None:
        raise FileNotFoundError(f"kernel template {template!r} is in none of {TEMPLATE_DIRS}")
    return path.read_text(encoding="utf-8")


def _versions() -> Tuple[str, str]:
    try:
        triton_version = version("triton")
    except Exception:   # not installed as a distribution (a source checkout on the path)
        triton_version = getattr(sys.modules.get("triton"), "__version__", "unknown")
    return __version__, triton_version


def spec_hash(name: str, **params) -> str:
    """sha256 of everything the rendered source depends on: the kernel name, the template
    texts, the parameters and the hector and Triton versions (the file name in the cache)."""
    memo = (name, tuple(sorted(params.items())))
    if memo not in _hashes:    # checked once: launches ask on every call
        e, key = _checked(name, params)
        hector_version, triton_version = _versions()
        blob = json.dumps({"kernel": name, "params": dict(key),
                           "templates": {t: _template_text(t) for t in (e.template, *MACROS)},
                           "hector": hector_version, "triton": triton_version},
                          sort_keys=True)
        _hashes[memo] = hashlib.sha256(blob.encode()).hexdigest()
    return _hashes[memo]


def _trailer(digest: str) -> str:
    return f"# hector-kernel {digest}\n"


def cache_dir() -> Path:
    """The folder kernels are written to: ``$HECTOR_CACHE_DIR`` (default
    ``~/.cache/hector/kernels``), or a private temporary folder when that is not writable."""
    global _fallback_dir
    setting = os.environ.get("HECTOR_CACHE_DIR") or ""
    known = _dirs.get(setting)     # checked once per setting: launches ask on every call
    if known is not None:
        return known
    wanted = Path(setting or DEFAULT_CACHE_DIR).expanduser()
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        if os.access(wanted, os.W_OK | os.X_OK):
            _dirs[setting] = wanted
            return wanted
        problem = "not writable"
    except OSError as exc:
        problem = str(exc)
    with _lock:
        if _fallback_dir is None:
            _fallback_dir = Path(tempfile.mkdtemp(prefix="hector-kernels-"))
            warnings.warn(f"hector kernel cache {wanted} is unusable ({problem}); using "
                          f"{_fallback_dir} for this process (set HECTOR_CACHE_DIR to a "
                          "writable folder to keep kernels between runs)", RuntimeWarning,
                          stacklevel=3)
        _dirs[setting] = _fallback_dir
    return _fallback_dir


def cache_path(name: str, **params) -> Path:
    """Where kernel ``name`` with these parameters is (or will be) cached."""
    return cache_dir() / f"{spec_hash(name, **params)}.py"


def _valid(path: Path, digest: str) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return text.endswith(_trailer(digest))


def _write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same folder, then replace)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem[:16] + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    stats["writes"] += 1


def materialise(name: str, **params) -> Path:
    """The cache file of kernel ``name`` with ``params``, rendered and written only when it is
    missing or invalid (nothing is imported: ``hector.explain`` uses this off the GPU)."""
    digest = spec_hash(name, **params)
    path = cache_dir() / f"{digest}.py"
    if not _valid(path, digest):
        _write(path, source(name, **params) + "\n" + _trailer(digest))
    return path


class _SourceLoader(importlib.machinery.SourceFileLoader):
    """Compiles the cache file itself every time, never a ``__pycache__`` copy: a file
    regenerated within the same second and size as a stale bytecode file would otherwise
    load the stale code, and the cache folder stays free of bytecode folders."""

    def get_code(self, fullname):
        return compile(self.get_data(self.path), self.path, "exec", dont_inherit=True)


def _import(path: Path, digest: str, function: str):
    name = f"hector_kernel_{digest[:24]}"
    spec = importlib.util.spec_from_file_location(name, path,
                                                  loader=_SourceLoader(name, str(path)))
    module = importlib.util.module_from_spec(spec)
    # Registered like any imported module (the importlib recipe), so tools that look a
    # function's module up by name (inspect.getmodule, pickling) find it.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return getattr(module, function)


def kernel(name: str, **params):
    """The ``@triton.jit`` function of kernel ``name`` rendered with ``params``: memoised in
    this process, loaded from the cache file when it is there, rendered and written when not
    (or when the file is not a complete kernel file)."""
    memo = (os.environ.get("HECTOR_CACHE_DIR"), name, tuple(sorted(params.items())))
    fn = _kernels.get(memo)
    if fn is not None:         # the launch path: no checks, no file system
        return fn
    e, _ = _checked(name, params)
    with _lock:
        fn = _kernels.get(memo)
        if fn is None:
            digest = spec_hash(name, **params)
            path = materialise(name, **params)
            try:
                fn = _import(path, digest, e.function)
            except (SyntaxError, AttributeError, ImportError):
                # Valid trailer but a broken body (edited by hand?): render it again, once.
                _write(path, source(name, **params) + "\n" + _trailer(digest))
                fn = _import(path, digest, e.function)
            _kernels[memo] = fn
    return fn


def clear_memo() -> None:
    """Forget the kernels and hashes loaded by this process (tests; the files stay)."""
    global _fallback_dir
    with _lock:
        _kernels.clear()
        _hashes.clear()
        _dirs.clear()
        _fallback_dir = None
