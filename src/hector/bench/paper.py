"""The paper suites of ``hector bench --suite``: the settings of the Hector (ASPLOS'24) and
DF-GNN (LoG'24) evaluations, as lists of :class:`~hector.bench.suites.Case`.

* ``hetero``: RGCN, RGAT and HGT on the eight heterogeneous profiles, input and output width
  64 with one head, plus RGAT at 128 with 8 heads (Hector's wider RGAT setting).
* ``attention``: GAT, AGNN and Transformer on the six homogeneous profiles and on the real
  Cora, Amazon Computers and GitHub MUSAE graphs (when their folders are present under
  ``--data-root``), at F=128 with one head and F=64 with four heads.  AGNN has no heads or
  width of its own (it reuses the input), so it runs once per graph at F=128.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from .suites import ATTENTION, RELATIONAL, Case

HETERO_PROFILES = ("aifb", "mutag", "bgs", "am", "fb15k", "biokg", "wikikg2", "mag")
ATTENTION_PROFILES = ("cora", "pubmed", "arxiv", "proteins", "reddit", "products")
#: (loader name, folder under --data-root) of the real attention graphs
ATTENTION_REAL = (("cora", "cora"), ("amazon-computers", "amazon-computers"),
                  ("github-musae", "github-musae"))
HETERO_SIZES = ((64, 1),)
RGAT_WIDE = (128, 8)
ATTENTION_SIZES = ((128, 1), (64, 4))
SUITES = ("hetero", "attention")


def hetero() -> List[Case]:
    cases = []
    for prof in HETERO_PROFILES:
        for layer in RELATIONAL:
            for f, h in HETERO_SIZES:
                cases.append(Case(layer, f"synthetic:{prof}", f, h))
        cases.append(Case("rgat", f"synthetic:{prof}", *RGAT_WIDE))
    return cases


def attention(data_root: Optional[str] = None) -> Tuple[List[Case], List[str]]:
    """The attention cases and notes on real graphs left out (folder absent)."""
    graphs: List[Tuple[str, Optional[str]]] = [(f"synthetic:{p}", None)
                                               for p in ATTENTION_PROFILES]
    notes = []
    for name, folder in ATTENTION_REAL:
        path = Path(data_root) / folder if data_root else None
        if path is not None and path.is_dir():
            graphs.append((name, str(path)))
        else:
            notes.append(f"suite attention: {name} left out (no folder {folder!r} under "
                         f"--data-root {data_root!r})")
    cases = []
    for name, root in graphs:
        for layer in ATTENTION:
            for f, h in ATTENTION_SIZES:
                if layer == "agnn" and h != 1:
                    continue
                cases.append(Case(layer, name, f, h, root=root))
    return cases, notes


def suite(name: str, data_root: Optional[str] = None) -> Tuple[List[Case], List[str]]:
    """Cases and notes of suite ``name`` ('hetero', 'attention' or 'all')."""
    if name == "hetero":
        return hetero(), []
    if name == "attention":
        return attention(data_root)
    if name == "all":
        att, notes = attention(data_root)
        return hetero() + att, notes
    raise ValueError(f"--suite must be one of {', '.join(SUITES + ('all',))}, got {name!r}")
