"""Run ``hector bench``: check each hector layer against PyG, then time inference and training
of every peer and record peak memory (CUDA)."""
from __future__ import annotations

import gc
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import torch

from . import suites

CPU_BUDGET_S = 3.0                 # CPU: timed runs per measurement stop near this
RTOL = 1e-4                        # relative max-abs error allowed against PyG (fp32)


@dataclass
class BenchConfig:
    layers: List[str] = field(default_factory=lambda: list(suites.DEFAULT_LAYERS))
    dataset: Optional[str] = None      # None: synthetic:aifb (relational), synthetic:cora (attention)
    root: Optional[str] = None
    scale: Optional[float] = None      # None: profile size (CPU: 0.2 for the default relational one)
    features: Optional[int] = None    # None: 64 on CUDA, 32 on the CPU
    heads: int = 1
    device: Optional[str] = None       # None: cuda if available, else cpu
    repeats: int = 5                   # CPU timing: median of this many runs after one warm-up
    no_pyg: bool = False
    seed: int = 0
    progress: bool = True


def resolve(cfg: BenchConfig) -> BenchConfig:
    """Validate every option (ValueError naming the option) and fill in the defaults."""
    layers = suites.parse_layers(cfg.layers)
    if cfg.dataset is not None:
        suites.check_dataset(cfg.dataset)
    dev = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(dev)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"--device: {dev!r} is not a device ({err})") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {dev!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available on this machine (use --device cpu)")
    cuda = device.type == "cuda"
    features = cfg.features if cfg.features is not None else (64 if cuda else 32)
    if not isinstance(features, int) or isinstance(features, bool) or features <= 0:
        raise ValueError(f"--features must be a positive integer, got {features!r}")
    if not isinstance(cfg.heads, int) or isinstance(cfg.heads, bool) or cfg.heads <= 0:
        raise ValueError(f"--heads must be a positive integer, got {cfg.heads!r}")
    if cfg.heads > 1 and features % cfg.heads:
        raise ValueError(f"--features ({features}) must be divisible by --heads ({cfg.heads})")
    if cfg.scale is not None and not (cfg.scale > 0):
        raise ValueError(f"--scale must be > 0, got {cfg.scale!r}")
    if not isinstance(cfg.repeats, int) or cfg.repeats <= 0:
        raise ValueError(f"--repeats must be a positive integer, got {cfg.repeats!r}")
    if cfg.root is not None and cfg.dataset is None:
        raise ValueError("--root needs --dataset (the default datasets are synthetic)")
    return BenchConfig(layers=layers, dataset=cfg.dataset, root=cfg.root, scale=cfg.scale,
                       features=features, heads=cfg.heads, device=str(device),
                       repeats=cfg.repeats, no_pyg=cfg.no_pyg, seed=cfg.seed,
                       progress=cfg.progress)


# -- measuring ----------------------------------------------------------------------------
def is_oom(exc: BaseException) -> bool:
    oom_cls = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_cls is not None and isinstance(exc, oom_cls)) or \
        (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median milliseconds of ``fn``: CUDA events through triton.testing.do_bench on CUDA,
    time.perf_counter over ``repeats`` runs after one warm-up on the CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    t0 = time.perf_counter()
    fn()
    warm = time.perf_counter() - t0
    # a slow case (or a CPU shared with other work) must not blow up the run: at most
    # about CPU_BUDGET_S seconds of timed runs per measurement, and at least one
    repeats = max(1, min(repeats, int(CPU_BUDGET_S / max(warm, 1e-9))))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.shape != ref.shape:
        return float("inf")
    d = (out.detach().float() - ref.detach().float()).abs().max()
    return float(d / ref.detach().float().abs().max().clamp_min(1e-12))


def measure(peer: suites.Peer, x: torch.Tensor, device: torch.device, repeats: int) -> dict:
    """{inference_ms, training_ms, peak_MiB}; an OOM leaves {'oom': stage}, other exceptions
    {'error': text}, keeping what was measured before."""
    res: dict = {}
    stage = "inference"
    module, call = peer.module, peer.call
    xg = x.detach().clone().requires_grad_()

    def infer():
        with torch.no_grad():
            call(x)

    def step():
        module.zero_grad(set_to_none=True)
        xg.grad = None
        call(xg).sum().backward()

    try:
        res["inference_ms"] = timed(infer, device, repeats)
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
        res["training_ms"] = timed(step, device, repeats)
    except Exception as exc:                      # noqa: BLE001 - recorded, never a crash
        if is_oom(exc):
            res["oom"] = stage
            if device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            res["error"] = f"{stage}: {type(exc).__name__}: {str(exc)[:300]}"
    module.zero_grad(set_to_none=True)
    return res


def _cleanup(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _tqdm(total: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, desc="hector bench", unit="case", file=sys.stderr,
                disable=not enabled, leave=False)


def run_bench(cfg: BenchConfig, log=None) -> dict:
    """Run the comparison; returns {'meta': {...}, 'notes': [...], 'rows': [...]} where each
    row has layer, dataset, peer, inference_ms, training_ms, speedup_inference,
    speedup_training, peak_MiB, check, rel_err (and oom / error when they happened)."""
    cfg = resolve(cfg)
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    device = torch.device(cfg.device)
    cuda = device.type == "cuda"
    backend = "triton" if cuda else "torch"
    import torch_geometric
    notes = []
    if not cuda:
        notes.append("device cpu: hector runs its torch backend; times are wall clock "
                     f"(time.perf_counter, median of up to {cfg.repeats} runs after 1 warm-up, fewer "
                     f"when a run is slow: about {CPU_BUDGET_S:g} s per measurement); peak "
                     "memory is measured on CUDA only ('-')")
        if not cfg.no_pyg:
            notes.append("PyG compile skipped: torch.compile is measured on CUDA only (compiling "
                         "on the CPU takes minutes)")
    meta = dict(device=str(device), backend=backend, features=cfg.features, heads=cfg.heads,
                repeats=cfg.repeats if not cuda else None, torch=torch.__version__,
                torch_geometric=torch_geometric.__version__, rtol=RTOL, workloads={})
    if cuda:
        meta["gpu"] = torch.cuda.get_device_name(device)
    for n in notes:
        log(f"note: {n}")

    # which dataset (and scale) each layer runs on
    plan = []
    for layer in cfg.layers:
        name = cfg.dataset or suites.default_dataset(layer)
        scale = cfg.scale
        if scale is None and cfg.dataset is None and not cuda and layer in suites.RELATIONAL:
            scale = suites.CPU_DEFAULT_RELATIONAL_SCALE
        plan.append((layer, name, scale))
    n_peers = {l: (0 if cfg.no_pyg else (2 if cuda else 1)) + (2 if l in suites.RELATIONAL else 1)
               for l in cfg.layers}
    rows: List[dict] = []
    workloads: Dict[tuple, suites.Workload] = {}
    bar = _tqdm(sum(n_peers.values()), cfg.progress)
    try:
        for layer, name, scale in plan:
            key = (name, scale)
            base = dict(layer=layer, dataset=name)
            try:
                if key not in workloads:
                    workloads[key] = suites.Workload(name, device, cfg.features, root=cfg.root,
                                                     scale=scale, seed=cfg.seed)
                W = workloads[key]
                meta["workloads"][f"{name}@{scale or 1}"] = W.describe()
                ref, peers = suites.peers(layer, W, cfg.features, cfg.heads, backend,
                                          with_pyg=not cfg.no_pyg, compile_pyg=cuda)
            except Exception as exc:             # noqa: BLE001
                what = "OOM" if is_oom(exc) else f"{type(exc).__name__}: {str(exc)[:300]}"
                rows.append(dict(base, peer="*", check="OOM" if is_oom(exc) else "ERR",
                                 error=f"setup: {what}"))
                bar.update(n_peers[layer])
                _cleanup(device)
                continue
            # the reference output (PyG eager) every hector peer is checked against
            ref_out, ref_note = None, None
            try:
                with torch.no_grad():
                    ref_out = suites.caller(layer, ref, W, True)(W.x)
            except Exception as exc:             # noqa: BLE001
                ref_note = "OOM" if is_oom(exc) else f"{type(exc).__name__}: {exc}"
            for peer in peers:
                bar.set_postfix_str(f"{layer} / {peer.name}")
                row = dict(base, peer=peer.name)
                if peer.note:
                    row["note"] = peer.note
                check_failed = False
                if peer.kind == "pyg":
                    row["check"] = "ref"
                else:
                    try:
                        with torch.no_grad():
                            out = peer.call(W.x)
                        sync(device)
                        if ref_out is None:
                            row["check"] = "no ref"
                        else:
                            err = rel_err(out, ref_out)
                            row["rel_err"] = err
                            ok = err < RTOL
                            row["check"] = "ok" if ok else "MISMATCH"
                            check_failed = not ok
                        del out
                    except Exception as exc:     # noqa: BLE001
                        if is_oom(exc):
                            row.update(check="OOM", oom="check")
                        else:
                            row.update(check="ERR", error=f"check: {type(exc).__name__}: "
                                                          f"{str(exc)[:300]}")
                        check_failed = True
                if not check_failed or row.get("check") == "MISMATCH":
                    row.update(measure(peer, W.x, device, cfg.repeats))
                if "error" in row and row.get("check") in ("ok", "ref", "no ref"):
                    row["check"] = row["check"] + " (ERR)"
                rows.append(row)
                bar.update(1)
                _cleanup(device)
            if ref_note:
                notes.append(f"{layer}: PyG reference failed ({ref_note}); hector not checked")
            del ref, peers, ref_out
            _cleanup(device)
    finally:
        bar.close()
    _speedups(rows)
    return {"meta": meta, "notes": notes, "rows": rows, "config": asdict(cfg)}


def _speedups(rows: List[dict]) -> None:
    """speedup = PyG eager ms / peer ms, per layer, for inference and training."""
    base = {r["layer"]: r for r in rows if r.get("peer") == "PyG eager"}
    for r in rows:
        b = base.get(r["layer"])
        for k in ("inference", "training"):
            ours, theirs = r.get(f"{k}_ms"), (b or {}).get(f"{k}_ms")
            r[f"speedup_{k}"] = theirs / ours if ours and theirs else None


def failed(result: dict) -> bool:
    """True when a hector layer's output did not match PyG or something raised."""
    return any(r.get("check") in ("MISMATCH", "ERR") or "error" in r for r in result["rows"])
