"""``hector train``: option handling, the RESULT line, checkpoint/resume (short runs)."""
import argparse
import io
import re
from pathlib import Path

import pytest
import torch

from hector.train import configure, resolve_config, run, train

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def needs(name):
    return pytest.mark.skipif(not (DATA / name).is_dir(),
                              reason=f"real dataset {name} not found at {DATA / name}")


def parse(*argv):
    p = argparse.ArgumentParser()
    configure(p)
    return p.parse_args(list(argv) + ["--no-progress"])


RESULT = re.compile(r"^RESULT model=(\S+) dataset=(\S+) test_acc=([0-9.]+) .*"
                    r"total_time=([0-9.]+)$")


def result_line(text):
    lines = [l for l in text.splitlines() if l.startswith("RESULT")]
    assert len(lines) == 1, text
    m = RESULT.match(lines[0])
    assert m, lines[0]
    return m, lines[0]


@pytest.mark.parametrize("model, dataset", [
    pytest.param("rgcn", "aifb", marks=needs("aifb")),
    pytest.param("gat", "cora", marks=needs("cora")),
])
def test_short_run_prints_one_result_line(capsys, model, dataset):
    args = parse("--model", model, "--dataset", dataset, "--root", str(DATA / dataset),
                 "--epochs", "3", "--log-every", "1")
    assert run(args) == 0
    out = capsys.readouterr().out
    m, line = result_line(out)
    assert (m.group(1), m.group(2)) == (model, dataset)
    assert 0.0 <= float(m.group(3)) <= 1.0 and float(m.group(4)) > 0
    assert "epochs=3" in line
    assert len(re.findall(r"^epoch\s+\d+\s+loss", out, re.M)) == 3


@needs("cora")
def test_checkpoint_resume_continues_from_saved_epoch(tmp_path):
    ck = tmp_path / "gat.pt"
    base = ["--model", "gat", "--dataset", "cora", "--root", str(DATA / "cora"), "--seed", "1"]
    out = io.StringIO()
    first = train(parse(*base, "--epochs", "2", "--checkpoint", str(ck)), out=out)
    assert first["epochs"] == 2 and ck.is_file()
    saved = torch.load(ck, weights_only=True)
    assert saved["epoch"] == 2 and saved["config"]["model"] == "gat"
    out = io.StringIO()
    second = train(parse(*base, "--epochs", "4", "--resume", str(ck), "--checkpoint", str(ck),
                         "--log-every", "1"), out=out)
    text = out.getvalue()
    assert "resumed from" in text and "at epoch 2" in text
    epochs = [int(e) for e in re.findall(r"^epoch\s+(\d+)", text, re.M)]
    assert epochs == [3, 4]
    assert second["epochs"] == 4 and torch.load(ck, weights_only=True)["epoch"] == 4
    result_line(text)
    # A checkpoint of another model is refused.
    with pytest.raises(ValueError, match="model"):
        train(parse("--model", "agnn", "--dataset", "cora", "--root", str(DATA / "cora"),
                    "--epochs", "3", "--resume", str(ck)), out=io.StringIO())


@pytest.mark.parametrize("argv, option", [
    (["--model", "nope", "--dataset", "cora"], "--model"),
    (["--model", "gat", "--dataset", "nope"], "--dataset"),
    (["--model", "gat", "--dataset", "cora", "--epochs", "0"], "--epochs"),
    (["--model", "gat", "--dataset", "cora", "--epochs", "-3"], "--epochs"),
    (["--model", "gat", "--dataset", "cora", "--lr", "0"], "--lr"),
    (["--model", "gat", "--dataset", "cora", "--dropout", "1.5"], "--dropout"),
    (["--model", "rgcn", "--dataset", "aifb", "--hidden", "0"], "--hidden"),
])
def test_bad_options_raise_value_error_naming_the_option(argv, option):
    with pytest.raises(ValueError, match=re.escape(option)):
        resolve_config(parse(*argv))
    with pytest.raises(ValueError, match=re.escape(option)):
        run(parse(*argv))


def test_defaults_follow_the_papers():
    from hector.train.defaults import defaults
    # RGCN paper, Table 8: AIFB without basis decomposition or L2; MUTAG 30 bases, L2 5e-4;
    # AM 40 bases, 10 hidden units
    r = defaults("rgcn", "aifb")
    assert (r["hidden"], r["num_bases"], r["lr"], r["weight_decay"], r["epochs"]) == \
        (16, None, 0.01, 0.0, 50)
    r = defaults("rgcn", "mutag")
    assert (r["hidden"], r["num_bases"], r["weight_decay"]) == (16, 30, 5e-4)
    r = defaults("rgcn", "synthetic:am")
    assert (r["hidden"], r["num_bases"], r["weight_decay"]) == (10, 40, 5e-4)
    # RGAT on RDF: RGCN's one-hot first layer (chosen on validation, see defaults.py)
    assert defaults("rgat", "aifb")["first_layer"] == "rgcn"
    assert defaults("hgt", "aifb")["first_layer"] == "rgcn"
    assert defaults("gat", "cora")["first_layer"] == "embedding"   # unused with features
    g = defaults("gat", "cora")
    assert (g["hidden"], g["heads"], g["dropout"], g["lr"], g["patience"]) == \
        (8, 8, 0.6, 0.005, 100)


def test_featureless_rgcn_matches_rgcnconv_on_one_hot_input():
    """The first RGCN layer equals RGCNConv(num_nodes, ...) applied to the identity."""
    from hector.nn import RGCNConv
    from hector.train.models import FeaturelessRGCN
    torch.manual_seed(0)
    N, R, H = 12, 3, 4
    ei = torch.randint(0, N, (2, 40))
    et = torch.randint(0, R, (40,))
    ours = FeaturelessRGCN(N, H, R, num_bases=2)
    ref = RGCNConv(N, H, R, num_bases=2, backend="torch")
    with torch.no_grad():
        ref.weight.copy_(ours.weight); ref.comp.copy_(ours.comp)
        ref.root.copy_(ours.root); ref.bias.copy_(ours.bias)
    torch.testing.assert_close(ours(ei, et), ref(torch.eye(N), ei, et), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", ["rgat", "hgt"])
def test_featureless_first_layer_choice(model):
    """first_layer='rgcn' swaps the embedding table + first own layer for FeaturelessRGCN."""
    from types import SimpleNamespace
    from hector.train.defaults import defaults
    from hector.train.models import FeaturelessRGCN, build
    torch.manual_seed(0)
    N, R, E = 10, 3, 30
    data = SimpleNamespace(num_nodes=N, x=None, num_classes=4, num_relations=R)
    ei, et = torch.randint(0, N, (2, E)), torch.randint(0, R, (E,))
    cfg = defaults(model, "aifb")
    emb = build(model, data, {**cfg, "first_layer": "embedding", "hidden": 4, "heads": 2})
    assert emb.embed is not None and not isinstance(emb.conv1, FeaturelessRGCN)
    one_hot = build(model, data, {**cfg, "first_layer": "rgcn", "hidden": 4, "heads": 2})
    assert one_hot.embed is None and isinstance(one_hot.conv1, FeaturelessRGCN)
    for net in (emb, one_hot):
        assert net(None, ei, et).shape == (N, 4)
    with pytest.raises(ValueError, match="first_layer"):
        build(model, data, {**cfg, "first_layer": "nope"})
