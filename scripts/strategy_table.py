"""Markdown table of the DF-GNN strategy choice from attention_suite.py JSON files: for each
case, op time of node / edge / auto and auto's excess over the faster fixed schedule.

    python scripts/strategy_table.py suite.json [more.json ...]   (later files win)
"""
import json
import sys


def main(paths):
    # A later file's measurement of the same case (graph, layer, F, heads) replaces an earlier.
    cases = {}
    for p in paths:
        for r in json.load(open(p)):
            if "node" in r and "inference_ms" in r["node"]:
                cases[(r["graph"], r["kind"], r["f"], r["heads"])] = r
    rows = list(cases.values())
    print("| graph | layer | F x H | auto picks | mode | node ms | edge ms | auto ms | auto vs best |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    for r in rows:
        for mode, key in (("inference", "inference_ms"), ("training", "training_ms")):
            node, edge, auto = r["node"][key], r["edge"][key], r["auto"][key]
            excess = auto / min(node, edge) - 1
            worst = max(worst, excess)
            print(f"| {r['graph']} | {r['kind']} | {r['f']}x{r['heads']} | {r['auto_choice']} | {mode} "
                  f"| {node:.3f} | {edge:.3f} | {auto:.3f} | {excess:+.1%} |")
    print(f"\nworst excess of auto over the faster fixed schedule: {worst:+.1%} over {len(rows)} cases")


if __name__ == "__main__":
    main(sys.argv[1:])
