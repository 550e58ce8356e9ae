"""The attention suite's geomeans against the best PyG peer, estimated from a recorded suite
with hector's captured times replaced by later ``scripts/tree_ab.py`` runs of a newer tree
(an estimate mixing runs: PyG is not re-timed).

    python scripts/attention_estimate.py [--suite docs/data/bench-2026-11-28-ab17b67-attention-suite-h200.json]
        [--tree new] [--ceiling [--fp32-tflops 37] [--kernel-us 2]] [LOG ...]

Each LOG is a ``tree_ab.py --log`` file of ``hector bench --suite attention`` runs; the rows
of tree ``--tree`` (mean over its rounds, inference and training) replace the suite's hector
times of the same case, later LOGs over earlier ones.  Prints the number of cases replaced
and both geomeans.

``--ceiling``: also each case's inference floor and the speedup it caps (the best PyG peer's
time over the floor), sorted by hector's distance from it, and the geomean of the caps: how
far the inference geomean could go if every case ran at its floor, and which cases hold the
headroom.  A case's floor is the largest of three lower bounds (each generous, so the caps
are upper bounds): its bytes (:func:`hector.bench.floor.floor_bytes`, self loops added for
the layers that add them, at the suite's measured copy bandwidth; L2 hits can beat it on
graphs that fit in L2), its dense products' multiply-adds at ``--fp32-tflops`` (the best
cuBLAS fp32 rate measured on the H200: 169343 x 128 x 512 in 0.598 ms), and
the fewest kernels a step needs at ``--kernel-us`` each in a CUDA graph.
"""
import argparse
import collections
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from hector.bench.floor import floor_bytes  # noqa: E402
from hector.datasets.profiles import PROFILES  # noqa: E402

#: Layers whose PyG defaults add a self loop per node (the kernels gather it like an edge).
SELF_LOOPS = ("gat", "agnn")
#: The fewest kernels an inference step runs: the projection (AGNN: its normalisation) and
#: the fused attention, whose epilogue adds the bias or skip.
MIN_KERNELS = {"gat": 2, "agnn": 2, "transformer": 2}


def tree_means(path: str, tree: str) -> dict:
    """``{case: (inference ms, training ms)}``: the captured rows of ``tree``, averaged."""
    rows, current = collections.defaultdict(list), None
    with open(path) as f:
        for line in f:
            m = re.match(r"=== (\w+) round", line)
            if m:
                current = m.group(1)
            elif "hector captured" in line and current == tree:
                p = line.split()
                rows[f"{p[0]}/{p[1]}/{p[2]}"].append((float(p[5]), float(p[8])))
    return {k: tuple(sum(r[i] for r in v) / len(v) for i in (0, 1)) for k, v in rows.items()}


def best(rows, key):
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return min(values) if values else None


def geomean(values):
    return math.exp(sum(map(math.log, values)) / len(values))


def reordered(layer: str, heads: int) -> bool:
    """A one-head Transformer's cheapest formulation is the reordered one (``compiler.passes.reorder_attention``):
    one input row gathered per edge and three products' worth of node multiply-adds, against
    a key and a value row and four products; it bounds both parts of the floor."""
    return layer == "transformer" and heads == 1


def dense_flops(layer: str, nodes: int, features: int, heads: int) -> int:
    """Floating-point operations of an inference step's dense products (``F`` in and out):
    GAT's projection; Transformer's q, k, v and skip (three where reordered); AGNN none."""
    products = {"gat": 1, "agnn": 0, "transformer": 3 if reordered(layer, heads) else 4}[layer]
    return 2 * nodes * features * features * products


def graph_size(dataset: str, workloads: dict):
    """(nodes, edges) of a suite dataset: the suite's record, else a synthetic profile's
    published counts (merged suites keep the workloads of one source run only)."""
    for w in workloads.values():
        if w["dataset"] == dataset:
            return w["nodes"], w["edges"]
    prof = PROFILES.get(dataset.split(":", 1)[1]) if dataset.startswith("synthetic:") else None
    if prof is None:
        raise ValueError(f"the suite records no size for dataset {dataset!r}")
    return (sum(t.count for t in prof.node_types), sum(r.count for r in prof.relations))


def floor_parts(case: str, workloads: dict, copy_GBps: float, tflops: float,
                kernel_us: float) -> dict:
    """``{bound: ms}`` of one suite case (``layer/dataset/FxH``): bytes, flops, launches."""
    layer, dataset, shape = case.split("/")
    features, heads = (int(t) for t in shape.split("x"))
    nodes, edges = graph_size(dataset, workloads)
    edges += nodes if layer in SELF_LOOPS else 0
    rows = 1 if reordered(layer, heads) else None
    return {"bytes": floor_bytes(layer, nodes, edges, features, rows=rows)
            / (copy_GBps * 1e9) * 1e3,
            "flops": dense_flops(layer, nodes, features, heads) / (tflops * 1e12) * 1e3,
            "launches": MIN_KERNELS[layer] * kernel_us * 1e-3}


def print_ceilings(cases: dict, suite: dict, tflops: float, kernel_us: float) -> None:
    """Per case: hector, PyG's best, the floor and its bound, now / cap speedups; then the
    geomean of the caps and the share of the log headroom held by launch-bound cases."""
    meta = suite["meta"]
    rows = []
    for case, (h_inf, p_inf) in cases.items():
        parts = floor_parts(case, meta["workloads"], meta["copy_GBps"], tflops, kernel_us)
        bound = max(parts, key=parts.get)
        rows.append((h_inf / parts[bound], case, h_inf, p_inf, parts[bound], bound))
    rows.sort(reverse=True)
    print(f"{'case':40} {'hector':>8} {'PyG':>8} {'floor':>8} {'bound':>8} {'now':>6} "
          f"{'cap':>7} {'gap':>6}  (inference ms)")
    for gap, case, h, p, fl, bound in rows:
        print(f"{case:40} {h:8.3f} {p:8.3f} {fl:8.4f} {bound:>8} {p / h:5.2f}x "
              f"{p / fl:6.1f}x {gap:5.1f}x")
    head = sum(math.log(gap) for gap, *_ in rows)
    launch = sum(math.log(gap) for gap, *_, bound in rows if bound == "launches")
    print(f"geomean now {geomean([r[3] / r[2] for r in rows]):.2f}x, at every floor "
          f"{geomean([r[3] / r[4] for r in rows]):.2f}x over {len(rows)} cases; "
          f"launch-bound cases hold {launch / head:.0%} of the log headroom")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="*")
    p.add_argument("--suite", default="docs/data/bench-2026-11-28-ab17b67-attention-suite-h200.json")
    p.add_argument("--tree", default="new")
    p.add_argument("--ceiling", action="store_true",
                   help="also each case's inference floor and the speedup it caps")
    p.add_argument("--fp32-tflops", type=float, default=37.0)
    p.add_argument("--kernel-us", type=float, default=2.0)
    a = p.parse_args()
    newer = {}
    for log in a.logs:
        newer.update(tree_means(log, a.tree))
    suite = json.load(open(a.suite))
    cases = collections.defaultdict(list)
    for row in suite["rows"]:
        cases[row["case"]].append(row)
    inference, training, replaced, paired = [], [], 0, {}
    for case, rows in cases.items():
        ours = [r for r in rows if r["peer"].startswith("hector")]
        peers = [r for r in rows if not r["peer"].startswith("hector")]
        h_inf, h_train = best(ours, "inference_ms"), best(ours, "training_ms")
        if case in newer:
            replaced += 1
            h_inf, h_train = newer[case]
        p_inf, p_train = best(peers, "inference_ms"), best(peers, "training_ms")
        if h_inf and p_inf:
            inference.append(p_inf / h_inf)
            paired[case] = (h_inf, p_inf)
        if h_train and p_train:
            training.append(p_train / h_train)
    print(f"{replaced} cases replaced; inference geomean {geomean(inference):.2f}x over "
          f"{len(inference)} cases, training {geomean(training):.2f}x over {len(training)}")
    if a.ceiling:
        print_ceilings(paired, suite, a.fp32_tflops, a.kernel_us)


if __name__ == "__main__":
    main()
