"""hector's performance targets (the papers' settings on one H200), evaluated on a finished
``hector bench`` result.

Every ratio is hector at its best against PyG at its best in the same case: for time, the
faster of hector eager and hector captured in CUDA graphs, against the fastest of PyG eager,
``torch.compile`` and ``torch.compile(mode="reduce-overhead")``; for memory, hector eager's peak
against the leanest PyG peer (a replayed CUDA graph allocates nothing new, so its peak says
nothing).
Cases where no PyG peer ran (OOM) leave the speedup geomean (there is nothing to divide) but
count for "no OOM".  A target computed from a timing flagged noisy (see ``timing``) gets no
verdict: ``met`` is None and ``noisy`` True; one with nothing to compute from (PyG not run)
has ``met`` None too.
The targets are set for one H200: a run on another device (``meta['device']`` not CUDA) gets
no verdict on them (``met`` None, ``not_judged`` naming the device) -- on the CPU hector runs
its torch backend, which the speedup, memory and floor targets were never set for.  Only
"no hector OOM" is judged anywhere: a hector layer that fails is a failure on any device.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

from .suites import RELATIONAL

#: (layer family, stage) -> geometric-mean speedup required
SPEEDUP = {("relational", "inference"): 10.0, ("relational", "training"): 10.0,
           ("attention", "inference"): 8.0, ("attention", "training"): 5.0}
MEMORY_RATIO = 0.25             # hector peak <= 1/4 of PyG's
FLOOR_FRACTION = 0.70           # forward of RGAT, HGT, GAT on the largest profiles
FLOOR_LAYERS = ("rgat", "hgt", "gat")
LARGEST = ("synthetic:mag", "synthetic:wikikg2", "synthetic:reddit", "synthetic:products")
PYG = ("PyG eager", "PyG compile", "PyG compile RO")
HECTOR = ("hector", "hector captured")
REPLAYED = ("PyG compile RO", "hector captured")     # CUDA graph replays: no peak of their own
#: The optimised plan at most this much slower than the unoptimised one (eager against
#: eager, timed in interleaved rounds by the runner): the compiler's passes must not cost.
UNOPT_RATIO = 1.05


def family(layer: str) -> str:
    return "relational" if layer in RELATIONAL else "attention"


def _best(rows: List[dict], key: str, lower=True) -> Optional[float]:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return (min(vals) if lower else max(vals)) if vals else None


def _best_row(rows: List[dict], key: str) -> Optional[dict]:
    have = [r for r in rows if r.get(key) is not None]
    return min(have, key=lambda r: r[key]) if have else None


def noisy(row: Optional[dict], stage: str) -> bool:
    return row is not None and stage in row.get("noisy", ())


def verdict(t: dict) -> str:
    """met / MISSED, or why there is none (not a GPU run, noisy timings, nothing measured)."""
    if t.get("not_judged"):
        return f"not judged on {t['not_judged']}"
    if t.get("noisy"):
        return "noisy"
    return "n/a" if t["met"] is None else ("met" if t["met"] else "MISSED")


def geomean(values: List[float]) -> Optional[float]:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def per_case(rows: List[dict]) -> List[dict]:
    """One entry per case: hector's row and the best PyG figures."""
    cases: Dict[str, List[dict]] = {}
    for r in rows:
        cases.setdefault(r["case"], []).append(r)
    out = []
    for key, rs in cases.items():
        eager = next((r for r in rs if r["peer"] == "hector"), None)
        if eager is None:
            continue
        ours = dict(eager)
        best = {}
        for stage in ("inference", "training"):
            row = _best_row([r for r in rs if r["peer"] in HECTOR], f"{stage}_ms")
            if row is not None:
                ours[f"{stage}_ms"], best[stage] = row[f"{stage}_ms"], row
                ours[f"{stage}_peer"] = row["peer"]
        ours["noisy"] = [s for s, row in best.items() if noisy(row, s)]
        pyg = [r for r in rs if r["peer"] in PYG]
        out.append(dict(case=key, layer=ours["layer"], dataset=ours["dataset"], hector=ours,
                        pyg_ran=bool(pyg),
                        pyg_inference=_best(pyg, "inference_ms"),
                        pyg_training=_best(pyg, "training_ms"),
                        pyg_peak=_best([r for r in pyg if r["peer"] not in REPLAYED],
                                       "peak_MiB"),
                        pyg_oom=any("oom" in r for r in pyg),
                        **{f"noisy_{s}": noisy(ours, s) or noisy(_best_row(pyg, f"{s}_ms"), s)
                           for s in ("inference", "training")}))
    return out


def evaluate(result: dict) -> List[dict]:
    """[{target, value, required, met, detail}] for the families present in ``result``."""
    entries = per_case(result["rows"])
    out = []
    for fam in ("relational", "attention"):
        fam_cases = [c for c in entries if family(c["layer"]) == fam]
        if not fam_cases:
            continue
        for stage in ("inference", "training"):
            used = [c for c in fam_cases if c[f"pyg_{stage}"] and c["hector"].get(f"{stage}_ms")]
            ratios = [c[f"pyg_{stage}"] / c["hector"][f"{stage}_ms"] for c in used]
            g = geomean(ratios)
            need = SPEEDUP[(fam, stage)]
            shaky = [c["case"] for c in used if c[f"noisy_{stage}"]]
            out.append(dict(target=f"{fam} {stage} speedup (geomean)", value=g, op=">=",
                            required=need, noisy=bool(shaky),
                            met=None if g is None or shaky else g >= need,
                            detail=f"over {len(ratios)} of {len(fam_cases)} cases where PyG ran"
                                   + (f"; noisy timings: {', '.join(shaky)}" if shaky else "")))
        ooms = [c["case"] for c in fam_cases if "oom" in c["hector"] or "error" in c["hector"]]
        out.append(dict(target=f"{fam}: no hector OOM", value=len(ooms), op="=",
                        required=0, any_device=True,
                        met=not ooms, detail=", ".join(ooms) or f"{len(fam_cases)} cases"))
    out += _against_unoptimised(result["rows"])
    mem = [(c["case"], c["hector"]["peak_MiB"] / c["pyg_peak"]) for c in entries
           if c["pyg_peak"] and c["hector"].get("peak_MiB") is not None]
    if mem:
        worst = max(mem, key=lambda t: t[1])
        out.append(dict(target="peak memory / PyG's (worst case)", value=worst[1], op="<=",
                        required=MEMORY_RATIO, met=worst[1] <= MEMORY_RATIO,
                        detail=f"worst {worst[0]}; {sum(v <= MEMORY_RATIO for _, v in mem)} "
                               f"of {len(mem)} cases within"))
    floor_cases = [c for c in entries if c["layer"] in FLOOR_LAYERS and c["dataset"] in LARGEST
                   and c["hector"].get("floor_fraction") is not None]
    floors = [(c["case"], c["hector"]["floor_fraction"]) for c in floor_cases]
    if floors:
        worst = min(floors, key=lambda t: t[1])
        shaky = any(noisy(c["hector"], "inference") for c in floor_cases)
        out.append(dict(target="forward at fraction of memory floor (largest profiles, worst)",
                        value=worst[1], op=">=", required=FLOOR_FRACTION, noisy=shaky,
                        met=None if shaky else worst[1] >= FLOOR_FRACTION,
                        detail=f"worst {worst[0]}; " + ", ".join(
                            f"{k} {v:.0%}" for k, v in floors)))
    off_gpu = _off_gpu(result)
    if off_gpu:
        for t in out:
            if not t.get("any_device"):
                t.update(met=None, not_judged=off_gpu)
    return out


def _off_gpu(result: dict) -> Optional[str]:
    """The device a run not on CUDA ran on ("CPU"), else None.  A result without a device
    (hand-built rows) is judged."""
    device = str(result.get("meta", {}).get("device", "cuda"))
    if device.startswith("cuda"):
        return None
    kind = device.split(":")[0]
    return "CPU" if kind == "cpu" else kind


def _against_unoptimised(rows: List[dict]) -> List[dict]:
    """The worst ratio of the optimised plan's time to the unoptimised plan's (both eager, in
    the same case and stage), over the cases that ran both."""
    by_case: Dict[str, Dict[str, dict]] = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["peer"]] = r
    ratios, shaky = [], []
    for case, peers in by_case.items():
        opt, plain = peers.get("hector"), peers.get("hector unopt")
        if opt is None or plain is None:
            continue
        for stage in ("inference", "training"):
            a, b = opt.get(f"{stage}_ms"), plain.get(f"{stage}_ms")
            if a and b:
                ratios.append((f"{case} {stage}", a / b))
                if noisy(opt, stage) or noisy(plain, stage):
                    shaky.append(f"{case} {stage}")
    if not ratios:
        return []
    worst = max(ratios, key=lambda t: t[1])
    over = [k for k, v in ratios if v > UNOPT_RATIO]
    return [dict(target="optimised / unoptimised plan time (worst)", value=worst[1], op="<=",
                 required=UNOPT_RATIO, noisy=bool(shaky and over),
                 met=None if shaky and over else worst[1] <= UNOPT_RATIO,
                 detail=f"worst {worst[0]}; {len(ratios) - len(over)} of {len(ratios)} within"
                        + (f"; over: {', '.join(over)}" if over else "")
                        + (f"; noisy timings: {', '.join(shaky)}" if shaky else ""))]


def table(targets: List[dict]) -> str:
    lines = []
    width = max([6] + [len(verdict(t)) for t in targets])
    for t in targets:
        v = t["value"]
        val = "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
        lines.append(f"{verdict(t):<{width}}  {t['target']}: {val} "
                     f"(required {t['op']} {t['required']}) - {t['detail']}")
    return "\n".join(lines)
