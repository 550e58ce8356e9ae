"""Ablation of Hector's compiler passes on the GPU: RGCN, RGAT and HGT on the synthetic
fb15k, biokg and am profiles, with the reorder / compact / fuse switches, against PyG.

    python scripts/compiler_ablation.py [--profiles fb15k,biokg,am] [--models rgcn,rgat,hgt]
                                        [--rgat-heads8] [--quick] [--no-pyg] [--out FILE]

Per profile the dataset is generated on the GPU (``datasets.load('synthetic:<p>')``) and its
``hector.Graph`` built once (``dataset.graph``); features are random ``x [N, 64]``; layers
are 64 -> 64 with one head (``--rgat-heads8`` adds RGAT with 8 heads of 16).  Each hector
layer is taken over from one seeded PyG layer (``from_pyg(..., reorder=, compact=, fuse=,
backend='triton')``), so every setting and PyG hold the same parameters.  Settings:

    all on | reorder off | compact off | reorder+compact off (fuse on) | all off

Measured per (profile, model, setting): the first call (forward under no_grad; for hector
the pass pipeline, lowering of forward and backward and Triton JIT included), inference
(forward under no_grad) and training (forward + backward of out.sum(), x requiring grad) in
ms through triton.testing.do_bench (median), and the peak memory of one inference and of one
training step (max_memory_allocated minus what was allocated before it).  ``err`` is the
relative max-abs difference of the forward output from the 'all on' setting (for PyG rows:
from hector 'all on').  An OOM (torch.cuda.OutOfMemoryError) shows as OOM in the columns
not measured before it (a layer that runs out of memory only in training keeps its
inference figures); other exceptions as ERR, with a traceback.
``steps fwd/bwd``: kernel steps of the forward / backward plans (JSON: per template, and the
pass decisions applied).
PyG runs eagerly on edge_index / edge_type (HGTConv on x_dict / edge_index_dict in per-type
local ids).  Prints a markdown table and writes JSON to --out after every case.

``--device cpu`` is a dry run for development machines (profiles at --scale 0.001, backend
'torch', wall-clock timing, no memory figures).
"""
import argparse
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

SETTINGS = [
    ("all on", dict(reorder=True, compact=True, fuse=True)),
    ("reorder off", dict(reorder=False, compact=True, fuse=True)),
    ("compact off", dict(reorder=True, compact=False, fuse=True)),
    ("reorder+compact off", dict(reorder=False, compact=False, fuse=True)),
    ("all off", dict(reorder=False, compact=False, fuse=False)),
]
QUICK_SETTINGS = ("all on", "reorder+compact off", "all off")
DIM = 64


def log(*a):
    print(*a, flush=True)


# -- inputs ---------------------------------------------------------------------------------
class Workload:
    """One profile: dataset, its prebuilt Graph, features, HGT metadata, PyG inputs."""

    def __init__(self, profile, device, scale, seed=0):
        from hector import Graph, datasets
        kw = {} if scale is None else {"scale": scale}
        t0 = time.perf_counter()
        self.ds = datasets.load(f"synthetic:{profile}", device=device, seed=seed, **kw)
        sync(device)
        self.gen_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.graph = self.ds.graph                        # built once, shared by every layer
        sync(device)
        self.build_s = time.perf_counter() - t0
        g = self.graph
        self.profile, self.device = profile, device
        gen = torch.Generator(device=device).manual_seed(seed)
        self.x = torch.randn(g.num_nodes, DIM, generator=gen, device=device)
        types = list(g.node_type_names) if g.node_type_names else ["n"]
        ptr = g.node_type_ptr.tolist()
        self.counts = {t: ptr[i + 1] - ptr[i] for i, t in enumerate(types)}
        self.offsets = {t: ptr[i] for i, t in enumerate(types)}
        rels = g.relation_names or [(types[0], "", types[0])] * g.num_relations
        # relation names of KGs contain '.', which PyG's ParameterDict keys cannot: number them
        self.metadata = (types, [(s, f"r{i}", d) for i, (s, _, d) in enumerate(rels)])
        # HGTConv checks a prebuilt Graph's relation names against its metadata: the same
        # structure under the renamed relations.
        self.hgt_graph = Graph(g.input_edge_index(), edge_type=g.input_edge_type(),
                               num_nodes=g.num_nodes, num_relations=g.num_relations,
                               node_type=g.node_type.long(), num_node_types=len(types),
                               node_type_names=types, relation_names=self.metadata[1])
        self._pyg_hetero = None

    def describe(self):
        g = self.graph
        return (f"synthetic:{self.profile}: {g.num_nodes:,} nodes, {g.num_edges:,} edges, "
                f"{g.num_relations} relations, {g.num_node_types} node types, max in-degree "
                f"{g.in_degree.max}; compact rows src {g.compact_src.num_rows:,} dst "
                f"{g.compact_dst.num_rows:,}; generated in {self.gen_s:.2f} s, Graph built in "
                f"{self.build_s:.2f} s")

    def split(self, x):
        return dict(zip(self.counts, torch.split(x, list(self.counts.values()), dim=0)))

    def pyg_relational(self):
        ei = self.ds.edge_index
        et = self.ds.edge_type if self.ds.edge_type is not None else \
            torch.zeros(ei.shape[1], dtype=torch.long, device=ei.device)
        return ei, et

    def pyg_hetero(self):
        """{(src, 'r<i>', dst): local edge_index}, every relation included."""
        if self._pyg_hetero is None:
            ei, et = self.pyg_relational()
            order = torch.argsort(et, stable=True)
            per = torch.bincount(et, minlength=self.graph.num_relations).tolist()
            out = {}
            for (s, r, d), part in zip(self.metadata[1], torch.split(ei[:, order], per, dim=1)):
                shift = torch.tensor([[self.offsets[s]], [self.offsets[d]]], device=ei.device)
                out[(s, r, d)] = (part - shift).contiguous()
            self._pyg_hetero = out
        return self._pyg_hetero


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# -- layers ---------------------------------------------------------------------------------
MODELS = ("rgcn", "rgat", "rgat-h8", "hgt")


def pyg_layer(model, W):
    """The seeded PyG layer every setting takes its parameters from (on the CPU)."""
    import torch_geometric.nn as pyg
    torch.manual_seed(0)
    R = W.graph.num_relations
    if model == "rgcn":
        return pyg.RGCNConv(DIM, DIM, R)
    if model == "rgat":
        return pyg.RGATConv(DIM, DIM, R, heads=1)
    if model == "rgat-h8":
        return pyg.RGATConv(DIM, 16, R, heads=8)
    if model == "hgt":
        return pyg.HGTConv(DIM, DIM, W.metadata, heads=1)
    raise ValueError(f"unknown model {model!r}; choose from {MODELS}")


def hector_layer(model, ref, switches, backend):
    from hector import nn as hnn
    cls = {"rgcn": hnn.RGCNConv, "rgat": hnn.RGATConv, "rgat-h8": hnn.RGATConv,
           "hgt": hnn.HGTConv}[model]
    return cls.from_pyg(ref, backend=backend, **switches)


def caller(model, layer, W, pyg):
    """x -> output tensor (HGT: the node types' outputs concatenated in sorted order)."""
    if model == "hgt":
        eid = W.pyg_hetero() if pyg else W.hgt_graph

        def call(x):
            out = layer(W.split(x), eid)
            return torch.cat([out[t] for t in sorted(out)], 0) if len(out) > 1 else \
                next(iter(out.values()))
        return call
    if pyg:
        ei, et = W.pyg_relational()
        return lambda x: layer(x, ei, et)
    return lambda x: layer(x, W.graph)


# -- measuring ------------------------------------------------------------------------------
def bench(fn, device, warmup, rep):
    if torch.device(device).type == "cuda":
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    fn()                                 # CPU dry run: wall clock, median of 3
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def rel_err(a, b):
    if a is None or b is None:
        return None
    if a.shape != b.shape:
        return float("inf")
    d = (a.float() - b.float()).abs().max()
    return float(d / b.float().abs().max().clamp_min(1e-12))


def measure(layer, call, x, device, warmup, rep):
    """{first_call_s, inference_ms, peak_infer_MiB, training_ms, peak_train_MiB, out}; an OOM
    adds {oom: stage} and an exception {error: text}, keeping what was measured before (so a
    layer that only runs out of memory in training still has its inference figures).
    ``out`` is the forward output (no grad), for the error column."""
    cuda = torch.device(device).type == "cuda"
    res, stage = {}, "first call"
    xg = x.detach().clone().requires_grad_()

    def step():
        layer.zero_grad(set_to_none=True)
        xg.grad = None
        call(xg).sum().backward()

    try:
        with torch.no_grad():
            t0 = time.perf_counter()
            out = call(x)            # hector: pass pipeline, lowering (fwd + bwd), Triton JIT
            sync(device)
            res["first_call_s"] = time.perf_counter() - t0
            res["out"] = out
            stage = "inference"
            res["inference_ms"] = bench(lambda: call(x), device, warmup, rep)
            if cuda:
                stage = "inference memory"
                del out
                res.pop("out")
                sync(device)
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                out = call(x)
                sync(device)
                res["peak_infer_MiB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
                res["out"] = out
        del out
        stage = "first training step"
        step()
        sync(device)
        if cuda:
            stage = "training memory"
            layer.zero_grad(set_to_none=True)
            xg.grad = None
            sync(device)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            sync(device)
            res["peak_train_MiB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        stage = "training"
        res["training_ms"] = bench(step, device, warmup, rep)
    except torch.cuda.OutOfMemoryError:
        res["oom"] = stage
    except Exception as exc:     # report and go on with the next case
        res["error"] = f"{stage}: {type(exc).__name__}: {str(exc)[:300]}"
        traceback.print_exc()
        sys.stderr.flush()
    layer.zero_grad(set_to_none=True)
    xg.grad = None
    return res


def plan_summary(layer):
    """What the compiler made of the layer on this graph (hector layers only): steps per
    template of the forward / backward plans and the pass decisions it applied."""
    program = getattr(layer, "program", None)
    cache = getattr(program, "_cache", None)
    if not cache:
        return None
    cp = list(cache.values())[-1]

    def count(plan):
        out = {}
        for st in (plan.steps if plan is not None else ()):
            out[st.template] = out.get(st.template, 0) + 1
        return out
    fwd, bwd = count(cp.forward_plan), count(cp.backward_plan)
    return {"forward": fwd, "backward": bwd, "forward_steps": sum(fwd.values()),
            "backward_steps": sum(bwd.values()),
            "applied": [str(d) for rec in cp.log for d in rec.decisions if d.applied]}


def cleanup(device):
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def cell(r, key, fmt="{:.3f}"):
    if r.get("skipped"):
        return "skipped"
    v = r.get(key)
    if v is not None:
        return fmt.format(v)
    if "oom" in r:
        return "OOM"
    if "error" in r:
        return "ERR"
    return "-"


HEADER = ("| profile | model | setting | inference ms | training ms | peak train MiB | "
          "peak infer MiB | first call s | steps fwd/bwd | err |")
RULE = "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"


def row_md(r):
    err = r.get("err")
    return (f"| {r['profile']} | {r['model']} | {r['setting']} | {cell(r, 'inference_ms')} | "
            f"{cell(r, 'training_ms')} | {cell(r, 'peak_train_MiB', '{:.0f}')} | "
            f"{cell(r, 'peak_infer_MiB', '{:.0f}')} | {cell(r, 'first_call_s', '{:.2f}')} | "
            f"{steps(r)} | {'-' if err is None else f'{err:.1e}'} |")


def steps(r):
    plan = r.get("plan")
    if not plan or "forward_steps" not in plan:
        return "-"
    return f"{plan['forward_steps']}/{plan['backward_steps']}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", default="fb15k,biokg,am")
    p.add_argument("--models", default="rgcn,rgat,hgt", help=f"from {','.join(MODELS)}")
    p.add_argument("--rgat-heads8", action="store_true", help="add RGAT with 8 heads of 16")
    p.add_argument("--quick", action="store_true", help="warmup 5 / rep 20 ms and only the "
                   f"settings {', '.join(QUICK_SETTINGS)}")
    p.add_argument("--no-pyg", action="store_true", help="skip the PyG reference rows")
    p.add_argument("--warmup", type=float, default=10, help="do_bench warmup, ms")
    p.add_argument("--rep", type=float, default=50, help="do_bench rep, ms")
    p.add_argument("--time-budget", type=float, default=540, help="seconds; cases after it "
                   "are recorded as skipped (the device allows 600 s per command)")
    p.add_argument("--out", default="compiler_ablation.json")
    p.add_argument("--backend", default=None, help=argparse.SUPPRESS)
    p.add_argument("--scale", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)   # 'cpu': dry run
    args = p.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        log("CUDA is not available; this benchmark needs a GPU (--device cpu: dry run)")
        return 2
    backend = args.backend or ("triton" if cuda else "torch")
    scale = args.scale if args.scale is not None else (None if cuda else 0.001)
    warmup, rep = (5, 20) if args.quick else (args.warmup, args.rep)
    settings = [s for s in SETTINGS if not args.quick or s[0] in QUICK_SETTINGS]
    models = args.models.split(",")
    if args.rgat_heads8 and "rgat-h8" not in models:
        models.insert(models.index("rgat") + 1 if "rgat" in models else len(models), "rgat-h8")
    for m in models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; choose from {','.join(MODELS)}")
    torch.manual_seed(0)
    import triton
    import torch_geometric
    log(f"torch {torch.__version__}, triton {triton.__version__}, torch_geometric "
        f"{torch_geometric.__version__}, device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if cuda else "")
        + f", backend {backend}, tf32 {torch.backends.cuda.matmul.allow_tf32}, "
        f"scale {scale or 1}, warmup {warmup} ms, rep {rep} ms")
    t_start = time.perf_counter()
    rows, meta = [], {"device": str(device), "backend": backend, "scale": scale or 1.0,
                      "warmup_ms": warmup, "rep_ms": rep, "torch": torch.__version__,
                      "triton": triton.__version__, "profiles": {}}
    if cuda:
        meta["gpu"] = torch.cuda.get_device_name(device)

    def save():
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    def over_budget():
        return time.perf_counter() - t_start > args.time_budget

    log(HEADER)
    log(RULE)
    for profile in args.profiles.split(","):
        if over_budget():
            log(f"(time budget of {args.time_budget:.0f} s spent: profile {profile} skipped)")
            rows.append(dict(profile=profile, model="*", setting="*", skipped="time budget"))
            continue
        try:
            W = Workload(profile, device, scale)
        except torch.cuda.OutOfMemoryError:
            log(f"(profile {profile}: OOM while generating / building the graph; skipped)")
            cleanup(device)
            continue
        except Exception:
            log(f"(profile {profile}: generating / building failed; skipped)")
            traceback.print_exc()
            continue
        log(f"<!-- {W.describe()} -->")
        meta["profiles"][profile] = dict(nodes=W.graph.num_nodes, edges=W.graph.num_edges,
                                         relations=W.graph.num_relations,
                                         node_types=W.graph.num_node_types,
                                         max_in_degree=W.graph.in_degree.max,
                                         compact_src_rows=W.graph.compact_src.num_rows,
                                         compact_dst_rows=W.graph.compact_dst.num_rows,
                                         generate_s=W.gen_s, graph_build_s=W.build_s)
        for model in models:
            ref_out = None
            try:
                ref = pyg_layer(model, W)
            except Exception:
                log(f"(profile {profile}, model {model}: building the PyG layer failed)")
                traceback.print_exc()
                continue
            variants = [(name, sw) for name, sw in settings] + ([] if args.no_pyg else
                                                                 [("PyG (eager)", None)])
            for name, sw in variants:
                row = dict(profile=profile, model=model, setting=name,
                           switches=sw, backend=backend if sw is not None else "pyg")
                if over_budget():
                    row["skipped"] = "time budget"
                    rows.append(row)
                    log(row_md(row))
                    continue
                layer = None
                try:
                    if sw is None:
                        layer = ref.to(device)
                    else:
                        layer = hector_layer(model, ref, sw, backend).to(device)
                    res = measure(layer, caller(model, layer, W, sw is None), W.x, device,
                                  warmup, rep)
                except torch.cuda.OutOfMemoryError:
                    res = {"oom": "setup"}
                except Exception as exc:
                    res = {"error": f"setup: {type(exc).__name__}: {str(exc)[:300]}"}
                    traceback.print_exc()
                    sys.stderr.flush()
                try:
                    plan = plan_summary(layer)
                except Exception as exc:     # private structure: informative only
                    plan = {"error": f"{type(exc).__name__}: {exc}"}
                if plan is not None:
                    row["plan"] = plan
                out = res.pop("out", None)
                if ref_out is None and sw is not None and out is not None and name == "all on":
                    ref_out = out
                else:
                    row["err"] = rel_err(out, ref_out)
                    del out
                row.update(res)
                rows.append(row)
                log(row_md(row))
                if "error" in row:
                    log(f"<!-- {profile}/{model}/{name}: {row['error']} -->")
                save()
                if sw is None:
                    ref.cpu()
                del layer
                cleanup(device)
            del ref, ref_out
            cleanup(device)
        del W
        cleanup(device)
    total = time.perf_counter() - t_start
    meta["total_s"] = total
    save()
    log("")
    log(HEADER)
    log(RULE)
    for r in rows:
        if r.get("model") != "*":
            log(row_md(r))
    bad = [f"{r['profile']}/{r['model']}/{r['setting']}" for r in rows if "error" in r]
    ooms = [f"{r['profile']}/{r['model']}/{r['setting']}" for r in rows if "oom" in r]
    log(f"\n{len(rows)} rows in {total:.0f} s; OOM: {', '.join(ooms) or 'none'}; errors: "
        f"{', '.join(bad) or 'none'}; JSON in {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
