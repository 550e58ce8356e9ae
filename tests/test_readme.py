"""The README's (and the user guide's) Python examples run as written.

Every ```python block of ``README.md`` and of the guide pages under ``docs/`` is executed, in
a fresh namespace, on whatever device this machine has.  A block marked CUDA-only -- an HTML
comment ``<!-- cuda -->`` on the line before its fence, or a first line ``# needs CUDA`` --
is skipped, with the reason, where CUDA is absent, and runs where it is present.  Shell
blocks are not run; ``hector --help`` is checked to start, and ``.ci/run`` to run the
README's test command.
"""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: Guide pages whose examples are executed too (the API reference pages hold none).
GUIDE = ["index.md", "layers.md", "compiler.md", "minibatch.md", "benchmarks.md"]
CUDA_MARKS = ("<!-- cuda -->",)
CUDA_FIRST_LINE = "# needs CUDA"

_FENCE = re.compile(r"^```(\w*)\s*$")


def code_blocks(path: Path):
    """``(language, first line number, source, cuda_only)`` of each fenced block of ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i + 1
        prev = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        j = start
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        body = "\n".join(lines[start:j])
        first = body.lstrip().splitlines()[0].strip() if body.strip() else ""
        cuda = prev in CUDA_MARKS or first.lower() == CUDA_FIRST_LINE.lower()
        out.append((lang, start + 1, body, cuda))
        i = j + 1
    return out


def _python_blocks():
    pages = [README] + [ROOT / "docs" / p for p in GUIDE if (ROOT / "docs" / p).exists()]
    params = []
    for page in pages:
        for lang, line, body, cuda in code_blocks(page):
            if lang != "python":
                continue
            rel = page.relative_to(ROOT).as_posix()
            marks = [pytest.mark.skipif(not torch.cuda.is_available(),
                                        reason=f"{rel}:{line} is marked CUDA-only")] if cuda else []
            params.append(pytest.param(rel, line, body, id=f"{rel}:{line}", marks=marks))
    return params


@pytest.mark.parametrize("page,line,source", _python_blocks())
def test_python_block_runs(page, line, source, monkeypatch):
    # As a user runs them: on a CPU the layers take the torch backend, not Triton's
    # interpreter, which the test suite turns on for the kernel tests (read on every call).
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    torch.manual_seed(0)
    code = compile(source, f"{page}:{line}", "exec")
    with contextlib.redirect_stdout(io.StringIO()):
        exec(code, {"__name__": f"__{Path(page).stem}_example__"})


def test_readme_has_python_blocks_and_a_cuda_one():
    blocks = [b for b in code_blocks(README) if b[0] == "python"]
    assert len(blocks) >= 6
    assert any(cuda for *_, cuda in blocks), "capture_step's example is marked CUDA-only"


def test_readme_is_a_short_page():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_hector_help_starts(capsys):
    from hector.cli import main        # what the console script ``hector`` calls
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for command in ("train", "bench", "info", "explain"):
        assert command in out


def _extras(command: str):
    m = re.search(r'\.\[([\w,]+)\]', command)
    return set(m.group(1).split(",")) if m else set()


def test_ci_runs_the_readme_test_command():
    """The README's test command (the bash block running pytest over the whole suite) is
    what ``.ci/run`` runs: the same pytest call, after installing at least its extras."""
    tests = [body for lang, _, body, _ in code_blocks(README)
             if lang == "bash" and "-m pytest" in body and "not slow" not in body]
    assert len(tests) == 1, tests
    readme_cmd = tests[0]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    pytest_call = re.search(r"python3? (-m pytest -q)", readme_cmd)
    assert pytest_call, readme_cmd
    assert re.search(r"^python3? " + re.escape(pytest_call.group(1)), ci, re.M), ci
    install = next(line for line in ci.splitlines() if "pip install" in line)
    assert _extras(readme_cmd) <= _extras(install), (readme_cmd, install)
    assert "torch==" in install and "torch==" in readme_cmd
    assert (re.search(r"torch==([\d.]+)", install).group(1)
            == re.search(r"torch==([\d.]+)", readme_cmd).group(1))
