"""The import structure of ``src/hector``: no cycle among hector modules and no import from a
lower layer into a higher one, counting imports inside functions too (a function-local import
hides a cycle from Python but not from a reader).  Parsed with ``ast``, nothing is imported."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Layers, lowest first: a module may import its own layer and the ones before it, never one
#: after it.  A module belongs to the layer of its longest listed prefix.
LAYERS: List[List[str]] = [
    ["hector._version", "hector.checks", "hector.device"],
    # Kernel infrastructure and the index-building kernels, which a graph's build and the
    # sampler launch.
    ["hector.kernels.registry", "hector.kernels.eager", "hector.kernels.sizes",
     "hector.kernels.stats", "hector.kernels.sampling"],
    ["hector.graph"],
    ["hector.datasets", "hector.loader"],
    ["hector.kernels"],
    ["hector.compiler"],
    ["hector.nn"],
    ["hector.train", "hector.bench"],
    ["hector.cli"],
    ["hector"],              # the package root re-exports the public API
]


def module_files(src: Path) -> Dict[str, Path]:
    """Dotted module name -> file, for every module of the ``hector`` package under ``src``."""
    out = {}
    for path in sorted((src / "hector").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _base(module: str, is_package: bool, level: int) -> str:
    parts = module.split(".") if is_package else module.split(".")[:-1]
    return ".".join(parts[:len(parts) - (level - 1)])


def imports_of(module: str, path: Path, known: Set[str]) -> Set[str]:
    """The hector modules ``module`` imports anywhere in its file (relative imports resolved;
    ``from pkg import name`` counts as importing ``pkg.name`` when that is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = _base(module, is_package, node.level)
                source = f"{base}.{source}" if source else base
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            # ``import hector.a.b`` names a module; keep the longest known prefix.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
                found.update(_parents_run_by(module, target))
    return found


def _parents_run_by(module: str, target: str) -> Set[str]:
    """Packages whose ``__init__`` importing ``target`` runs first: its parents, except the
    root (run before anything) and ``module``'s own parents (already being imported)."""
    parts = target.split(".")
    own = module.split(".")
    return {".".join(parts[:i]) for i in range(2, len(parts))
            if parts[:i] != own[:i]}


def import_graph(src: Path) -> Dict[str, Set[str]]:
    files = module_files(src)
    known = set(files)
    return {m: imports_of(m, p, known) for m, p in files.items()}


#: Modules placed by name, not by prefix: ``hector.kernels``'s own ``__init__`` imports
#: nothing, so a graph's build importing ``hector.kernels.stats`` runs no kernel family.
EXACT = {"hector.kernels": 1}


def layer_of(module: str) -> int:
    if module in EXACT:
        return EXACT[module]
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer of LAYERS; add it there")
    return best


def find_cycle(graph: Dict[str, Set[str]]):
    """One import cycle as a list of modules (first == last), or None."""
    state: Dict[str, int] = {}      # 1: on the current path, 2: done
    stack: List[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
    return [f"{m} (layer {layer_of(m)}) imports {n} (layer {layer_of(n)})"
            for m, targets in sorted(graph.items()) for n in sorted(targets)
            if layer_of(n) > layer_of(m)]


@pytest.fixture(scope="module")
def graph():
    g = import_graph(SRC)
    assert len(g) > 50, f"found only {len(g)} modules under {SRC}; is the path right?"
    return g


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_imports_only_go_down_the_layers(graph):
    bad = upward_imports(graph)
    assert not bad, "upward imports:\n" + "\n".join(bad)


#: All that the kernel families may use outside ``hector.kernels``: they stay usable (and
#: testable) without the compiler, the layers or the datasets.
KERNEL_DEPENDENCIES = ("hector.graph", "hector.device", "hector.checks", "hector._version")


def test_kernels_import_only_graph_device_and_checks(graph):
    bad = [f"{m} -> {n}" for m, targets in sorted(graph.items()) if m.startswith("hector.kernels")
           for n in sorted(targets)
           if not n.startswith("hector.kernels")
           and not any(n == d or n.startswith(d + ".") for d in KERNEL_DEPENDENCIES)]
    assert not bad, bad


def test_checker_sees_cycles_and_upward_imports_in_function_bodies(tmp_path):
    """The checks above must be able to fail: a planted package with a cycle hidden in a
    function body and an upward import is caught by both."""
    pkg = tmp_path / "hector"
    (pkg / "graph").mkdir(parents=True)
    (pkg / "compiler").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "graph" / "__init__.py").write_text("from . import a\n")
    (pkg / "graph" / "a.py").write_text("def f():\n    from .. import compiler\n")
    (pkg / "compiler" / "__init__.py").write_text("from ..graph import a\n")
    g = import_graph(tmp_path)
    assert g["hector.graph.a"] == {"hector.compiler"}
    assert g["hector.compiler"] == {"hector.graph", "hector.graph.a"}   # graph/__init__ runs too
    assert find_cycle(g) is not None
    assert upward_imports(g) == ["hector.graph.a (layer 2) imports hector.compiler (layer 5)"]
