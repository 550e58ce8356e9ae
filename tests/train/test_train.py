"""``hector train``: option handling, the RESULT line, checkpoint/resume (short runs)."""
import argparse
import io
import re
import sys
from pathlib import Path

import pytest
import torch

from hector.train import configure, resolve_config, run, train

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers.py
from helpers import SHARED_DATA as DATA  # noqa: E402


def needs(name):
    return pytest.mark.skipif(not (DATA / name).is_dir(),
                              reason=f"real dataset {name} not found at {DATA / name}")


def parse(*argv):
    p = argparse.ArgumentParser()
    configure(p)
    return p.parse_args(list(argv) + ["--no-progress"])


RESULT = re.compile(r"^RESULT model=(\S+) dataset=(\S+) test_acc=([0-9.]+) .*"
                    r"total_time_s=([0-9.]+)$")


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


# -- small synthetic runs (no real data): a 135-node synthetic Cora -------------------------
@pytest.fixture
def tiny_cora(monkeypatch):
    """``hector train --dataset synthetic:cora`` on a 5% scale graph (fast on any CPU)."""
    from hector import datasets
    load = datasets.load
    monkeypatch.setattr(datasets, "load", lambda name, root=None, **kw: load(
        name, root=root, **{**kw, "scale": 0.05}))
    return ["--model", "gat", "--dataset", "synthetic:cora", "--hidden", "2", "--heads", "1"]


EPOCH = re.compile(r"^epoch\s+(\d+)\s.*val_loss ([0-9.]+)\s+val_acc ([0-9.]+)", re.M)
STOP = re.compile(r"^early stop at epoch (\d+): (\d+) epochs in a row \((\d+)-(\d+); --patience "
                  r"(\d+)\) without reaching the best validation accuracy \(([0-9.]+), model of "
                  r"epoch (\d+)\) or lowering the validation loss \(lowest ([0-9.]+)\); testing "
                  r"the model of epoch (\d+)$", re.M)


def test_early_stop_message_agrees_with_the_logged_epochs(tiny_cora):
    out = io.StringIO()
    res = train(parse(*tiny_cora, "--epochs", "200", "--patience", "3", "--lr", "0.05",
                      "--log-every", "1"), out=out)
    text = out.getvalue()
    m = STOP.search(text)
    assert m, text
    stop, count, first, last, patience, best_acc, best_epoch, lowest, tested = (
        float(g) if "." in g else int(g) for g in m.groups())
    log = {int(e): (float(l), float(a)) for e, l, a in EPOCH.findall(text)}
    assert stop == last == max(log) == res["epochs"] and count == patience == 3
    assert first == stop - count + 1 and tested == best_epoch == res["best_epoch"]
    # the numbers in the message are the logged ones
    assert best_acc == max(a for _, a in log.values()) == log[best_epoch][1]
    assert lowest == pytest.approx(min(l for l, _ in log.values()), abs=1e-4)
    # patience's window: no epoch reached the best accuracy or lowered the loss ...
    before = [log[e] for e in log if e < first]
    for e in range(first, last + 1):
        assert log[e][1] < best_acc and log[e][0] >= min(l for l, _ in before) - 1e-4
    # ... and the epoch before it did one of the two
    prev = [log[e] for e in log if e < first - 1]
    l, a = log[first - 1]
    assert a >= best_acc or not prev or l < min(p for p, _ in prev) + 1e-4   # 4 decimals logged


def test_settings_line_and_units_on_times(tiny_cora):
    out = io.StringIO()
    train(parse(*tiny_cora, "--epochs", "2", "--lr", "0.02", "--seed", "3"), out=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("settings ")
    got = dict(kv.split("=", 1) for kv in lines[0].split()[1:])
    assert {k: got[k] for k in ("model", "dataset", "epochs", "lr", "hidden", "heads", "dtype",
                                "device", "patience", "seed")} == dict(
        model="gat", dataset="synthetic:cora", epochs="2", lr="0.02", hidden="2", heads="1",
        dtype="fp32", device="cpu", patience="100", seed="3")
    assert int(got["cpu_threads"]) >= 1
    m, line = result_line(out.getvalue())
    assert re.search(r" train_time_s=[0-9.]+ total_time_s=[0-9.]+$", line)
    assert " train_time=" not in line and " total_time=" not in line


# -- --resume on files that are not (this run's) checkpoints: one line, exit 2, nothing run --
class _Payload:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _bad_checkpoints(tmp_path, good):
    import pickle
    marker = tmp_path / "payload-ran"
    files = {}
    files["malicious pickle"] = tmp_path / "evil.pkl"
    files["malicious pickle"].write_bytes(pickle.dumps({"config": _Payload(marker)}))
    files["malicious zip"] = tmp_path / "evil.pt"
    torch.save({**torch.load(good, weights_only=True), "config": _Payload(marker)},
               files["malicious zip"])
    files["truncated"] = tmp_path / "truncated.pt"
    data = good.read_bytes()
    files["truncated"].write_bytes(data[: len(data) // 2])
    files["empty"] = tmp_path / "empty.pt"
    files["empty"].write_bytes(b"")
    files["no config"] = tmp_path / "noconfig.pt"
    ck = torch.load(good, weights_only=True)
    del ck["config"]
    torch.save(ck, files["no config"])
    files["tensor"] = tmp_path / "tensor.pt"
    torch.save(torch.ones(3), files["tensor"])
    return files, marker


RESUME_ERRORS = {"malicious pickle": r"refused: the file holds pickled objects other than "
                                     r"tensors",
                 "malicious zip": r"refused: the file holds pickled objects other than tensors",
                 "truncated": r"not a readable checkpoint \(truncated",
                 "empty": r"not a readable checkpoint \(truncated",
                 "no config": r"not a hector train checkpoint \(no 'config' entry\)",
                 "tensor": r"not a hector train checkpoint \(no 'config' entry\)"}


def test_resume_bad_files_one_line_each(tiny_cora, tmp_path, capsys):
    from hector.cli import main
    good = tmp_path / "good.pt"
    train(parse(*tiny_cora, "--epochs", "1", "--checkpoint", str(good)), out=io.StringIO())
    files, marker = _bad_checkpoints(tmp_path, good)
    capsys.readouterr()
    for what, path in files.items():
        code = main(["train", *tiny_cora, "--epochs", "2", "--no-progress", "--resume",
                     str(path)])
        out, err = capsys.readouterr()
        assert code == 2, what
        assert len(err.strip().splitlines()) == 1, (what, err)
        assert re.match(rf"hector train: error: --resume {re.escape(str(path))}: "
                        rf"{RESUME_ERRORS[what]}", err), (what, err)
        assert "RESULT" not in out and "epoch" not in out, (what, out)
        assert not marker.exists(), what
    # a checkpoint of a model of another size: named, before any epoch runs
    wider = [("4" if a == "2" else a) for a in tiny_cora]           # --hidden 4, not 2
    code = main(["train", *wider, "--epochs", "2", "--no-progress", "--resume", str(good)])
    out, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "the checkpoint is for hidden=2, not 4" in err and "RESULT" not in out
    # and one whose saved tensors were changed to another size
    ck = torch.load(good, weights_only=True)
    ck["model"] = {k: torch.zeros(v.shape[0] + 1, *v.shape[1:]) if v.dim() else v
                   for k, v in ck["model"].items()}
    torch.save(ck, tmp_path / "resized.pt")
    code = main(["train", *tiny_cora, "--epochs", "2", "--no-progress", "--resume",
                 str(tmp_path / "resized.pt")])
    out, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "the saved model does not fit this run's model" in err and "size mismatch" in err


def test_resume_a_good_checkpoint_still_works(tiny_cora, tmp_path):
    good = tmp_path / "good.pt"
    train(parse(*tiny_cora, "--epochs", "1", "--checkpoint", str(good)), out=io.StringIO())
    out = io.StringIO()
    res = train(parse(*tiny_cora, "--epochs", "2", "--resume", str(good)), out=out)
    assert "resumed from" in out.getvalue() and res["epochs"] == 2

