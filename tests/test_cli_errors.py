"""The command line's exit status (2: a usage error, 1: a failure while running, each one
``error:`` line) and its warning for a homogeneous model on a heterogeneous graph."""
import sys
import warnings
from types import SimpleNamespace

import pytest

import hector.bench
from hector import datasets
from hector.cli import main
from hector.train import IgnoredRelationsWarning
from hector.train.loop import warn_if_relations_ignored

TRAIN = ["train", "--model", "gat", "--dataset", "synthetic:cora", "--epochs", "1",
         "--hidden", "4", "--heads", "1", "--no-progress"]


def one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hector "), err
    assert ": error: " in lines[0]
    return lines[0]


def test_homogeneous_model_on_a_heterogeneous_graph_warns_in_one_line(capsys):
    argv = ["train", "--model", "gat", "--dataset", "synthetic:aifb", "--epochs", "1",
            "--hidden", "4", "--heads", "1", "--no-progress"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "RESULT" in out
    (line,) = [l for l in err.splitlines() if "warning" in l]
    assert line == ("hector train: warning: --model gat is a homogeneous layer: it ignores the "
                    "104 relations and 7 node types of synthetic:aifb and treats every edge "
                    "alike (rgcn, rgat and hgt use them)")


@pytest.mark.parametrize("model, name, warns", [
    ("gat", "synthetic:mag", True), ("agnn", "synthetic:fb15k", True),
    ("transformer", "synthetic:mag", True), ("gat", "synthetic:cora", False),
    ("rgat", "synthetic:aifb", False), ("hgt", "synthetic:mag", False)])
def test_which_runs_warn(model, name, warns):
    data = SimpleNamespace(**{k: getattr(datasets.load(name, scale=0.001), k)
                              for k in ("name", "num_relations", "node_type_names")})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warn_if_relations_ignored(model, data)
    assert [w.category for w in seen] == ([IgnoredRelationsWarning] if warns else [])
    if warns:
        assert f"--model {model}" in str(seen[0].message) and "relations" in str(seen[0].message)


def test_usage_errors_exit_2():
    with pytest.raises(SystemExit) as e:       # argparse's own: a required option missing
        main(["train", "--model", "gat"])
    assert e.value.code == 2
    assert main([]) == 2
    assert main(["train", "--model", "nope", "--dataset", "cora"]) == 2


def test_unwritable_checkpoint_is_a_usage_error_before_any_work(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    assert main(TRAIN + ["--checkpoint", str(tmp_path / "a-file" / "ck.pt")]) == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [f"hector train: error: --checkpoint "
                                        f"{tmp_path / 'a-file' / 'ck.pt'}: "
                                        f"{tmp_path / 'a-file'} is not a folder"]
    assert "settings" not in out                  # refused before the run started


def test_resume_from_a_file_that_is_no_checkpoint_exits_2(tmp_path, capsys):
    for text in ("hello world\n", "a:b:c\n" * 20):       # (KeyError, IndexError when unpickled)
        bad = tmp_path / "notes.txt"
        bad.write_text(text)
        assert main(TRAIN + ["--resume", str(bad)]) == 2
        assert "not a readable checkpoint" in one_error_line(capsys)


@pytest.mark.parametrize("option", ["--json", "--markdown", "--plot"])
def test_bench_output_path_checked_before_running(option, tmp_path, monkeypatch, capsys):
    import hector.bench.runner as runner
    monkeypatch.setattr(runner, "run_bench", lambda *a, **k: pytest.fail("ran the bench"))
    monkeypatch.setattr(hector.bench, "run_bench", lambda *a, **k: pytest.fail("ran the bench"))
    pytest.importorskip("matplotlib")
    target = tmp_path / "no-such-folder" / "out"
    assert main(["bench", "--layers", "gat", "--device", "cpu", "--no-pyg", option,
                 str(target)]) == 2
    line = one_error_line(capsys)
    assert option in line and "does not exist" in line


def test_failures_while_running_exit_1_in_one_line(monkeypatch, capsys):
    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(datasets, "load", disk_full)
    assert main(["info", "synthetic:cora"]) == 1
    assert "No space left on device" in one_error_line(capsys)


def test_a_bug_keeps_its_traceback(monkeypatch):
    """An unexpected error is not turned into a line: its traceback is the bug report (the
    process then exits 1, as Python does)."""
    def bug(*a, **k):
        raise RuntimeError("an internal error")
    monkeypatch.setattr(datasets, "load", bug)
    with pytest.raises(RuntimeError, match="an internal error"):
        main(["info", "synthetic:cora"])


def test_bench_main_errors_go_to_stderr(capsys):
    assert hector.bench.main(["--layers", "nope", "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("hector bench: error: --layers")
