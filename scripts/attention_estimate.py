"""The attention suite's geomeans against the best PyG peer, estimated from a recorded suite
with hector's captured times replaced by later ``scripts/tree_ab.py`` runs of a newer tree
(an estimate mixing runs: PyG is not re-timed).

    python scripts/attention_estimate.py [--suite docs/data/bench-session29-attention-suite-h200.json]
        [--tree new] LOG [LOG ...]

Each LOG is a ``tree_ab.py --log`` file of ``hector bench --suite attention`` runs; the rows
of tree ``--tree`` (mean over its rounds, inference and training) replace the suite's hector
times of the same case, later LOGs over earlier ones.  Prints the number of cases replaced
and both geomeans.
"""
import argparse
import collections
import json
import math
import re


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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+")
    p.add_argument("--suite", default="docs/data/bench-session29-attention-suite-h200.json")
    p.add_argument("--tree", default="new")
    a = p.parse_args()
    newer = {}
    for log in a.logs:
        newer.update(tree_means(log, a.tree))
    cases = collections.defaultdict(list)
    for row in json.load(open(a.suite))["rows"]:
        cases[row["case"]].append(row)
    inference, training, replaced = [], [], 0
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
        if h_train and p_train:
            training.append(p_train / h_train)
    print(f"{replaced} cases replaced; inference geomean {geomean(inference):.2f}x over "
          f"{len(inference)} cases, training {geomean(training):.2f}x over {len(training)}")


if __name__ == "__main__":
    main()
