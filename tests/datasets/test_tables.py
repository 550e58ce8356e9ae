"""The shared reader of header-row tables (label TSVs, MUSAE CSVs): errors name file and line."""
import pytest

from hector.datasets.tables import read_table


def test_rows_and_alternative_columns(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("id,name,ml_target\n0,a,1\n\n2,b,0\n")
    assert list(read_table(p, ["id", ("target", "ml_target")])) == [(2, ["0", "1"]), (4, ["2", "0"])]


@pytest.mark.parametrize("text, match", [
    ("id,target\n1,2\n3\n", r"t\.csv: line 3: 1 columns, expected 2"),
    ("id,x\n1,2\n", r"t\.csv: missing column 'target' or 'ml_target' in header \['id', 'x'\]"),
    ("", r"t\.csv: empty file \(expected a header row\)"),
])
def test_bad_tables(tmp_path, text, match):
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(ValueError, match=match):
        list(read_table(p, ["id", ("target", "ml_target")]))


def test_not_utf8(tmp_path):
    p = tmp_path / "t.tsv"
    p.write_bytes(b"node\tlabel\n\xff\xfe\tx\n")
    with pytest.raises(ValueError, match=r"t\.tsv: not UTF-8"):
        list(read_table(p, ["node", "label"], delimiter="\t"))
