"""Merge ``hector bench --json`` results (chunks of a suite, possibly from several device
calls) into one result: rows and notes concatenated, targets evaluated over all of them, and
the terminal table, JSON, markdown and PNG written.

    python scripts/bench_merge.py a.json b.json --json all.json --markdown all.md --plot all.png
"""
import argparse
import json
import sys

from hector.bench import report, targets


def merge(paths):
    results = [json.loads(open(p).read()) for p in paths]
    if not results:
        raise SystemExit("bench_merge: no input files")
    meta = dict(results[0]["meta"])
    meta["workloads"] = {}
    rows, notes, seen = [], [], set()
    for r in results:
        meta["workloads"].update(r["meta"].get("workloads", {}))
        for row in r["rows"]:
            key = (row.get("case"), row.get("peer"))
            if key in seen:          # a rerun of a case replaces nothing: first one wins
                continue
            seen.add(key)
            rows.append(row)
        notes += [n for n in r.get("notes", []) if n not in notes]
    out = {"meta": meta, "notes": notes, "rows": rows, "sources": list(paths)}
    out["targets"] = targets.evaluate(out)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+")
    p.add_argument("--json")
    p.add_argument("--markdown")
    p.add_argument("--plot")
    p.add_argument("--summary", help="write one markdown row per case: hector at its best "
                                      "(eager or captured) against the best PyG peer")
    a = p.parse_args(argv)
    res = merge(a.inputs)
    print(report.table(res))
    report.write_all(res, json=a.json, markdown=a.markdown, plot=a.plot)
    if a.summary:
        with open(a.summary, "w") as f:
            f.write(report.summary_markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
