"""JSON-lines files become Arrow tables through Arrow's own reader where it gives the table
that converting the parsed rows gives, and through the rows everywhere else."""

import json

import pyarrow as pa
import pytest

from trinity.buffer.file_parsers import parse_jsonl

# Each case: the file's lines, and the table that must come out, written by hand.
CASES = {
    "ints and floats widen": (
        ['{"a": 1, "b": "x"}', '{"a": 2.5, "c": null}'],
        pa.table({"a": [1.0, 2.5], "b": ["x", None], "c": pa.nulls(2)}),
    ),
    "structs merge their keys": (
        ['{"d": {"x": 1}}', '{"d": {"y": "s"}}'],
        pa.table({"d": [{"x": 1, "y": None}, {"x": None, "y": "s"}]}),
    ),
    "lists of structs, blank lines": (
        ['{"l": [{"p": 1}]}', "", "   ", '{"l": []}'],
        pa.table({"l": pa.array([[{"p": 1}], []])}),
    ),
    "keys in first-seen order": (
        ['{"b": 1, "a": 2}', '{"a": 3, "c": true}'],
        pa.table({"b": [1, None], "a": [2, 3], "c": [None, True]}),
    ),
    # Arrow's reader would make these timestamps; the rows keep them text.
    "ISO dates stay text": (
        ['{"t": "2020-01-01T10:00:00"}', '{"t": "2021-05-06"}'],
        pa.table({"t": ["2020-01-01T10:00:00", "2021-05-06"]}),
    ),
    # Arrow's reader refuses duplicate keys; json.loads keeps the last.
    "duplicate keys keep the last": (['{"a": 1, "a": 2}'], pa.table({"a": [2]})),
}


@pytest.mark.parametrize("case", CASES)
def test_jsonl_tables_match_the_hand_written_ones(tmp_path, case):
    lines, expected = CASES[case]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    table = parse_jsonl(str(path), "rows.jsonl").to_table()
    assert table.schema == expected.schema
    assert table.to_pylist() == expected.to_pylist()


def test_a_file_with_bad_lines_keeps_only_the_good_rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 3}\n')
    rows = parse_jsonl(str(path), "rows.jsonl")
    assert [b.number for b in rows.bad] == [2]
    assert rows.to_table().to_pylist() == [{"a": 1}, {"a": 3}]


def test_rows_dropped_by_the_checks_are_not_in_the_table(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"a": i}) + "\n" for i in range(4)))
    rows = parse_jsonl(str(path), "rows.jsonl")
    rows.mark_bad({1: "odd"})
    assert rows.to_table().column("a").to_pylist() == [0, 2, 3]
