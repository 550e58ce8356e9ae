"""scripts/tree_ab.py: two source trees timed in alternating order, table cells averaged."""
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import tree_ab  # noqa: E402


def test_orders_alternate_so_neither_tree_always_runs_second():
    assert tree_ab.orders(["old", "new"], 4) == [["old", "new"], ["new", "old"],
                                                  ["old", "new"], ["new", "old"]]


def test_table_cells_reads_numbers_by_row_and_column_and_skips_the_rest():
    text = ("noise\n| model | ms | note |\n|---|---:|---|\n| rgcn | 1,234.5 | fast |\n"
            "| hgt | nan | - |\nafter\n| a | b |\n|---|---|\n| x | 2 |\n")
    cells = tree_ab.table_cells(text)
    assert cells[("rgcn", "ms")] == 1234.5 and cells[("x", "b")] == 2.0
    assert ("rgcn", "note") not in cells
    assert str(cells[("hgt", "ms")]) == "nan"


def test_table_cells_keys_bench_rows_by_their_leading_text_cells():
    """``hector bench --markdown`` rows: the key is every cell before the first number (the
    layer, the dataset, its F x H and the peer); a number with a spread or a note counts."""
    text = ("| layer | dataset | F x H | peer | inference ms | speedup | check |\n"
            "|---|---|---|---|---|---|---|\n"
            "| gat | cora | 128x1 | hector | 0.445 [0.357, 0.901] noisy | 5.37x | ok (1e-07) |\n"
            "| gat | cora | 128x1 | hector captured | 0.068 [0.066, 0.070] | 8.1x | no ref |\n")
    cells = tree_ab.table_cells(text)
    assert cells[("gat | cora | 128x1 | hector", "inference ms")] == 0.445
    assert cells[("gat | cora | 128x1 | hector captured", "inference ms")] == 0.068
    assert cells[("gat | cora | 128x1 | hector captured", "speedup")] == 8.1
    assert not any(col == "check" for _, col in cells)


def test_end_to_end_each_tree_on_its_own_path(tmp_path, capsys):
    for name, x in (("a", 2), ("b", 5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "probe.py").write_text(f"X = {x}\n")
    cmd = tmp_path / "cmd.py"
    cmd.write_text("import probe\nprint('| k | v |\\n|---|---|\\n| r | %d |' % probe.X)\n")
    log = tmp_path / "log"
    assert tree_ab.main(["--tree", f"old={tmp_path / 'a'}", "--tree", f"new={tmp_path / 'b'}",
                         "--rounds", "2", "--log", str(log), "--", sys.executable,
                         str(cmd)]) == 0
    out = capsys.readouterr().out
    assert "r | v: old 2.000  new 5.000  new/old 2.500" in out
    assert [l.split()[1] for l in log.read_text().splitlines() if l.startswith("===")] == \
        ["old", "new", "new", "old"]


def test_env_sets_a_variable_for_one_trees_runs(tmp_path, capsys):
    cmd = tmp_path / "cmd.py"
    cmd.write_text("import os\nprint('| k | v |\\n|---|---|\\n| r | %s |' % "
                   "os.environ.get('AB_SWITCH', '0'))\n")
    log = tmp_path / "log"
    assert tree_ab.main(["--tree", f"off={tmp_path}", "--tree", f"on={tmp_path}",
                         "--env", "on:AB_SWITCH=7", "--rounds", "2", "--log", str(log),
                         "--", sys.executable, str(cmd)]) == 0
    assert "r | v: off 0.000  on 7.000" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tree_ab.main(["--tree", f"off={tmp_path}", "--tree", f"on={tmp_path}",
                      "--env", "nosuch:AB_SWITCH=7", "--", sys.executable, str(cmd)])
