"""``hector bench`` output: terminal table, markdown, JSON and a PNG bar chart of speedups."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List

from . import targets

COLUMNS = ("layer", "dataset", "F x H", "peer", "inference ms", "training ms", "speedup inf",
           "speedup train", "peak MiB", "floor", "check")
#: Columns holding numbers: right-aligned in the terminal table and in markdown.
NUMERIC = {4, 5, 6, 7, 8, 9}


def _ms(r: dict, key: str) -> str:
    """median [min, max] of the runs, and 'noisy' when their spread stayed wide."""
    v = r.get(key)
    if v is not None:
        stage = key[:-len("_ms")]
        s = r.get(f"{stage}_spread")
        text = f"{v:.3f}" + (f" [{s['min_ms']:.3f}, {s['max_ms']:.3f}]" if s else "")
        return text + (" noisy" if stage in r.get("noisy", ()) else "")
    if "oom" in r:
        return "OOM"
    if "error" in r:
        return "ERR"
    return "-"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _check(r: dict) -> str:
    c = r.get("check", "-")
    if r.get("rel_err") is not None and c in ("ok", "MISMATCH"):
        errs = f"{r['rel_err']:.1e}"
        if r.get("grad_err") is not None:
            errs += f", grad {r['grad_err']:.1e}"
        return f"{c} ({errs})"
    return c


def cells(r: dict) -> List[str]:
    peak = r.get("peak_MiB")
    fl = r.get("floor_fraction")
    return [r["layer"], r["dataset"], f"{r.get('features', '-')}x{r.get('heads', '-')}",
            r["peer"], _ms(r, "inference_ms"), _ms(r, "training_ms"),
            _x(r.get("speedup_inference")), _x(r.get("speedup_training")),
            f"{peak:.1f}" if peak is not None else ("OOM" if "oom" in r else "-"),
            "-" if fl is None else f"{fl:.0%}", _check(r)]


def table(result: dict) -> str:
    """Fixed-width terminal table, then the notes and any errors."""
    body = [cells(r) for r in result["rows"]]
    widths = [max(len(c) for c in col) for col in zip(COLUMNS, *body)]

    def line(cs):
        return "  ".join(c.rjust(w) if i in NUMERIC else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cs, widths))).rstrip()
    out = [line(COLUMNS), line(["-" * w for w in widths])] + [line(c) for c in body]
    meta = result["meta"]
    out.append("")
    out.append(_legend(meta))
    for name, w in meta.get("workloads", {}).items():
        out.append(f"{w['dataset']} (scale {w['scale'] or 1}): {w['nodes']:,} nodes, "
                   f"{w['edges']:,} edges, {w['relations']} relations, {w['node_types']} node types")
    for n in result.get("notes", []):
        out.append(f"note: {n}")
    if result.get("targets"):
        where = ("" if str(meta.get("device", "")).startswith("cuda")
                 else "; they are set for one H200, so on the CPU only 'no hector OOM' "
                      "is judged")
        out += ["", "targets (hector at its best, eager or captured, against the best PyG peer "
                    f"of each case{where}):",
                targets.table(result["targets"])]
    for r in result["rows"]:
        if "error" in r:
            out.append(f"error: {r['layer']} / {r['peer']}: {r['error']}")
        if "oom" in r:
            out.append(f"OOM: {r['layer']} / {r['peer']} during {r['oom']}")
    return "\n".join(out)


def _legend(meta: dict) -> str:
    threads = (f", {meta['threads']} torch CPU thread{'s' if meta['threads'] != 1 else ''} "
               f"(--threads; {meta.get('cpus')} CPUs)" if meta.get("threads") else "")
    return (f"device {meta['device']}" + (f" ({meta['gpu']})" if meta.get("gpu") else "")
            + threads + f", hector backend {meta['backend']}, {meta.get('dtype', 'fp32')}"
            + (" with TF32 products" if meta.get("tf32") else "") + "; "
            "times: median [min, max] ms; speedup = PyG eager ms / peer ms; floor = "
            f"forward's memory floor at the measured copy bandwidth "
            f"({meta.get('copy_GBps', 0):.0f} GB/s) / inference ms; check: max |hector - PyG| / "
            f"max |PyG| < {meta['rtol']:g} for the output and the input gradient"
            + ("" if meta.get("dtype", "fp32") == "fp32" else
               f" (PyG eager in fp32 is the reference: every {meta['dtype']} peer, PyG's too, "
               "is checked against it)"))


def markdown(result: dict) -> str:
    out = ["| " + " | ".join(COLUMNS) + " |",
           "|" + "|".join("---:" if i in NUMERIC else "---" for i in range(len(COLUMNS)))
           + "|"]
    out += ["| " + " | ".join(cells(r)) + " |" for r in result["rows"]]
    meta = result["meta"]
    out.append("")
    out.append(_legend(meta) + f"; torch {meta['torch']}, torch_geometric "
               f"{meta['torch_geometric'] or 'not used'}.")
    for n in result.get("notes", []):
        out.append(f"- {n}")
    if result.get("targets"):
        out += ["", "| target | value | required | met | detail |", "|---|---:|---:|---|---|"]
        for t in result["targets"]:
            v = t["value"]
            out.append(f"| {t['target']} | {'-' if v is None else (f'{v:.2f}' if isinstance(v, float) else v)} "
                       f"| {t['op']} {t['required']} | {_verdict_md(t)} "
                       f"| {t['detail']} |")
    return "\n".join(out) + "\n"


def _verdict_md(t: dict) -> str:
    v = targets.verdict(t)
    return {"met": "yes", "MISSED": "**MISSED**"}.get(v, v)


def summary_markdown(result: dict) -> str:
    """One row per case: hector at its best (eager or captured) against PyG at its best."""
    def ms(v):
        return "-" if v is None else (f"{v:.2f}" if v < 100 else f"{v:.0f}")

    def ratio(a, b):
        return f"{a / b:.1f}x" if a and b else "-"
    out = ["| layer | graph | F x H | inference ms: hector / PyG | speedup | training ms: "
           "hector / PyG | speedup | peak MiB: hector / PyG | floor |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for c in targets.per_case(result["rows"]):
        h = c["hector"]
        oom = "OOM" if c["pyg_oom"] else "-"
        pi = ms(c["pyg_inference"]) if c["pyg_inference"] else oom
        pt = ms(c["pyg_training"]) if c["pyg_training"] else oom
        pm = f"{c['pyg_peak']:.0f}" if c["pyg_peak"] else oom
        fl = h.get("floor_fraction")
        hm = "-" if h.get("peak_MiB") is None else f"{h['peak_MiB']:.0f}"
        out.append(f"| {c['layer']} | {c['dataset'].replace('synthetic:', '')} | "
                   f"{h.get('features')}x{h.get('heads')} | {ms(h.get('inference_ms'))} / {pi} | "
                   f"{ratio(c['pyg_inference'], h.get('inference_ms'))} | "
                   f"{ms(h.get('training_ms'))} / {pt} | "
                   f"{ratio(c['pyg_training'], h.get('training_ms'))} | "
                   f"{hm} / {pm} | "
                   f"{'-' if fl is None else f'{fl:.0%}'} |")
    return "\n".join(out) + "\n"


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else str(v)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def write_json(result: dict, path) -> None:
    Path(path).write_text(json.dumps(_clean(result), indent=1))


def write_markdown(result: dict, path) -> None:
    Path(path).write_text(markdown(result))


def write_all(result: dict, json=None, markdown=None, plot=None) -> None:
    """Write each output whose path is given and say where."""
    for what, path, write in (("JSON", json, write_json), ("markdown", markdown, write_markdown),
                              ("plot", plot, write_plot)):
        if path:
            write(result, path)
            print(f"{what} written to {path}")


def plot_bars(result: dict) -> tuple:
    """(tick labels, inference speedups, training speedups) of the plot: one bar pair per
    case and non-PyG peer.  Labels carry the full dataset name (``synthetic:aifb`` is a
    generated graph with AIFB's profile, not AIFB)."""
    rows = [r for r in result["rows"] if r.get("peer") not in ("PyG eager", "*")]
    labels = [f"{r['layer']} {r.get('features', '')}x{r.get('heads', '')}\n{r['dataset']}\n"
              f"{r['peer']}" for r in rows]
    return (labels, [r.get("speedup_inference") or 0.0 for r in rows],
            [r.get("speedup_training") or 0.0 for r in rows])


def write_plot(result: dict, path) -> List[str]:
    """Bar chart: speedup over PyG eager, inference and training, per case and non-PyG peer,
    each bar labelled with its value.  Returns the value labels drawn."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    labels, inf, trn = plot_bars(result)
    fig, ax = plt.subplots(figsize=(min(60.0, max(4.0, 1.0 * len(labels) + 1.5)), 4.5))
    xs = range(len(labels))
    w = 0.38
    drawn = []
    for offset, values, name in ((-w / 2, inf, "inference"), (w / 2, trn, "training")):
        bars = ax.bar([i + offset for i in xs], values, w, label=name)
        texts = [f"{v:.2f}x" if v else "" for v in values]
        ax.bar_label(bars, labels=texts, fontsize=6, padding=1)
        drawn += texts
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("speedup over PyG eager (x)")
    if any(v > 20 for v in inf + trn):
        ax.set_yscale("log")
    meta = result["meta"]
    ax.set_title(f"hector bench on {meta.get('gpu') or meta['device']}"
                 + (f", suite {meta['suite']}" if meta.get("suite") else ""), fontsize=10)
    if not labels or not any(inf + trn):
        ax.text(0.5, 0.5, "no speedups (PyG not measured)", ha="center", va="center",
                transform=ax.transAxes)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return drawn
