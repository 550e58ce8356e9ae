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
