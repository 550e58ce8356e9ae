"""hector bench on tiny CPU inputs: rows, checks, output files, bad options."""
import argparse
import json
import sys
from pathlib import Path

import pytest
import torch

from hector.bench import BenchConfig, configure, resolve, run, run_bench
from hector.bench import report

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import TF32_APIS, set_tf32, tf32_state  # noqa: E402


def tiny(**kw):
    base = dict(layers="rgcn,gat", scale=0.05, features=8, repeats=1, device="cpu",
                progress=False)
    base.update(kw)
    return BenchConfig(**base)


@pytest.fixture(scope="module", autouse=True)
def short_timing():
    """A noisy shared CPU would otherwise time each measurement for its full budget."""
    from hector.bench import timing
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timing, "CPU_MAX_S", 0.5)
        yield


@pytest.fixture(scope="module")
def result():
    return run_bench(tiny())


def test_rows_times_and_checks(result):
    rows = result["rows"]
    peers = {(r["layer"], r["peer"]) for r in rows}
    assert {("rgcn", "PyG eager"), ("rgcn", "hector"), ("rgcn", "hector unopt"),
            ("gat", "PyG eager"), ("gat", "hector")} <= peers
    assert not any(r["peer"] == "PyG compile" for r in rows)      # CPU: compile skipped
    assert any("PyG compile skipped" in n for n in result["notes"])
    for r in rows:
        assert "error" not in r and "oom" not in r, r
        assert isinstance(r["inference_ms"], float) and r["inference_ms"] > 0
        assert isinstance(r["training_ms"], float) and r["training_ms"] > 0
        assert r.get("peak_MiB") is None                           # CPU: no memory figures
        if r["peer"] == "PyG eager":
            assert r["check"] == "ref" and r["speedup_inference"] == pytest.approx(1.0)
        else:
            assert r["check"] == "ok" and r["rel_err"] < 1e-4 and r["grad_err"] < 1e-4
            assert r["speedup_training"] > 0
            assert 0 < r["floor_fraction"] < 1            # the CPU is far from its floor
    text = report.table(result)
    assert "hector unopt" in text and "MISMATCH" not in text


def test_files(tmp_path):
    args = argparse.ArgumentParser()
    configure(args)
    paths = {k: tmp_path / f"out.{k}" for k in ("json", "md", "png")}
    ns = args.parse_args(["--layers", "rgcn,gat", "--scale", "0.05", "--features", "8",
                          "--repeats", "1", "--device", "cpu", "--no-progress",
                          "--json", str(paths["json"]), "--markdown", str(paths["md"]),
                          "--plot", str(paths["png"])])
    assert run(ns) == 0
    data = json.loads(paths["json"].read_text())
    assert {r["layer"] for r in data["rows"]} == {"rgcn", "gat"}
    md = paths["md"].read_text().splitlines()
    assert md[0].startswith("| layer |") and "inference ms" in md[0]
    assert set(md[1].replace("|", "").replace(":", "")) == {"-"}
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_pyg_times_hector_alone_without_importing_pyg(monkeypatch):
    import sys
    for name in [m for m in sys.modules if m == "torch_geometric" or
                 m.startswith("torch_geometric.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch_geometric", None)     # any import now fails
    res = run_bench(tiny(layers="rgcn,gat", no_pyg=True))
    assert [r["peer"] for r in res["rows"]] == ["hector", "hector unopt", "hector"]
    for r in res["rows"]:
        assert r["check"] == "no ref" and r["speedup_inference"] is None
        assert r["inference_ms"] > 0 and r["training_ms"] > 0
    assert res["meta"]["torch_geometric"] is None
    assert any("--no-pyg" in n for n in res["notes"])


@pytest.mark.parametrize("kw, option", [
    (dict(layers="rgcn,nope"), "--layers"),
    (dict(layers=""), "--layers"),
    (dict(dataset="no-such-set"), "--dataset"),
    (dict(dataset="synthetic:nope"), "--dataset"),
    (dict(features=0), "--features"),
    (dict(features=-3), "--features"),
    (dict(heads=0), "--heads"),
    (dict(features=8, heads=3), "--heads"),
    (dict(repeats=0), "--repeats"),
    (dict(scale=0.0), "--scale"),
    (dict(threads=0), "--threads"),
    (dict(device="gpu"), "--device"),
    (dict(dtype="fp64"), "--dtype"),
])
def test_bad_options(kw, option):
    with pytest.raises(ValueError, match=option):
        resolve(tiny(**kw))
    with pytest.raises(ValueError, match=option):     # before anything runs
        run_bench(tiny(**kw))


def test_mismatch_is_reported_and_fails(monkeypatch, tmp_path):
    from hector.bench import runner
    monkeypatch.setattr(runner, "RTOL", -1.0)            # every comparison now fails
    args = argparse.ArgumentParser()
    configure(args)
    ns = args.parse_args(["--layers", "gat", "--scale", "0.05", "--features", "8",
                          "--repeats", "1", "--device", "cpu", "--no-progress"])
    assert run(ns) == 1
    res = run_bench(tiny(layers="gat"))
    assert [r["check"] for r in res["rows"]] == ["ref", "MISMATCH"]
    assert "MISMATCH" in report.table(res) and runner.failed(res)


def test_oom_is_recorded_not_raised():
    import torch
    from hector.bench import runner, suites

    def boom(x):
        raise RuntimeError("CUDA out of memory. Tried to allocate 1 GiB")
    peer = suites.Peer("x", torch.nn.Linear(2, 2), boom, "hector")
    res = runner.measure(peer, torch.randn(3, 2), torch.device("cpu"), 1)
    assert res == {"oom": "inference"}
    assert report.cells(dict(layer="l", dataset="d", peer="x", **res))[
        report.COLUMNS.index("inference ms")] == "OOM"


def test_bf16_runs_every_peer_in_bf16_and_checks_with_its_tolerance():
    """--dtype bf16: features and parameters of every peer in bf16, each checked (PyG's
    bf16 run too) against PyG eager in fp32 at the bf16 tolerance, and the floor counted in
    2-byte elements."""
    from hector.bench.runner import HALF_RTOL
    res = run_bench(tiny(layers="rgcn", dtype="bf16"))
    assert res["meta"]["dtype"] == "bf16" and res["meta"]["rtol"] == HALF_RTOL["bf16"]
    rows = {r["peer"]: r for r in res["rows"]}
    assert rows["hector"]["check"] == "ok" and 0 < rows["hector"]["rel_err"] < 3e-2, rows
    assert rows["PyG eager"]["rel_err"] > 0           # PyG's bf16 run against its fp32 one
    assert "PyG eager in fp32 is the reference" in report.table(res)
    assert "bf16" in report.table(res)
    from hector.bench import floor
    assert floor.floor_ms("rgcn", 10, 40, 8, 1e9, 2) * 2 == floor.floor_ms("rgcn", 10, 40, 8, 1e9)


def test_optimised_and_unoptimised_plans_are_timed_interleaved(result):
    """The relational case's two hector plans are timed in alternating rounds (pooled runs)
    and the worst optimised / unoptimised ratio is a target; a layer without an unoptimised
    peer is timed on its own."""
    from hector.bench import targets, timing
    rows = {(r["layer"], r["peer"]): r for r in result["rows"]}
    opt, plain = rows[("rgcn", "hector")], rows[("rgcn", "hector unopt")]
    assert opt["timing"] == "interleaved with hector unopt"
    assert plain["timing"] == "interleaved with hector"
    for r in (opt, plain):      # every round adds at least MIN_RUNS runs
        assert r["training_spread"]["runs"] >= timing.ROUNDS * timing.MIN_RUNS
    assert "timing" not in rows[("gat", "hector")]
    (t,) = [t for t in targets.evaluate(result) if t["target"].startswith("optimised")]
    worst = max(opt[f"{s}_ms"] / plain[f"{s}_ms"] for s in ("inference", "training"))
    assert t["value"] == pytest.approx(worst) and t["required"] == targets.UNOPT_RATIO


def test_interleaved_alternates_the_order():
    from hector.bench import timing
    import torch
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timing, "_cpu_times", lambda fn, repeats, budget_s=None: [fn() or 1.0] * 3)
        out = timing.interleaved(fns, torch.device("cpu"), 1, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert out["a"]["runs"] == 9 and out["a"]["ms"] == 1.0


@pytest.mark.parametrize("api", TF32_APIS)
def test_tf32_switch_holds_for_the_run_and_is_restored(monkeypatch, api):
    """--tf32 turns torch's TF32 matmul switch on for every peer while the cases run (hector's
    fp32 GEMMs follow it) and puts the caller's setting back after, whichever of torch's
    APIs the caller set it with; without it the run is strict fp32 whatever the caller had
    set."""
    from hector.bench import config_from_args, runner
    from hector.device import tf32_allowed
    seen = []
    monkeypatch.setattr(runner, "_run_cases", lambda cfg, *a: seen.append(tf32_allowed()))
    p = argparse.ArgumentParser()
    configure(p)
    with tf32_state():
        for flag, caller in ((["--tf32"], False), ([], True)):
            set_tf32(api, caller)
            cfg = config_from_args(p.parse_args(["--layers", "gat", "--no-pyg", *flag]))
            runner.run_bench(cfg)
            assert tf32_allowed() == caller
            if api == "matmul_precision":       # (the caller's legacy reads still work)
                assert torch.get_float32_matmul_precision() == ("high" if caller
                                                                else "highest")
        assert seen == [True, False]
