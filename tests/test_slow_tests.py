"""``slow-tests.txt`` names test functions that exist: a renamed or removed test must not
leave a stale line behind (its new name would silently join the fast subset)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def slow_tests() -> set:
    """The entries as tests/conftest.py reads them (text before a ``#``, blank lines out)."""
    lines = (ROOT / "tests" / "slow-tests.txt").read_text(encoding="utf-8").splitlines()
    return {e for e in (line.split("#", 1)[0].strip() for line in lines) if e}


def _functions(path: Path) -> set:
    """``name`` and ``Class::name`` of the test functions defined in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.ClassDef):
            out |= {f"{node.name}::{f.name}" for f in node.body
                    if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return out


def test_every_listed_slow_test_exists():
    missing = []
    for entry in sorted(slow_tests()):
        path, _, name = entry.partition("::")
        if not (ROOT / path).is_file() or name not in _functions(ROOT / path):
            missing.append(entry)
    assert not missing, f"slow-tests.txt names tests that do not exist: {missing}"
