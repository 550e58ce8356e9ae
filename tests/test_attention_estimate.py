"""scripts/attention_estimate.py: a recorded suite's geomeans with newer captured times."""
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import attention_estimate  # noqa: E402

ROW = ("{layer:12} {data:17} {fh:6} hector captured        {inf:.3f} [0.1, 0.2]        "
       "{train:.3f} [0.1, 0.2]            -              -       0.0     5%  no ref\n")


def _log(path, rounds):
    """A tree_ab log: ``rounds`` is [(tree, {case: (inference, training)})]."""
    lines = []
    for i, (tree, cases) in enumerate(rounds):
        lines.append(f"=== {tree} round {i + 1} rc=0\n")
        for case, (inf, train) in cases.items():
            layer, data, fh = case.split("/")
            lines.append(ROW.format(layer=layer, data=data, fh=fh, inf=inf, train=train))
    path.write_text("".join(lines))
    return str(path)


def test_tree_means_average_one_trees_rounds(tmp_path):
    log = _log(tmp_path / "ab.log", [("old", {"gat/cora/128x1": (0.5, 1.0)}),
                                      ("new", {"gat/cora/128x1": (0.2, 0.4)}),
                                      ("new", {"gat/cora/128x1": (0.4, 0.8)})])
    assert attention_estimate.tree_means(log, "new") == {"gat/cora/128x1": (
        pytest.approx(0.3), pytest.approx(0.6))}
    assert attention_estimate.tree_means(log, "old") == {"gat/cora/128x1": (0.5, 1.0)}


def test_replaced_cases_change_the_geomean_and_the_rest_keep_the_suites(tmp_path, capsys,
                                                                        monkeypatch):
    suite = {"rows": [
        {"case": "gat/cora/128x1", "peer": "hector", "inference_ms": 1.0, "training_ms": 2.0},
        {"case": "gat/cora/128x1", "peer": "hector captured", "inference_ms": 0.5,
         "training_ms": 1.0},
        {"case": "gat/cora/128x1", "peer": "pyg", "inference_ms": 2.0, "training_ms": 4.0},
        {"case": "gat/cora/128x1", "peer": "pyg compile", "inference_ms": 1.5,
         "training_ms": None},
        {"case": "agnn/cora/128x1", "peer": "hector", "inference_ms": 0.5, "training_ms": 1.0},
        {"case": "agnn/cora/128x1", "peer": "pyg", "inference_ms": 4.0, "training_ms": 8.0}]}
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    log = _log(tmp_path / "ab.log", [("new", {"gat/cora/128x1": (0.25, 0.5)})])
    monkeypatch.setattr(sys, "argv", ["attention_estimate.py", "--suite", str(path), log])
    attention_estimate.main()
    out = capsys.readouterr().out
    # gat: best PyG 1.5 / 0.25 = 6x inference, 4 / 0.5 = 8x training; agnn: 8x and 8x
    assert out.startswith("1 cases replaced")
    assert f"inference geomean {math.sqrt(6 * 8):.2f}x over 2 cases" in out
    assert "training 8.00x over 2" in out


def _ceiling_suite(tmp_path):
    """A suite of two cases on a recorded 1000-node graph and a synthetic profile."""
    suite = {"meta": {"copy_GBps": 1000.0, "workloads": {
        "g@1": {"dataset": "g", "nodes": 1000, "edges": 9000}}},
        "rows": [
            {"case": "gat/g/128x1", "peer": "hector captured", "inference_ms": 0.5,
             "training_ms": 1.0},
            {"case": "gat/g/128x1", "peer": "pyg", "inference_ms": 2.0, "training_ms": 4.0},
            {"case": "agnn/g/128x1", "peer": "hector", "inference_ms": 0.1,
             "training_ms": 1.0},
            {"case": "agnn/g/128x1", "peer": "pyg", "inference_ms": 0.3, "training_ms": 2.0}]}
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    return suite, str(path)


def test_floor_parts_count_bytes_flops_and_launches(tmp_path):
    suite, _ = _ceiling_suite(tmp_path)
    w = suite["meta"]["workloads"]
    parts = attention_estimate.floor_parts("gat/g/128x1", w, 1000.0, 1.0, 2.0)
    # bytes: (9000 edges + 1000 self loops) x 128 x 4 + 1000 x 256 x 4 at 1 TB/s
    assert parts["bytes"] == pytest.approx((10000 * 512 + 1000 * 1024) / 1e12 * 1e3)
    assert parts["flops"] == pytest.approx(2 * 1000 * 128 * 128 / 1e12 * 1e3)
    assert parts["launches"] == pytest.approx(0.004)
    # a one-head Transformer: the reordered formulation (one row per edge, three products,
    # no self loops); four heads: a key and a value row, four products
    one = attention_estimate.floor_parts("transformer/g/128x1", w, 1000.0, 1.0, 2.0)
    four = attention_estimate.floor_parts("transformer/g/128x4", w, 1000.0, 1.0, 2.0)
    assert one["bytes"] == pytest.approx((9000 * 512 + 1000 * 1024) / 1e9)
    assert four["bytes"] == pytest.approx((9000 * 1024 + 1000 * 1024) / 1e9)
    assert four["flops"] == pytest.approx(one["flops"] * 4 / 3)
    assert attention_estimate.floor_parts("agnn/g/128x1", w, 1000.0, 1.0, 2.0)["flops"] == 0


def test_graph_size_falls_back_to_a_synthetic_profile():
    from hector.datasets.profiles import PROFILES
    prof = PROFILES["reddit"]
    assert attention_estimate.graph_size("synthetic:reddit", {}) == (
        sum(t.count for t in prof.node_types), sum(r.count for r in prof.relations))
    with pytest.raises(ValueError, match="no size for dataset 'cora'"):
        attention_estimate.graph_size("cora", {})


def test_ceiling_prints_each_cases_cap_and_their_geomean(tmp_path, capsys, monkeypatch):
    suite, path = _ceiling_suite(tmp_path)
    monkeypatch.setattr(sys, "argv", ["attention_estimate.py", "--suite", path, "--ceiling",
                                      "--fp32-tflops", "1", "--kernel-us", "50"])
    attention_estimate.main()
    out = capsys.readouterr().out
    w = suite["meta"]["workloads"]
    floors = {c: max(attention_estimate.floor_parts(c, w, 1000.0, 1.0, 50.0).values())
              for c in ("gat/g/128x1", "agnn/g/128x1")}
    # GAT's flops (0.0328 ms) beat its bytes (0.0062) and launches (0.1): launch-bound at
    # 50 us a kernel; both cases launch-bound, so they hold all the headroom
    assert floors["gat/g/128x1"] == pytest.approx(0.1)
    caps = [2.0 / floors["gat/g/128x1"], 0.3 / floors["agnn/g/128x1"]]
    assert f"at every floor {math.sqrt(caps[0] * caps[1]):.2f}x over 2 cases" in out
    assert f"geomean now {math.sqrt(4 * 3):.2f}x" in out
    assert "launch-bound cases hold 100% of the log headroom" in out
    # sorted by the gap hector / floor: GAT (5x) before AGNN (1x)
    assert out.index("gat/g/128x1") < out.index("agnn/g/128x1")
