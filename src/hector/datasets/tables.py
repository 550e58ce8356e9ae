"""Delimited text tables with a header row (label files, CSV node lists): one reader, so every
loader reports a bad row the same way, naming the file and the line."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterator, List, Sequence, Tuple, Union

Column = Union[str, Tuple[str, ...]]   # a name, or alternatives accepted in that order


def read_table(path: Path, columns: Sequence[Column],
               delimiter: str = ",") -> Iterator[Tuple[int, List[str]]]:
    """Yield ``(line number, [value of each requested column])`` for every non-empty row.

    A missing header or column, a row with another number of fields than the header, or a
    file that is not UTF-8 raises ``ValueError`` naming ``path`` (and the line)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f, delimiter=delimiter)
            header = [h.strip() for h in next(reader, [])]
            if not header:
                raise ValueError(f"{path}: empty file (expected a header row)")
            index = []
            for col in columns:
                names = (col,) if isinstance(col, str) else tuple(col)
                found = next((n for n in names if n in header), None)
                if found is None:
                    raise ValueError(f"{path}: missing column {' or '.join(map(repr, names))} "
                                     f"in header {header}")
                index.append(header.index(found))
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    raise ValueError(f"{path}: line {reader.line_num}: {len(row)} columns, "
                                     f"expected {len(header)}")
                yield reader.line_num, [row[i] for i in index]
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text: {e}") from e
