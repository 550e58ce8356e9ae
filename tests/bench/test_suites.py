"""Paper suites, targets, memory floor, gradient check and merging of hector bench."""
import json

import pytest
import torch

from hector.bench import BenchConfig, paper, resolve, run_bench, targets
from hector.bench import floor, runner, suites


def test_hetero_suite_is_the_papers_setting():
    cases, notes = paper.suite("hetero")
    assert not notes
    assert {c.dataset for c in cases} == {f"synthetic:{p}" for p in paper.HETERO_PROFILES}
    assert len(paper.HETERO_PROFILES) == 8
    for prof in paper.HETERO_PROFILES:
        mine = {(c.layer, c.features, c.heads) for c in cases if c.dataset.endswith(prof)}
        assert mine == {("rgcn", 64, 1), ("rgat", 64, 1), ("hgt", 64, 1), ("rgat", 128, 8)}


def test_attention_suite_takes_real_graphs_present(tmp_path):
    (tmp_path / "cora").mkdir()
    cases, notes = paper.suite("attention", str(tmp_path))
    names = {c.dataset for c in cases}
    assert "cora" in names and "amazon-computers" not in names
    assert any("amazon-computers" in n for n in notes) and any("github-musae" in n for n in notes)
    assert {c.root for c in cases if c.dataset == "cora"} == {str(tmp_path / "cora")}
    per = {(c.layer, c.features, c.heads) for c in cases if c.dataset == "synthetic:reddit"}
    assert per == {("gat", 128, 1), ("gat", 64, 4), ("transformer", 128, 1),
                   ("transformer", 64, 4), ("agnn", 128, 1)}


def test_suite_filters_and_bad_options(tmp_path):
    cfg = resolve(BenchConfig(suite="hetero", layers="rgat", datasets="mag,aifb", device="cpu"))
    cases, _ = runner.cases_of(cfg)
    assert {(c.dataset, c.features) for c in cases} == {
        ("synthetic:mag", 64), ("synthetic:mag", 128), ("synthetic:aifb", 64),
        ("synthetic:aifb", 128)}
    for kw, opt in [(dict(suite="nope"), "--suite"),
                    (dict(suite="hetero", datasets="nope"), "--datasets"),
                    (dict(suite="hetero", dataset="cora"), "--dataset"),
                    (dict(suite="hetero", features=8), "--features"),
                    (dict(suite="hetero", heads=2), "--heads"),
                    (dict(datasets="mag"), "--datasets"),
                    (dict(data_root=str(tmp_path)), "--data-root"),
                    (dict(suite="attention", data_root=str(tmp_path / "absent")), "--data-root")]:
        with pytest.raises(ValueError, match=opt):
            resolve(BenchConfig(device="cpu", **kw))


def test_floor_bytes_and_bandwidth():
    # GAT: one projected row per edge plus a node row read and one written, fp32
    assert floor.floor_bytes("gat", nodes=10, edges=100, features=8) == 4 * (100 * 8 + 10 * 16)
    assert floor.floor_bytes("hgt", nodes=10, edges=100, features=8) == 4 * (200 * 8 + 10 * 16)
    # a formulation gathering other than the layer's rows (a reordered Transformer head)
    assert floor.floor_bytes("transformer", 10, 100, 8, rows=1) == 4 * (100 * 8 + 10 * 16)
    with pytest.raises(ValueError, match="layer"):
        floor.floor_bytes("gcn", 1, 1, 1)
    bw = floor.copy_bandwidth(torch.device("cpu"), 1 << 22)
    assert 1e8 < bw < 1e13


def _row(case, peer, inf, trn, peak=None, **kw):
    layer, dataset = case.split("/")[:2]
    return dict(case=case, layer=layer, dataset=dataset, peer=peer, inference_ms=inf,
                training_ms=trn, peak_MiB=peak, **kw)


def test_targets_use_the_better_pyg_peer():
    rows = [_row("gat/synthetic:reddit/64x1", "PyG eager", 100.0, 400.0, 1000.0),
            _row("gat/synthetic:reddit/64x1", "PyG compile", 50.0, 600.0, 800.0),
            _row("gat/synthetic:reddit/64x1", "hector", 5.0, 100.0, 100.0, floor_fraction=0.8),
            _row("gat/cora/64x1", "PyG eager", 1.0, 2.0, 10.0),
            _row("gat/cora/64x1", "hector", 0.5, 1.0, 5.0),
            dict(_row("rgat/synthetic:mag/64x1", "PyG eager", None, None), oom="inference"),
            _row("rgat/synthetic:mag/64x1", "hector", 9.0, 30.0, 50.0, floor_fraction=0.5)]
    got = {t["target"]: t for t in targets.evaluate({"rows": rows})}
    inf = got["attention inference speedup (geomean)"]
    assert inf["value"] == pytest.approx((10.0 * 2.0) ** 0.5) and not inf["met"]
    trn = got["attention training speedup (geomean)"]
    assert trn["value"] == pytest.approx((4.0 * 2.0) ** 0.5) and not trn["met"]
    assert got["relational inference speedup (geomean)"]["value"] is None   # PyG OOM only
    assert got["relational: no hector OOM"]["met"]
    mem = got["peak memory / PyG's (worst case)"]
    assert mem["value"] == pytest.approx(0.5) and not mem["met"]            # cora: 5 / 10
    fl = got["forward at fraction of memory floor (largest profiles, worst)"]
    assert fl["value"] == pytest.approx(0.5) and not fl["met"]
    assert "MISSED" in targets.table(list(got.values()))


def test_targets_take_each_side_at_its_best_but_not_replayed_peaks():
    case = "rgat/synthetic:aifb/64x1"
    rows = [_row(case, "PyG eager", 4.0, 20.0, 100.0),
            _row(case, "PyG compile", 3.0, 16.0, 90.0),
            _row(case, "PyG compile RO", 2.0, 18.0, 1.0),      # its peak is the replay's
            _row(case, "hector", 1.0, 8.0, 30.0),
            _row(case, "hector captured", 0.5, 1.0, 0.0, noisy=["training"])]
    (c,) = targets.per_case(rows)
    assert c["pyg_inference"] == 2.0 and c["pyg_training"] == 16.0 and c["pyg_peak"] == 90.0
    h = c["hector"]
    assert (h["inference_ms"], h["training_ms"], h["peak_MiB"]) == (0.5, 1.0, 30.0)
    assert h["inference_peer"] == h["training_peer"] == "hector captured"
    assert c["noisy_training"] and not c["noisy_inference"]
    got = {t["target"]: t for t in targets.evaluate({"rows": rows})}
    assert got["relational inference speedup (geomean)"]["value"] == pytest.approx(4.0)
    assert got["relational training speedup (geomean)"]["met"] is None      # noisy: no verdict
    assert got["peak memory / PyG's (worst case)"]["value"] == pytest.approx(30.0 / 90.0)


def test_gradient_check_catches_a_wrong_backward():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    ok_peer = suites.Peer("h", lin, lambda v: lin(v), "hector")
    bad = suites.Peer("h", lin, lambda v: lin(v.detach() + 2 * (v - v.detach())), "hector")
    ref_out = lin(x).detach()
    cot = torch.randn(5, 3)
    ref_grad = runner._grad_of_x(lambda v: lin(v), x, cot)
    dev = torch.device("cpu")
    good = runner._check(ok_peer, x, ref_out, ref_grad, cot, dev, True)
    assert good["check"] == "ok" and good["grad_err"] < 1e-6
    wrong = runner._check(bad, x, ref_out, ref_grad, cot, dev, True)
    assert wrong["rel_err"] < 1e-6 and wrong["check"] == "MISMATCH"
    assert runner._check(bad, x, ref_out, ref_grad, cot, dev, False)["check"] == "ok"


def test_suite_case_runs_and_merges(tmp_path):
    import importlib.util
    from pathlib import Path
    res = run_bench(BenchConfig(suite="hetero", layers="rgcn", datasets="aifb", device="cpu",
                                repeats=1, progress=False))
    rows = res["rows"]
    assert {r["peer"] for r in rows} == {"PyG eager", "hector", "hector unopt"}
    assert all(r["case"] == "rgcn/synthetic:aifb/64x1" for r in rows)
    assert all(r["check"] in ("ref", "ok") for r in rows), rows
    assert any(t["target"].startswith("relational inference") for t in res["targets"])
    # two chunks merge into one result with targets over both
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(res))
    other = dict(res, rows=[dict(r, case=r["case"].replace("64x1", "32x1")) for r in rows])
    b.write_text(json.dumps(other))
    spec = importlib.util.spec_from_file_location(
        "bench_merge", Path(__file__).parents[2] / "scripts" / "bench_merge.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    merged = mod.merge([str(a), str(b), str(a)])        # the repeated file adds nothing
    assert len(merged["rows"]) == 2 * len(rows)
    assert "targets" in merged and merged["targets"]


def test_failed_counts_hector_not_pyg():
    pyg_err = dict(peer="PyG compile", check="ERR", error="check: InductorError")
    assert not runner.failed({"rows": [pyg_err, dict(peer="hector", check="ok")]})
    assert runner.failed({"rows": [dict(peer="hector", check="MISMATCH")]})
    assert runner.failed({"rows": [dict(peer="hector unopt", check="ok (ERR)", error="x")]})
