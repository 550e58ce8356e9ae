"""Run ``hector bench``: check each hector layer against PyG, then time inference and training
of every peer and record peak memory (CUDA)."""
from __future__ import annotations

import gc
import os
import sys
from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Optional

import torch

from . import floor, suites, targets
from ..checks import check_device_option
from ..device import tf32_matmuls
from ..compiler.warm import enabled as warm_enabled, warm_graphs
from .paper import ATTENTION_PROFILES, ATTENTION_REAL, HETERO_PROFILES, SUITES, suite
from .timing import CPU_MAX_S, MIN_RUNS, NOISE_IQR, ROUNDS, interleaved, timed

#: torch.compile unrolls PyG's per-relation Python loop: past this many relations compiling
#: takes minutes, so the compiled peer is skipped (with a note) for RGCN and RGAT
COMPILE_MAX_RELATIONS = 64
RTOL = 1e-4                        # relative max-abs error allowed against PyG (fp32)
#: --dtype: the storage dtype of features, parameters and messages for every peer
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: the check's tolerance in half precision (against PyG in fp32; fp32 runs use RTOL)
HALF_RTOL = {"bf16": 3e-2, "fp16": 5e-3}
#: the check's tolerance with --tf32 (10-bit mantissas in every peer's fp32 products)
TF32_RTOL = 5e-3


@dataclass
class BenchConfig:
    layers: Optional[List[str]] = None   # None: rgcn,gat (or every layer of --suite)
    dataset: Optional[str] = None      # None: synthetic:aifb (relational), synthetic:cora (attention)
    root: Optional[str] = None
    scale: Optional[float] = None      # None: profile size (CPU: 0.2 for the default relational one)
    features: Optional[int] = None    # None: 64 on CUDA, 32 on the CPU
    heads: int = 1
    device: Optional[str] = None       # None: cuda if available, else cpu
    repeats: int = 5                   # CPU timing: at least this many runs after one warm-up
    no_pyg: bool = False
    seed: int = 0
    progress: bool = True
    suite: Optional[str] = None        # 'hetero', 'attention', 'all': the paper settings
    data_root: Optional[str] = None    # folder holding the real graphs of --suite attention
    compile_pyg: Optional[bool] = None  # None: on CUDA only
    capture: Optional[bool] = None     # time hector captured in CUDA graphs; None: on CUDA only
    check_grad: bool = True            # also compare the input gradient against PyG's
    datasets: Optional[List[str]] = None  # with --suite: only these datasets (profile names)
    threads: Optional[int] = None      # torch CPU threads while timing; None: 1 on the CPU
    dtype: str = "fp32"                # storage dtype of every peer: fp32, bf16, fp16
    tf32: bool = False                 # fp32 matmuls of every peer on TF32 tensor cores


def require(module: str, what: str):
    """Import an optional dependency of ``hector bench``; ValueError (one line, naming the
    extra that installs it) when it is missing."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError:
        hint = " (or pass --no-pyg to time hector alone)" if module == "torch_geometric" else ""
        raise ValueError(f"{what}: {module} is not installed; install the bench extra: "
                         f"pip install 'hector[bench]'{hint}") from None


def _positive_int(name: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"--{name} must be a positive integer, got {v!r}")


def resolve(cfg: BenchConfig) -> BenchConfig:
    """Validate every option (ValueError naming the option) and fill in the defaults."""
    if cfg.suite is not None:
        if cfg.suite not in SUITES + ("all",):
            raise ValueError(f"--suite must be one of {', '.join(SUITES + ('all',))}, "
                             f"got {cfg.suite!r}")
        for opt, v in (("dataset", cfg.dataset), ("root", cfg.root), ("features", cfg.features),
                       ("scale", cfg.scale)):
            if v is not None:
                raise ValueError(f"--{opt} cannot be combined with --suite (the suite fixes it)")
        if cfg.heads != 1:
            raise ValueError("--heads cannot be combined with --suite (the suite fixes it)")
    elif cfg.data_root is not None or cfg.datasets is not None:
        raise ValueError(f"--{'data-root' if cfg.data_root is not None else 'datasets'} is only "
                         "used by --suite")
    datasets = cfg.datasets
    if isinstance(datasets, str):
        datasets = [d.strip() for d in datasets.split(",") if d.strip()]
    if datasets is not None:
        known = set(HETERO_PROFILES + ATTENTION_PROFILES) | {n for n, _ in ATTENTION_REAL}
        bad = [d for d in datasets if d not in known]
        if bad or not datasets:
            raise ValueError(f"--datasets: unknown name(s) {bad or datasets!r}; the suites "
                             f"hold {', '.join(sorted(known))}")
    if cfg.data_root is not None and not os.path.isdir(cfg.data_root):
        raise ValueError(f"--data-root: {cfg.data_root!r} is not a folder")
    layers = suites.parse_layers(cfg.layers if (cfg.layers or cfg.suite is None)
                                 else list(suites.LAYERS))
    if cfg.dataset is not None:
        suites.check_dataset(cfg.dataset)
    dev = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = check_device_option(dev)
    cuda = device.type == "cuda"
    features = cfg.features
    if cfg.suite is None:
        features = features if features is not None else (64 if cuda else 32)
        _positive_int("features", features)
    _positive_int("heads", cfg.heads)
    if cfg.heads > 1 and features % cfg.heads:
        raise ValueError(f"--features ({features}) must be divisible by --heads ({cfg.heads})")
    if cfg.scale is not None and not (cfg.scale > 0):
        raise ValueError(f"--scale must be > 0, got {cfg.scale!r}")
    _positive_int("repeats", cfg.repeats)
    if cfg.dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    # One CPU thread by default: the verdicts compare hector with PyG on the same work, and
    # one thread keeps that comparison independent of the core count and of other load (on a
    # busy 2-core machine a GAT epoch took 364 ms with 2 threads, 112 ms with 1).
    threads = cfg.threads if cfg.threads is not None else (None if cuda else 1)
    if threads is not None:
        _positive_int("threads", threads)
    if cfg.root is not None and cfg.dataset is None:
        raise ValueError("--root needs --dataset (the default datasets are synthetic)")
    compile_pyg = cuda if cfg.compile_pyg is None else bool(cfg.compile_pyg)
    if cfg.capture and not cuda:
        raise ValueError("--capture needs CUDA (hector captured is timed as CUDA graphs)")
    capture = cuda if cfg.capture is None else bool(cfg.capture)
    return replace(cfg, layers=layers, features=features, device=str(device),
                   compile_pyg=compile_pyg, capture=capture, datasets=datasets,
                   threads=threads)


def cases_of(cfg: BenchConfig) -> tuple:
    """([Case], notes) of a resolved config: the suite's cases (filtered by --layers), or
    each layer on --dataset (or its default dataset) at --features x --heads."""
    if cfg.suite is not None:
        cases, notes = suite(cfg.suite, cfg.data_root)
        keep = [c for c in cases if c.layer in cfg.layers and (
            cfg.datasets is None or c.dataset.replace("synthetic:", "") in cfg.datasets)]
        return keep, list(notes)
    cuda = torch.device(cfg.device).type == "cuda"
    out = []
    for layer in cfg.layers:
        scale = cfg.scale
        if scale is None and cfg.dataset is None and not cuda and layer in suites.RELATIONAL:
            scale = suites.CPU_DEFAULT_RELATIONAL_SCALE
        heads = 1 if layer == "agnn" else cfg.heads      # AGNN has no heads
        out.append(suites.Case(layer, cfg.dataset or suites.default_dataset(layer),
                               cfg.features, heads, scale=scale, root=cfg.root))
    return out, []


# -- measuring ----------------------------------------------------------------------------
def is_oom(exc: BaseException) -> bool:
    oom_cls = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_cls is not None and isinstance(exc, oom_cls)) or \
        (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.shape != ref.shape:
        return float("inf")
    d = (out.detach().float() - ref.detach().float()).abs().max()
    return float(d / ref.detach().float().abs().max().clamp_min(1e-12))


def _stages(peer: suites.Peer, x: torch.Tensor):
    """(inference call, training step, the step's input) of ``peer`` on ``x``."""
    module, call = peer.module, peer.call
    xg = x.detach().clone().requires_grad_()

    def infer():
        with torch.no_grad():
            call(x)

    def step():
        module.zero_grad(set_to_none=True)
        xg.grad = None
        call(xg).sum().backward()

    if peer.extra.get("captured"):
        infer, step = captured(infer, step, module, xg)
    return infer, step, xg


def record(res: dict, stage: str, stats: dict) -> None:
    """A timing ``summary`` into a result row as ``{stage}_ms``, its spread, and ``noisy``."""
    res[f"{stage}_ms"] = stats["ms"]
    res[f"{stage}_spread"] = {k: stats[k] for k in ("min_ms", "max_ms", "runs", "iqr")}
    if stats["noisy"] and stage not in res.get("noisy", ()):
        res.setdefault("noisy", []).append(stage)
    elif not stats["noisy"] and stage in res.get("noisy", ()):
        res["noisy"].remove(stage)


def measure(peer: suites.Peer, x: torch.Tensor, device: torch.device, repeats: int,
            time_it: bool = True) -> dict:
    """{inference_ms, training_ms, peak_MiB}; an OOM leaves {'oom': stage}, other exceptions
    {'error': text}, keeping what was measured before.  ``time_it`` False: one run of each
    stage and the peak memory only (the runner times the peer with another, interleaved)."""
    res: dict = {}
    stage = "inference"
    module = peer.module
    infer, step, xg = _stages(peer, x)
    try:
        if time_it:
            record(res, "inference", timed(infer, device, repeats))
        else:
            infer()
        stage = "training"
        if device.type == "cuda":
            step()
            sync(device)
            module.zero_grad(set_to_none=True)
            xg.grad = None
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            step()
            sync(device)
            res["peak_MiB"] = (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20
        if time_it:
            record(res, "training", timed(step, device, repeats))
        else:
            step()
    except Exception as exc:                      # noqa: BLE001 - recorded, never a crash
        if is_oom(exc):
            res["oom"] = stage
            if device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            res["error"] = f"{stage}: {type(exc).__name__}: {str(exc)[:300]}"
    module.zero_grad(set_to_none=True)
    return res


#: Checks after which a peer is timed (it ran; a mismatch is reported and timed all the same).
TIMED_CHECKS = ("ref", "ok", "no ref", "MISMATCH")
#: Peers timed together, in interleaved rounds (``timing.interleaved``): the optimised and the
#: unoptimised plan, whose ratio is a target (``targets``: at most 5% slower).
PAIRED = ("hector", "hector unopt")


def measure_paired(peers: List[suites.Peer], rows: Dict[str, dict], x: torch.Tensor,
                   device: torch.device, repeats: int) -> None:
    """Time ``PAIRED`` peers' inference and training in interleaved rounds, into their rows
    (left alone where a row failed: it keeps what ``measure`` found)."""
    pair = [p for p in peers if p.name in PAIRED and p.name in rows
            and rows[p.name].get("check") in TIMED_CHECKS
            and not {"oom", "error"} & set(rows[p.name])]
    if not pair:
        return
    try:
        stages = {p.name: _stages(p, x)[:2] for p in pair}
        for i, stage in enumerate(("inference", "training")):
            stats = interleaved({n: fns[i] for n, fns in stages.items()}, device, repeats)
            for name, st in stats.items():
                record(rows[name], stage, st)
                others = [n for n in stats if n != name]
                if others:
                    rows[name]["timing"] = f"interleaved with {', '.join(others)}"
    except Exception as exc:                      # noqa: BLE001 - recorded, never a crash
        for p in pair:
            rows[p.name]["error"] = f"interleaved timing: {type(exc).__name__}: {str(exc)[:300]}"
    finally:
        for p in pair:
            p.module.zero_grad(set_to_none=True)


def captured(infer, step, module, xg):
    """(replay of ``infer``, replay of ``step``): each recorded once in a CUDA graph after a
    warm-up on a side stream (plans, autotuning, caches); gradients land in the training
    graph's memory and each replay overwrites them."""
    graphs = []
    with warm_graphs(False):     # (this graph records the layer's kernels themselves)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                infer()
                step()
        torch.cuda.current_stream().wait_stream(side)
        for fn in (infer, step):
            module.zero_grad(set_to_none=True)
            xg.grad = None
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            graphs.append(g)
    return graphs[0].replay, graphs[1].replay


def _cleanup(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _tqdm(total: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, desc="hector bench", unit="case", file=sys.stderr,
                disable=not enabled, leave=False)


def _grad_of_x(call, x: torch.Tensor, cot: torch.Tensor) -> torch.Tensor:
    xg = x.detach().clone().requires_grad_()
    (call(xg) * cot).sum().backward()
    return xg.grad


def _check(peer: suites.Peer, x: torch.Tensor, ref_out, ref_grad, cot, device,
           check_grad: bool, rtol: float = RTOL) -> dict:
    """{check, rel_err[, grad_err]}: hector's output (and input gradient, with the same random
    cotangent) against PyG's; an exception is recorded as OOM / ERR."""
    row: dict = {}
    try:
        with torch.no_grad():
            out = peer.call(x)
        sync(device)
        if ref_out is None:
            return dict(check="no ref")
        row["rel_err"] = rel_err(out, ref_out)
        del out
        ok = row["rel_err"] < rtol
        if check_grad and ref_grad is not None:
            row["grad_err"] = rel_err(_grad_of_x(peer.call, x, cot), ref_grad)
            ok = ok and row["grad_err"] < rtol
            peer.module.zero_grad(set_to_none=True)
        row["check"] = "ok" if ok else "MISMATCH"
    except Exception as exc:                     # noqa: BLE001 - recorded, never a crash
        if is_oom(exc):
            row.update(check="OOM", oom="check")
        else:
            row.update(check="ERR", error=f"check: {type(exc).__name__}: {str(exc)[:300]}")
    return row


def _reference(ref, case: suites.Case, W, x, check_grad: bool):
    """PyG eager's output and input gradient (None where it fails) and a note on failure."""
    call = suites.caller(case.layer, ref, W, True)
    out = grad = cot = note = None
    try:
        with torch.no_grad():
            out = call(x)
        if check_grad:
            gen = torch.Generator().manual_seed(1)
            cot = torch.randn(out.shape, generator=gen).to(out.device)
            grad = _grad_of_x(call, x, cot)
            ref.zero_grad(set_to_none=True)
    except Exception as exc:                     # noqa: BLE001
        note = "OOM" if is_oom(exc) else f"{type(exc).__name__}: {str(exc)[:200]}"
    return out, grad, cot, note


def case_id(c: suites.Case) -> str:
    return f"{c.layer}/{c.dataset}/{c.features}x{c.heads}"


def run_bench(cfg: BenchConfig, log=None, on_case=None) -> dict:
    """Run the comparison; returns {'meta': {...}, 'notes': [...], 'rows': [...],
    'targets': [...]} where each row has case, layer, dataset, features, heads, peer,
    inference_ms, training_ms, speedup_inference, speedup_training, peak_MiB, check, rel_err,
    grad_err, floor_fraction, {inference,training}_spread ({min_ms, max_ms, runs, iqr}),
    noisy (the stages whose timing stayed noisy) (and oom / error when they happened).  ``on_case(result)`` is
    called with the result so far after every case (the CLI saves it: a run cut short keeps
    what it measured).  ``log`` is unused (kept for callers that pass it)."""
    cfg = resolve(cfg)
    device = torch.device(cfg.device)
    pyg_version = None if cfg.no_pyg else require("torch_geometric", "PyG").__version__
    threads_before = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    # One switch for every peer: torch's matmuls (PyG, compiled or not) and hector's fp32
    # GEMMs (which follow torch's switch: kernels.segment_mm.spec.fp32_dot).
    try:
        with tf32_matmuls(cfg.tf32):
            return _run_cases(cfg, device, pyg_version, on_case)
    finally:
        torch.set_num_threads(threads_before)


def _run_cases(cfg: BenchConfig, device: torch.device, pyg_version, on_case) -> dict:
    cuda = device.type == "cuda"
    backend = "triton" if cuda else "torch"
    cases, notes = cases_of(cfg)
    if cfg.no_pyg:
        notes.append("--no-pyg: PyG is neither timed nor imported, so hector's outputs are not "
                     "checked against it ('no ref')")
    if not cuda:
        notes.append("device cpu: hector runs its torch backend; times are wall clock "
                     f"(time.perf_counter after 1 warm-up: median [min, max] of at least "
                     f"{max(cfg.repeats, MIN_RUNS)} runs, more until the interquartile range is "
                     f"within {NOISE_IQR:.0%} of the median, at most about {CPU_MAX_S:g} s per "
                     "measurement; 'noisy' when it stayed wider); peak memory is measured on "
                     "CUDA only ('-')")
    if cuda and warm_enabled():
        notes.append("hector: eager calls as a training loop makes them; warm calls replay "
                     "CUDA graphs the layer captured itself (hector.warm_graphs(False) or "
                     "HECTOR_WARM_GRAPHS=0 turns that off)")
    if any(c.layer in suites.RELATIONAL for c in cases):
        notes.append(f"{' and '.join(PAIRED)}: timed together in {ROUNDS} alternating rounds, "
                     "their runs pooled (the ratio of the two is a target)")
    if not cfg.no_pyg and not cfg.compile_pyg:
        notes.append("PyG compile skipped: torch.compile is measured on CUDA only (compiling "
                     "on the CPU takes minutes)" if not cuda else "PyG compile skipped "
                     "(--no-compile)")
    bandwidth = floor.copy_bandwidth(device, floor.COPY_BYTES if cuda else 1 << 26)
    dtype = DTYPES[cfg.dtype]
    rtol = HALF_RTOL.get(cfg.dtype, TF32_RTOL if cfg.tf32 and cuda else RTOL)
    if cfg.tf32:
        notes.append("--tf32: every peer's fp32 matrix products on TF32 tensor cores (torch's "
                     "allow_tf32, which hector's fp32 GEMMs follow); outputs checked at "
                     f"{rtol:g}" + ("" if cuda else "; no effect on the CPU"))
    meta = dict(device=str(device), backend=backend, repeats=cfg.repeats if not cuda else None,
                torch=torch.__version__, torch_geometric=pyg_version,
                rtol=rtol, dtype=cfg.dtype, tf32=cfg.tf32 and cuda, suite=cfg.suite, copy_GBps=bandwidth / 1e9,
                workloads={}, threads=torch.get_num_threads(), cpus=os.cpu_count())
    if cuda:
        meta["gpu"] = torch.cuda.get_device_name(device)
    cases = sorted(cases, key=lambda c: str(c.workload_key))   # one workload alive at a time
    n_peers = {c: (0 if cfg.no_pyg else (1 + 2 * cfg.compile_pyg))
               + (2 if c.layer in suites.RELATIONAL else 1) + bool(cfg.capture) for c in cases}
    rows: List[dict] = []
    W, W_key = None, None
    bar = _tqdm(sum(n_peers.values()), cfg.progress)
    try:
        for case in cases:
            base = dict(case=case_id(case), layer=case.layer, dataset=case.dataset,
                        features=case.features, heads=case.heads)
            try:
                if W_key != case.workload_key:
                    W = None
                    _cleanup(device)
                    W = suites.Workload(case.dataset, device, root=case.root, scale=case.scale,
                                        seed=cfg.seed)
                    W_key = case.workload_key
                meta["workloads"][f"{case.dataset}@{case.scale or 1}"] = W.describe()
                x32 = W.x(case.features)
                compile_here = cfg.compile_pyg and not cfg.no_pyg
                if compile_here and case.layer in suites.RELATIONAL and \
                        W.graph.num_relations > COMPILE_MAX_RELATIONS:
                    compile_here = False
                    bar.update(1)
                    notes.append(f"{base['case']}: PyG compile skipped ({W.graph.num_relations} "
                                 f"relations > {COMPILE_MAX_RELATIONS}: torch.compile unrolls "
                                 "PyG's per-relation loop and takes minutes)")
                if compile_here:
                    # Dynamo caches compiled code per code object (PyG's forward), shared by
                    # every case's module: past its recompile limit it silently runs eager
                    # (seen on the H200: PyG compile timed as eager from the third dataset of
                    # a run on).  Each case compiles from a clean cache.
                    import torch._dynamo as dynamo     # (only when PyG is compiled)
                    dynamo.reset()
                ref, peers = suites.peers(case.layer, W, case.features, case.heads, backend,
                                          with_pyg=not cfg.no_pyg, compile_pyg=compile_here,
                                          capture=bool(cfg.capture))
            except Exception as exc:             # noqa: BLE001
                what = "OOM" if is_oom(exc) else f"{type(exc).__name__}: {str(exc)[:300]}"
                rows.append(dict(base, peer="*", check="OOM" if is_oom(exc) else "ERR",
                                 error=f"setup: {what}"))
                bar.update(n_peers[case])
                _cleanup(device)
                continue
            # The reference is PyG eager in fp32 whatever --dtype is: a half-precision run is
            # checked against the exact result, PyG's own half-precision run included.
            ref_out, ref_grad, cot, ref_note = (_reference(ref, case, W, x32, cfg.check_grad)
                                                if ref is not None else (None,) * 4)
            x = x32.to(dtype)
            for module in [ref] + [p.module for p in peers]:
                if module is not None:          # (in place: compiled peers wrap these)
                    module.to(dtype)
            if ref_note:
                notes.append(f"{base['case']}: PyG reference failed ({ref_note}); hector not "
                             "checked against it")
            elif ref is not None and ref_grad is None and cfg.check_grad:
                notes.append(f"{base['case']}: PyG gradient failed; output checked only")
            fl_ms = floor.floor_ms(case.layer, W.graph.num_nodes, W.graph.num_edges,
                                   case.features, bandwidth, dtype.itemsize)
            paired = set(PAIRED) <= {p.name for p in peers}
            for peer in peers:
                bar.set_postfix_str(f"{base['case']} / {peer.name}")
                row = dict(base, peer=peer.name)
                if peer.note:
                    row["note"] = peer.note
                if peer.kind == "pyg" and dtype == torch.float32:
                    row["check"] = "ref"
                else:
                    row.update(_check(peer, x, ref_out, ref_grad, cot, device, cfg.check_grad,
                                      rtol))
                if row.get("check") in TIMED_CHECKS:
                    row.update(measure(peer, x, device, cfg.repeats,
                                       time_it=not (paired and peer.name in PAIRED)))
                rows.append(row)
                bar.update(1)
                _cleanup(device)
            case_rows = {r["peer"]: r for r in rows if r["case"] == base["case"]}
            if paired:
                measure_paired(peers, case_rows, x, device, cfg.repeats)
            for row in case_rows.values():
                if "error" in row and row.get("check") in ("ok", "ref", "no ref"):
                    row["check"] = row["check"] + " (ERR)"
                if row.get("inference_ms"):
                    row["floor_fraction"] = fl_ms / row["inference_ms"]
            del ref, peers, ref_out, ref_grad, cot
            _cleanup(device)
            if on_case is not None:
                on_case(_result(meta, notes, rows, cfg))
    finally:
        bar.close()
        W = None
        _cleanup(device)
    return _result(meta, notes, rows, cfg)


def _result(meta, notes, rows, cfg) -> dict:
    _speedups(rows)
    result = {"meta": meta, "notes": notes, "rows": rows, "config": asdict(cfg)}
    result["targets"] = targets.evaluate(result)
    return result


def _speedups(rows: List[dict]) -> None:
    """speedup = PyG eager ms / peer ms, per case, for inference and training."""
    base = {r["case"]: r for r in rows if r.get("peer") == "PyG eager"}
    for r in rows:
        b = base.get(r["case"])
        for k in ("inference", "training"):
            ours, theirs = r.get(f"{k}_ms"), (b or {}).get(f"{k}_ms")
            r[f"speedup_{k}"] = theirs / ours if ours and theirs else None


def failed(result: dict) -> bool:
    """True when a hector layer did not match PyG or raised.  A PyG peer that fails (e.g.
    torch.compile's own errors) is reported in the table but is not hector's failure."""
    return any((r.get("check") in ("MISMATCH", "ERR") or "error" in r)
               and not r.get("peer", "").startswith("PyG") for r in result["rows"])
