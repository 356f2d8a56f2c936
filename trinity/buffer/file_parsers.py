"""Parse one data file (jsonl, json, csv, parquet) into rows that remember where they came from.

Every row keeps its 1-based position in the file (the line for jsonl/csv, the row for json
arrays and parquet), so a malformed row can be reported as ``data/train.jsonl line 17``. A
malformed row does not stop parsing: it is recorded as a ``BadRow`` and the caller decides
(``skip_bad_rows``) whether to drop it or fail. Problems that make the whole file unreadable
(a parquet file that is not parquet, a broken JSON array) raise ``DataFileError``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import pyarrow as pa

MISSING = object()  # the value of a key that a row does not have (null is None)


class DataFileError(ValueError):
    """A data file that cannot be read at all; the message names the problem (not the file)."""


@dataclass(frozen=True)
class BadRow:
    """One malformed row: where it is (file as the user wrote it, unit and number) and why."""

    file: str
    unit: str  # "line" or "row"
    number: int  # 1-based
    reason: str

    def where(self, with_file: bool) -> str:
        """``line 17``, or ``data/train.jsonl line 17`` when several files are involved."""
        place = f"{self.unit} {self.number}"
        return f"{self.file} {place}" if with_file else place


@dataclass
class FileRows:
    """The parsed rows of one file: Python dicts (json) or an Arrow table (csv, parquet)."""

    file: str
    unit: str
    numbers: List[int]  # the 1-based position of every row in ``rows`` / ``table``
    rows: Optional[List[Dict[str, Any]]] = None
    table: Optional[pa.Table] = None
    bad: List[BadRow] = field(default_factory=list)
    source: Optional[str] = None  # the JSON-lines file ``rows`` were parsed from

    def __len__(self) -> int:
        return len(self.numbers)

    def column_names(self) -> List[str]:
        """Every column of the file, in first-seen order (json rows may differ in keys)."""
        if self.table is not None:
            return list(self.table.column_names)
        return list(dict.fromkeys(key for row in self.rows or [] for key in row))

    def column(self, name: str) -> List[Any]:
        """The values of column ``name`` row by row; ``MISSING`` where a row lacks the key."""
        if self.table is not None:
            if name not in self.table.column_names:
                return [MISSING] * len(self)
            return self.table.column(name).to_pylist()
        return [row.get(name, MISSING) for row in self.rows or []]

    def mark_bad(self, reasons: Dict[int, str]) -> None:
        """Drop the rows at the given indices, recording them as bad with their reason."""
        if not reasons:
            return
        self.bad += [BadRow(self.file, self.unit, self.numbers[i], r) for i, r in reasons.items()]
        keep = [i for i in range(len(self)) if i not in reasons]
        self.numbers = [self.numbers[i] for i in keep]
        if self.table is not None:
            self.table = self.table.take(pa.array(keep, type=pa.int64()))
        else:
            self.rows = [self.rows[i] for i in keep]

    def to_table(self) -> pa.Table:
        """The rows as an Arrow table. Arrow needs one type per column: if the rows disagree,
        those whose top-level value is of another kind than most rows' (``"a"`` here, ``3``
        there) are marked bad and the rest converted."""
        if self.table is not None:
            return self.table
        if self.source is not None and not self.bad:
            self.table = _jsonl_table(self.source, len(self))
            if self.table is not None:
                self.rows = None
                return self.table
        try:
            self.table = _struct_table(self.rows or [])
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            self.mark_bad(_mixed_type_rows(self.rows or []))
            try:
                self.table = _struct_table(self.rows or [])
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:  # nested values disagree
                raise DataFileError(
                    f"a column holds values of different types ({exc}); give every row's "
                    "value in a column the same type"
                ) from exc
        self.rows = None
        return self.table


def _jsonl_table(path: str, num_rows: int) -> Optional[pa.Table]:
    """The JSON-lines file read by Arrow's own reader: the table ``_struct_table`` builds from
    its rows (the tests compare them), without ``pa.array``'s import of pandas (0.2 s of a
    run's start). None where Arrow refuses the file (a line over its block size, duplicate
    keys) or where the two differ: Arrow reads ISO dates as timestamps."""
    import pyarrow.json as pa_json

    try:
        table = pa_json.read_json(path)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    if table.num_rows != num_rows or _has_timestamp(pa.struct(table.schema)):
        return None
    return table


def _has_timestamp(kind: pa.DataType) -> bool:
    return pa.types.is_timestamp(kind) or any(
        _has_timestamp(kind.field(i).type) for i in range(kind.num_fields)
    )


def _struct_table(rows: List[Dict[str, Any]]) -> pa.Table:
    if not rows:  # pa.array([]) has no struct type to take columns from
        return pa.table({})
    return pa.Table.from_struct_array(pa.array(rows, from_pandas=False))


def _kind(value: Any) -> Optional[str]:
    """The JSON kind of ``value`` as the user would say it; None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def kind_name(value: Any) -> str:
    """``a string``, ``a number``, ``a list``, ``an object``, ``true/false`` or ``null``."""
    return _kind(value) or "null"


def _mixed_type_rows(rows: List[Dict[str, Any]]) -> Dict[int, str]:
    """Rows whose value in some column is of another kind than most rows' (Arrow needs one
    type per column); ties go to the kind seen first."""
    kinds: Dict[str, Counter] = {}
    for row in rows:
        for key, value in row.items():
            kind = _kind(value)
            if kind is not None:
                kinds.setdefault(key, Counter())[kind] += 1
    usual = {key: c.most_common(1)[0][0] for key, c in kinds.items() if len(c) > 1}
    bad: Dict[int, str] = {}
    for i, row in enumerate(rows):
        for key, kind in usual.items():
            found = _kind(row.get(key))
            if found is not None and found != kind and i not in bad:
                bad[i] = f"'{key}' is {found}, but in most rows it is {kind}"
    return bad


def _decoded(raw: bytes, first: bool) -> str:
    """``raw`` as UTF-8 text (a leading byte-order mark on the first line is dropped)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        byte = raw[exc.start]
        raise ValueError(f"not UTF-8 text (byte 0x{byte:02x} at column {exc.start + 1})") from exc
    return text.lstrip("\ufeff") if first else text


def _object(value: Any) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{kind_name(value)}, not a JSON object {{...}}")
    return value


def parse_jsonl(path: str, shown: str) -> FileRows:
    """One JSON object per line; blank lines are ignored."""
    out = FileRows(shown, "line", [], rows=[], source=path)
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                text = _decoded(raw, number == 1)
                if not text.strip():
                    continue
                try:
                    value = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"not valid JSON: {exc.msg} (column {exc.colno})") from exc
                out.rows.append(_object(value))
                out.numbers.append(number)
            except ValueError as exc:
                out.bad.append(BadRow(shown, "line", number, str(exc)))
    return out


def parse_json(path: str, shown: str) -> FileRows:
    """A JSON array of objects, an object of equal-length column lists, or JSON lines."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError:
        return parse_jsonl(path, shown)  # names the line holding the bad bytes
    if not text.lstrip().startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return parse_jsonl(path, shown)  # several lines: JSON lines, checked line by line
        return _columns_or_row(value, shown)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:  # a broken array: no row of it can be trusted
        raise DataFileError(
            f"line {exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})"
        ) from exc
    out = FileRows(shown, "row", [], rows=[])
    for number, item in enumerate(value, 1):
        try:
            out.rows.append(_object(item))
            out.numbers.append(number)
        except ValueError as exc:
            out.bad.append(BadRow(shown, "row", number, str(exc)))
    return out


def _columns_or_row(value: Any, shown: str) -> FileRows:
    """A whole-file JSON value that is not an array: columns of lists, or a single row."""
    if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
        lengths = {len(v) for v in value.values()}
        if len(lengths) == 1:  # {"question": [...], "answer": [...]}: one row per position
            rows = [
                dict(zip(value, items, strict=True)) for items in zip(*value.values(), strict=True)
            ]
            return FileRows(shown, "row", list(range(1, len(rows) + 1)), rows=rows)
    try:
        return FileRows(shown, "line", [1], rows=[_object(value)])
    except ValueError as exc:
        return FileRows(shown, "line", [], rows=[], bad=[BadRow(shown, "line", 1, str(exc))])


def parse_csv(path: str, shown: str) -> FileRows:
    """A header line, then one record per line (quoted fields may span lines); a record with
    another number of fields than the header, or with non-UTF-8 bytes, is a bad row."""
    import pandas as pd

    with open(path, "rb") as f:
        text = f.read().decode("utf-8", errors="surrogateescape").lstrip("\ufeff")
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    out = FileRows(shown, "line", [])
    if header is None:
        return out
    good = io.StringIO()
    writer = csv.writer(good)
    writer.writerow(header)
    start = reader.line_num + 1
    for record in reader:
        reason = _csv_problem(record, len(header))
        if reason:
            out.bad.append(BadRow(shown, "line", start, reason))
        elif record:  # an empty line is no record
            writer.writerow(record)
            out.numbers.append(start)
        start = reader.line_num + 1
    good.seek(0)
    frame = pd.read_csv(good) if out.numbers else pd.DataFrame(columns=header)
    out.table = pa.Table.from_pandas(frame, preserve_index=False)
    return out


_UNDECODED = re.compile("[\udc80-\udcff]")  # bytes that surrogateescape could not decode


def _csv_problem(record: List[str], width: int) -> Optional[str]:
    for k, value in enumerate(record, 1):
        found = _UNDECODED.search(value)
        if found:
            byte = ord(found.group()) - 0xDC00
            return f"not UTF-8 text (byte 0x{byte:02x} in field {k}, character {found.start() + 1})"
    if record and len(record) != width:
        fields = "field" if len(record) == 1 else "fields"
        return f"has {len(record)} {fields}, the header has {width}"
    return None


def parse_parquet(path: str, shown: str) -> FileRows:
    """A parquet file; rows are numbered from 1 in file order."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataFileError(f"not a readable parquet file ({exc})") from exc
    return FileRows(shown, "row", list(range(1, table.num_rows + 1)), table=table)


# file extension -> parser; other extensions are read by `datasets` (directories only)
PARSERS: Dict[str, Callable[[str, str], FileRows]] = {
    ".jsonl": parse_jsonl,
    ".json": parse_json,
    ".csv": parse_csv,
    ".parquet": parse_parquet,
}


def parser_for(path: str) -> Optional[Callable[[str, str], FileRows]]:
    """The parser of ``path`` by its extension, or None."""
    return PARSERS.get(os.path.splitext(path)[1].lower())
