"""The ``hector`` command line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hector.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/helpers.py
from helpers import SHARED_DATA as DATA  # noqa: E402

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"real datasets not found at {DATA}")


def run_info(capsys, *args):
    code = main(["info", *args, "--json"])
    assert code == 0
    return json.loads(capsys.readouterr().out)


@needs_data
def test_info_aifb_matches_published_counts(capsys):
    s = run_info(capsys, "aifb", "--root", str(DATA / "aifb"))
    assert (s["num_nodes"], s["num_edges"], s["num_relations"]) == (8285, 58086, 90)
    assert s["num_classes"] == 4 and s["split"]["train"] == 140 and s["split"]["test"] == 36


@needs_data
@pytest.mark.parametrize("name, nodes, edges, extra", [
    ("cora", 2708, 10556, {"num_features": 1433, "num_classes": 7}),
    ("fb15k-237", 14541, 272115, {"num_relations": 237}),
    ("amazon-computers", 13752, 287209, {"num_features": 767, "num_classes": 10}),
    ("github-musae", 37700, 578006, {"num_classes": 2}),
])
def test_info_real_datasets(capsys, name, nodes, edges, extra):
    s = run_info(capsys, name, "--root", str(DATA / name))
    assert (s["num_nodes"], s["num_edges"]) == (nodes, edges)
    for k, v in extra.items():
        assert s[k] == v


@needs_data
def test_info_github_super_nodes(capsys):
    s = run_info(capsys, "github-musae", "--root", str(DATA / "github-musae"))
    assert s["in_degree"]["max"] == 9458
    assert s["in_degree"]["num_super"] == 21


@needs_data
def test_info_text_output(capsys):
    assert main(["info", "cora", "--root", str(DATA / "cora")]) == 0
    out = capsys.readouterr().out
    assert "nodes          2,708" in out and "edges          10,556" in out
    assert "max 168" in out


def test_info_synthetic(capsys):
    s = run_info(capsys, "synthetic:mag", "--scale", "0.001")
    assert s["num_node_types"] == 4 and s["num_relations"] == 4
    assert set(s["nodes_per_type"]) == {"paper", "author", "institution", "field_of_study"}
    assert s["num_nodes"] == sum(s["nodes_per_type"].values())


def test_info_unknown_dataset(capsys):
    assert main(["info", "no-such-graph"]) == 2
    err = capsys.readouterr().err
    assert "no-such-graph" in err and "aifb" in err


def test_info_missing_root(tmp_path, capsys):
    assert main(["info", "cora", "--root", str(tmp_path)]) == 2
    assert "ind.cora" in capsys.readouterr().err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "hector.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "info" in out.stdout
    out = subprocess.run([sys.executable, "-m", "hector.cli"], capture_output=True, text=True)
    assert out.returncode == 2


@pytest.mark.parametrize("device", ["gpu", "cuda", "cuda:0", "tpu", "nonsense"])
def test_device_errors_are_one_line(device, capsys, monkeypatch):
    """train and info: a bad or absent device is one error line (exit 2), not a traceback."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (["train", "--model", "gat", "--dataset", "synthetic:cora", "--device", device],
                 ["info", "synthetic:cora", "--scale", "0.01", "--device", device]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert "--device" in err and (
            "CUDA is not available" in err if device.startswith("cuda")
            else "must be cpu or cuda[:N]" in err), err
    if device == "gpu":
        assert "'gpu' is spelled cuda" in err


@pytest.mark.parametrize("argv", [
    ["info", "cora"],
    ["train", "--model", "gat", "--dataset", "cora"],
    ["explain", "rgat", "--dataset", "aifb"],
])
def test_no_network_without_root_is_one_line(argv, tmp_path, monkeypatch, capsys):
    """Without --root and without network: one short line that names the URL
    and --root, and a non-zero exit; no traceback."""
    import urllib.error
    import urllib.request

    def offline(url, *a, **k):
        raise urllib.error.URLError("[Errno -2] Name or service not known")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setenv("HECTOR_DATA", str(tmp_path))      # an empty cache: a download is due
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert len(err.splitlines()) == 1 and len(err) < 500, err
    assert "download failed" in err and "https://" in err and "--root" in err
    assert "Name or service not known" in err


@pytest.mark.parametrize("model,name", [("gat", "gat (options"), ("agnn", "agnn (options"),
                                        ("transformer", "transformer (options")])
def test_explain_attention_models(model, name, capsys):
    """``hector explain`` covers the attention layers through their compiled programs (their
    passes and plans), each with the attention's schedule and why."""
    rc = main(["explain", model, "--dataset", "synthetic:cora", "--in-dim", "16",
                   "--out-dim", "8", "--heads", "2", "--no-launches"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"== hector.explain: {name}" in out
    assert "hector.kernels.attention.op.edge_attention" in out
    assert "-- pass fuse" in out and "== backward plan" in out
    assert "forward + destination-side backward: Schedule(strategy=" in out and "reason='" in out
    assert ("self loops replaced by one per node" in out) == (model != "transformer")
