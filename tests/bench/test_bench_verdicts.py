"""hector bench: timing spread and noisy verdicts, CPU threads, optional dependencies named
in one line, the plot's labels."""
import argparse
import sys

import pytest
import torch

from hector.bench import configure, report, resolve, run_bench, targets, timing
from hector.bench.runner import BenchConfig
from hector.cli import main


class FakeClock:
    """time.perf_counter for timing._cpu_times: each call of ``fn`` takes the next duration."""

    def __init__(self, durations_ms):
        self.now, self.durations = 0.0, list(durations_ms)
        self.calls = 0

    def perf_counter(self):
        return self.now

    def fn(self):
        self.now += self.durations[self.calls % len(self.durations)] / 1e3
        self.calls += 1


def timed_with(monkeypatch, durations, repeats=5, budget=1.0):
    clock = FakeClock(durations)
    monkeypatch.setattr(timing, "time", clock)
    monkeypatch.setattr(timing, "CPU_MAX_S", budget)
    return timing.timed(clock.fn, torch.device("cpu"), repeats), clock


def test_steady_timing_stops_at_repeats_and_reports_spread(monkeypatch):
    s, clock = timed_with(monkeypatch, [10.0, 10.5, 9.5, 10.2, 9.8])
    assert s["runs"] == 5 and clock.calls == 6                  # 1 warm-up + 5 runs
    assert (s["min_ms"], s["ms"], s["max_ms"]) == pytest.approx((9.5, 10.0, 10.5))
    assert not s["noisy"] and s["iqr"] == pytest.approx((10.2 - 9.8) / 10.0)


def test_one_outlier_is_not_noise(monkeypatch):
    # a reported PyG RGCN timing: 25 ms runs with one 1 s run among them
    s, _ = timed_with(monkeypatch, [10.5, 1000.0, 25.0, 25.2, 24.8, 25.1, 24.9, 25.0], budget=5)
    assert not s["noisy"] and s["max_ms"] == 1000.0 and s["ms"] == pytest.approx(25.0, abs=0.3)


def test_wide_spread_repeats_until_the_budget_then_is_noisy(monkeypatch):
    s, _ = timed_with(monkeypatch, [10.0, 30.0, 5.0, 60.0], budget=1.0)
    assert s["runs"] > 5 and s["noisy"]
    assert sum([10.0, 30.0, 5.0, 60.0]) * (s["runs"] // 4) / 1e3 <= 1.0 + 0.06


def test_a_run_slower_than_the_budget_is_timed_once_and_noisy(monkeypatch):
    s, _ = timed_with(monkeypatch, [2000.0], budget=1.0)
    assert s["runs"] == 1 and s["noisy"] and s["iqr"] is None


def case_rows(hector_noisy=(), pyg_noisy=()):
    def row(peer, inf, trn, noisy):
        return dict(case="gat/x/8x1", layer="gat", dataset="x", features=8, heads=1, peer=peer,
                    inference_ms=inf, training_ms=trn, noisy=list(noisy))
    return [row("PyG eager", 100.0, 100.0, pyg_noisy), row("hector", 1.0, 1.0, hector_noisy)]


@pytest.mark.parametrize("hector_noisy, pyg_noisy, expect", [
    ((), (), {"inference": "met", "training": "met"}),
    (("inference",), (), {"inference": "noisy", "training": "met"}),
    ((), ("training",), {"inference": "met", "training": "noisy"}),
])
def test_no_verdict_from_a_noisy_timing(hector_noisy, pyg_noisy, expect):
    res = {"rows": case_rows(hector_noisy, pyg_noisy)}
    got = {t["target"].split()[1]: targets.verdict(t) for t in targets.evaluate(res)
           if "speedup" in t["target"]}
    assert got == expect
    text = targets.table(targets.evaluate(res))
    assert ("noisy " in text) == bool(hector_noisy or pyg_noisy)
    assert "MISSED" not in text


def test_no_pyg_speedup_is_not_missed():
    rows = [r for r in case_rows() if r["peer"] == "hector"]
    ts = [t for t in targets.evaluate({"rows": rows}) if "speedup" in t["target"]]
    assert ts and all(targets.verdict(t) == "n/a" for t in ts)


def test_table_cells_show_median_min_max_and_noisy():
    r = dict(layer="gat", dataset="d", peer="hector", inference_ms=2.0, training_ms=5.0,
             inference_spread=dict(min_ms=1.5, max_ms=9.0, runs=40, iqr=0.3),
             training_spread=dict(min_ms=4.9, max_ms=5.2, runs=5, iqr=0.01), noisy=["inference"])
    cells = report.cells(r)
    assert cells[report.COLUMNS.index("inference ms")] == "2.000 [1.500, 9.000] noisy"
    assert cells[report.COLUMNS.index("training ms")] == "5.000 [4.900, 5.200]"


def test_cpu_threads_default_one_and_restored(monkeypatch):
    monkeypatch.setattr(timing, "CPU_MAX_S", 0.3)
    assert resolve(BenchConfig(device="cpu")).threads == 1
    assert resolve(BenchConfig(device="cpu", threads=2)).threads == 2
    before = torch.get_num_threads()
    res = run_bench(BenchConfig(layers="gat", scale=0.05, features=8, repeats=1, device="cpu",
                                progress=False, threads=1, no_pyg=True))
    assert res["meta"]["threads"] == 1 and torch.get_num_threads() == before
    assert "1 torch CPU thread (--threads" in report.table(res)


def bench_args(*extra):
    return ["bench", "--layers", "gat", "--scale", "0.05", "--features", "8", "--repeats", "1",
            "--device", "cpu", "--no-progress", *extra]


def test_missing_pyg_is_one_line_naming_the_extra(monkeypatch, capsys):
    for name in [m for m in sys.modules if m.startswith("torch_geometric")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch_geometric", None)
    assert main(bench_args()) == 2
    out, err = capsys.readouterr()
    assert err.strip() == ("hector bench: error: PyG: torch_geometric is not installed; "
                           "install the bench extra: pip install 'hector[bench]' (or pass "
                           "--no-pyg to time hector alone)")
    assert "layer" not in out                       # nothing ran


def test_plot_without_matplotlib_is_one_line_before_running(monkeypatch, capsys, tmp_path):
    for name in [m for m in sys.modules if m.startswith("matplotlib")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    import hector.bench.runner as runner
    monkeypatch.setattr(runner, "run_bench", lambda *a, **k: pytest.fail("ran the bench"))
    assert main(bench_args("--no-pyg", "--plot", str(tmp_path / "p.png"))) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("hector bench: error: --plot: matplotlib is not installed; install "
                           "the bench extra: pip install 'hector[bench]'")
    assert not (tmp_path / "p.png").exists()


def test_plot_names_synthetic_graphs_and_labels_values(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [dict(case="c", layer="gat", dataset="synthetic:cora", features=8, heads=1,
                 peer="PyG eager", speedup_inference=1.0, speedup_training=1.0),
            dict(case="c", layer="gat", dataset="synthetic:cora", features=8, heads=1,
                 peer="hector", speedup_inference=2.5, speedup_training=1.25)]
    res = {"rows": rows, "meta": {"device": "cpu"}}
    labels, inf, trn = report.plot_bars(res)
    assert labels == ["gat 8x1\nsynthetic:cora\nhector"] and (inf, trn) == ([2.5], [1.25])
    drawn = report.write_plot(res, tmp_path / "p.png")
    assert drawn == ["2.50x", "1.25x"]
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("device, judged", [("cuda:0", True), ("cpu", False), (None, True)])
def test_gpu_targets_are_not_judged_on_a_cpu_run(device, judged):
    """The targets are set for one H200: a CPU run (torch backend) gets no met / MISSED on
    them, but a hector failure is still judged.  Hand-built rows (no device) are judged."""
    rows = case_rows()
    rows[1].update(inference_ms=1000.0, training_ms=1000.0, error="boom")   # slower, failed
    res = {"rows": rows} if device is None else {"rows": rows, "meta": {"device": device}}
    got = {t["target"]: targets.verdict(t) for t in targets.evaluate(res)}
    speed = {v for k, v in got.items() if "speedup" in k}
    assert speed == ({"MISSED"} if judged else {"not judged on CPU"})
    assert got["attention: no hector OOM"] == "MISSED"
    text = targets.table(targets.evaluate(res))
    assert ("not judged on CPU" in text) != judged
    # the verdict column stays aligned whatever its longest entry
    assert len({line.index("attention") for line in text.splitlines()}) == 1


def test_cpu_bench_prints_no_verdict_on_gpu_targets(capsys):
    assert main(bench_args()) == 0
    out = capsys.readouterr().out
    listed = out[out.index("targets ("):].splitlines()[1:]
    speedups = [line for line in listed if "speedup" in line]
    assert speedups and all(line.startswith("not judged on CPU") for line in speedups), out
    assert "MISSED" not in out and "on the CPU only 'no hector OOM' is judged" in out
