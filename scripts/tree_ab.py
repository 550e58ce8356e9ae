"""Time one command on two source trees, alternating which runs first, and average each
markdown table cell per tree: an A/B that a fixed order cannot bias.

    python scripts/tree_ab.py --tree old=.gpu/old/src --tree new=src --rounds 2 \\
        -- python3 scripts/batch_overhead.py --device cuda --profile mag --batches 16

Each round runs the command once per tree with ``PYTHONPATH`` set to the tree, the order
reversed every round (old new, new old, old new, ...): a process that runs second finds
caches (Triton's, the autotuner's) warmed by the first, which made one fixed-order epoch
comparison favour whichever tree ran second by 13-23% (docs/perf-notes.md, "Mini-batches").  Every
output is appended to ``--log``; then, for each markdown table row (keyed by its first
cell) and each numeric column, the mean per tree over the rounds, and new / old.

``--env NAME:VAR=VALUE`` sets an environment variable for tree NAME's runs only, so one tree
given twice under two names compares a switch (``--tree off=src --tree on=src --env
on:HECTOR_MERGE_LAST=1``).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from typing import Dict, List, Tuple


def orders(names: List[str], rounds: int) -> List[List[str]]:
    """The trees' order in each round: as given, then reversed, alternating."""
    return [names if r % 2 == 0 else names[::-1] for r in range(rounds)]


#: A numeric cell: a number, optionally with a unit (x, %) and a bracketed spread or a note
#: after a space ("0.445 [0.357, 0.901] noisy", "5.37x"); "128x1" is not one.
NUMBER = re.compile(r"^(-?(?:[\d,]*\.?\d+(?:e[-+]?\d+)?|nan|inf))(?:x|%)?(?:\s.*)?$")


def table_cells(text: str) -> Dict[Tuple[str, str], float]:
    """(row key, column name) -> number for every markdown table in ``text`` (the header row
    names the columns).  A row's key is its cells before the first numeric one, joined (so
    ``hector bench``'s ``layer | dataset | F x H | peer`` rows stay apart); a numeric cell
    counts its leading number; other cells are skipped."""
    cells, header = {}, None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = parts
            continue
        if all(set(p) <= set("-: ") for p in parts):
            continue
        numbers = [NUMBER.match(p) for p in parts]
        first = next((i for i, m in enumerate(numbers) if m and i > 0), len(parts))
        key = " | ".join(parts[:first])
        for name, m in zip(header[first:], numbers[first:]):
            if m:
                cells[(key, name)] = float(m.group(1).replace(",", ""))
    return cells


def summary(runs: Dict[str, List[Dict[Tuple[str, str], float]]]) -> List[str]:
    """One line per (row, column): each tree's mean and, for two trees, the second / first."""
    names = list(runs)
    keys = sorted({k for rs in runs.values() for r in rs for k in r})
    lines = []
    for key in keys:
        means = [statistics.mean([r[key] for r in runs[n] if key in r] or [float("nan")])
                 for n in names]
        ratio = (f"  {names[1]}/{names[0]} {means[1] / means[0]:.3f}"
                 if len(means) == 2 and means[0] else "")
        lines.append(f"{key[0]} | {key[1]}: " + "  ".join(
            f"{n} {m:.3f}" for n, m in zip(names, means)) + ratio)
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                   help="a source tree (its folder for PYTHONPATH); give two")
    p.add_argument("--env", action="append", default=[], metavar="NAME:VAR=VALUE",
                   help="an environment variable for tree NAME's runs only")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--log", default="tree_ab.log")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if len(trees) < 2 or not command or args.rounds < 1:
        p.error("give two --tree NAME=PATH, --rounds >= 1 and a command after --")
    extra: Dict[str, dict] = defaultdict(dict)
    for item in args.env:
        name, _, setting = item.partition(":")
        var, eq, value = setting.partition("=")
        if name not in trees or not var or not eq:
            p.error(f"--env {item!r}: give NAME:VAR=VALUE with NAME one of the trees "
                    f"({', '.join(trees)})")
        extra[name][var] = value
    runs: Dict[str, list] = defaultdict(list)
    with open(args.log, "a") as log:
        for r, order in enumerate(orders(list(trees), args.rounds), 1):
            for name in order:
                env = dict(os.environ, PYTHONPATH=os.path.abspath(trees[name]), **extra[name])
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                log.write(f"=== {name} round {r} rc={done.returncode}\n{done.stdout}"
                          f"{done.stderr}\n")
                log.flush()
                print(f"{name} round {r} rc={done.returncode}", flush=True)
                runs[name].append(table_cells(done.stdout))
    print("\n".join(summary({n: runs[n] for n in trees})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
