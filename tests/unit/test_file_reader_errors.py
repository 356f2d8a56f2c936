"""Malformed data files: every error names the file and the 1-based line/row; skip_bad_rows."""

import json
import logging
import os
from pathlib import Path

import datasets
import pytest

from trinity.buffer import TaskReader
from trinity.buffer.file_reader import (
    BadRowsError,
    DataError,
    load_checked,
    load_rows,
)
from trinity.buffer.row_checks import row_schema
from trinity.common.config import FormatConfig, StorageConfig

LABEL = "buffer.explorer_input.taskset"
GOOD = '{"question": "1+1", "answer": "2"}\n'


def storage(path, skip=False, **fmt) -> StorageConfig:
    fmt = fmt or {"prompt_key": "question", "response_key": "answer"}
    return StorageConfig(
        name="math", path=str(path), format=FormatConfig(**fmt), skip_bad_rows=skip
    )


def write(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def error(path, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        load_rows(storage(path, **kwargs), path_label=LABEL)
    return str(info.value)


def test_invalid_json_line_names_file_line_and_column(tmp_path):
    path = write(tmp_path / "train.jsonl", GOOD + '{"question": "2" "answer": 3}\n' + GOOD)
    message = error(path)
    assert message == (
        f"{LABEL} (path '{path}'): line 2: not valid JSON: Expecting ',' delimiter (column 18); "
        f"set {LABEL}.skip_bad_rows: true to skip it"
    )


def test_non_utf8_bytes_name_the_byte_and_column(tmp_path):
    path = write(tmp_path / "t.jsonl", GOOD.encode() + b'{"question": "a\xffb", "answer": "1"}\n')
    # '{"question": "a' is 15 bytes: 0xff is the 16th
    assert "line 2: not UTF-8 text (byte 0xff at column 16)" in error(path)


@pytest.mark.parametrize(
    "line, kind",
    [("[1, 2]", "a list"), ("3", "a number"), ('"text"', "a string"), ("null", "null")],
)
def test_line_that_is_not_an_object_is_named(tmp_path, line, kind):
    path = write(tmp_path / "t.jsonl", GOOD + line + "\n")
    assert f"line 2: {kind}, not a JSON object" in error(path)


def test_empty_and_blank_files_are_errors(tmp_path):
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n"), ("e.csv", "")):
        path = write(tmp_path / name, text)
        with pytest.raises(DataError, match=f"path '{path}'.*the file is empty"):
            load_rows(storage(path))


def test_blank_lines_are_not_rows_and_line_numbers_count_them(tmp_path):
    path = write(tmp_path / "t.jsonl", GOOD + "\n" + '{"question": null, "answer": "1"}\n')
    assert "line 3: 'question' is null, expected a string" in error(path)


def test_file_that_is_not_parquet(tmp_path):
    path = write(tmp_path / "t.parquet", "question,answer\n")
    with pytest.raises(DataError, match=f"path '{path}'.*not a readable parquet file"):
        load_rows(storage(path))


def test_csv_record_with_wrong_field_count_names_its_first_line(tmp_path):
    # line 3 holds a quoted field spanning two lines, so the short record starts on line 5
    text = 'question,answer\n1+1,2\n"a\nb",3\n7\n2+2,4,extra\n'
    path = write(tmp_path / "t.csv", text)
    message = error(path)
    assert "2 malformed rows of 4: line 5: has 1 field, the header has 2; " in message
    assert "line 6: has 3 fields, the header has 2" in message
    rows = load_checked(storage(path, skip=True))
    assert rows.rows["question"] == ["1+1", "a\nb"] and rows.rows["answer"] == [2, 3]
    assert [rows.where(i) for i in range(2)] == [f"{path} line 2", f"{path} line 3"]


def test_csv_with_non_utf8_bytes(tmp_path):
    path = write(tmp_path / "t.csv", b"question,answer\n1+1,2\nx\xfe,3\n")
    assert "line 3: not UTF-8 text (byte 0xfe in field 1, character 2)" in error(path)


def test_broken_json_array_is_one_error_without_a_skip_hint(tmp_path):
    path = write(tmp_path / "t.json", '[{"question": "1", "answer": "2"},\n {"question" "1"}]')
    with pytest.raises(DataError) as info:
        load_rows(storage(path, skip=True), path_label=LABEL)
    assert str(info.value) == (
        f"{LABEL} (path '{path}'): line 2: not valid JSON: Expecting ':' delimiter (column 14)"
    )


def test_json_array_element_that_is_not_an_object_names_the_row(tmp_path):
    path = write(tmp_path / "t.json", json.dumps([json.loads(GOOD), [1], json.loads(GOOD)]))
    assert "row 2: a list, not a JSON object" in error(path)
    assert len(load_rows(storage(path, skip=True))) == 2


def test_json_columns_and_json_lines_in_a_json_file(tmp_path):
    columns = write(tmp_path / "c.json", '{"question": ["1", "2"], "answer": ["a", "b"]}')
    assert load_rows(storage(columns))["answer"] == ["a", "b"]
    lines = write(tmp_path / "l.json", GOOD + "{oops}\n")
    assert "line 2: not valid JSON" in error(lines)


def test_row_checks_name_each_bad_row_and_count_them(tmp_path):
    rows = [
        {"question": None, "answer": "1"},
        {"question": 5, "answer": "1"},
        {"answer": "1"},
        {"question": "x", "answer": None},
        {"question": "ok", "answer": 3},  # a taskset answer may be a number
    ]
    path = write(tmp_path / "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BadRowsError) as info:
        load_rows(storage(path), path_label=LABEL)
    assert info.value.num_bad == 4 and [b.number for b in info.value.bad_rows] == [1, 2, 3, 4]
    assert str(info.value) == (
        f"{LABEL} (path '{path}'): 4 malformed rows of 5: "
        "line 1: 'question' is null, expected a string; "
        "line 2: 'question' is a number, expected a string; "
        "line 3: 'question' is missing, expected a string; line 4: 'answer' is null; "
        f"set {LABEL}.skip_bad_rows: true to skip them"
    )


def test_skip_bad_rows_keeps_the_rest_counts_and_logs(tmp_path, caplog):
    lines = [GOOD, "not json\n", '{"question": 1, "answer": "2"}\n', GOOD, "[]\n"]
    path = write(tmp_path / "t.jsonl", "".join(lines))
    with caplog.at_level(logging.WARNING, logger="trinity.buffer"):
        loaded = load_checked(storage(path, skip=True), path_label=LABEL)
    assert len(loaded.rows) == 2 and loaded.num_skipped == 3
    assert [(b.file, b.number) for b in loaded.skipped] == [(str(path), 2), (str(path), 3)] + [
        (str(path), 5)
    ]
    assert [loaded.where(i) for i in range(2)] == [f"{path} line 1", f"{path} line 4"]
    assert "skipped 3 malformed row(s) of 5 (skip_bad_rows): line 2: not valid JSON" in caplog.text


def test_every_row_bad_is_an_error_even_when_skipping(tmp_path):
    path = write(tmp_path / "t.jsonl", "[1]\n[2]\n")
    for skip in (False, True):
        with pytest.raises(BadRowsError, match="every row is malformed \\(2 rows\\): line 1"):
            load_rows(storage(path, skip=skip))


def test_long_listings_are_cut_after_five(tmp_path):
    path = write(tmp_path / "t.jsonl", GOOD + "x\n" * 8)
    message = error(path)
    assert "8 malformed rows of 9: line 2:" in message and "line 6:" in message
    assert "line 7:" not in message and "(and 3 more)" in message


def test_without_a_yaml_path_the_hint_names_the_buffer(tmp_path):
    path = write(tmp_path / "t.jsonl", GOOD + "x\n")
    with pytest.raises(BadRowsError, match="set skip_bad_rows of buffer 'math': true to skip it"):
        load_rows(storage(path))


def test_directory_errors_name_the_file_inside_it(tmp_path):
    write(tmp_path / "d" / "data" / "train-00000-of-00002.jsonl", GOOD * 2)
    write(tmp_path / "d" / "data" / "train-00001-of-00002.jsonl", GOOD + "{\n")
    shown = os.path.join(str(tmp_path / "d"), "data", "train-00001-of-00002.jsonl")
    assert f"{shown} line 2: not valid JSON" in error(tmp_path / "d")
    loaded = load_checked(storage(tmp_path / "d", skip=True))
    assert len(loaded.rows) == 3 and loaded.where(2) == f"{shown} line 1"


def test_mixed_value_types_in_a_column_name_the_odd_row(tmp_path):
    rows = [{"question": "q", "answer": "1", "tag": t} for t in (1, "x", 2)]
    path = write(tmp_path / "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert "line 2: 'tag' is a string, but in most rows it is a number" in error(path)
    assert load_rows(storage(path, skip=True))["tag"] == [1, 2]


def test_a_column_absent_from_every_row_is_one_error(tmp_path):
    path = write(tmp_path / "t.jsonl", '{"q": "1", "answer": "2"}\n' * 3)
    message = error(path)
    assert "column(s) ['question'] named in `format` are missing" in message
    assert "line" not in message


def test_messages_rows_are_checked_for_each_reader(tmp_path):
    convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    rows = [
        {"m": convo},
        {"m": "hi"},
        {"m": [{"role": "user"}]},
        {"m": [{"content": "x"}]},
        {"m": ["hi"]},
        {"m": convo[:1]},
    ]
    path = write(tmp_path / "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    s = storage(path, prompt_type="messages", messages_key="m")
    with pytest.raises(BadRowsError) as info:
        load_rows(s, columns=row_schema(s.format, "sft"))
    assert [b.reason for b in info.value.bad_rows] == [
        "'m' is a string, expected a list of {role, content} objects",
        "'m' item 1 has no 'content'",
        "'m' item 1 has no 'role' string",
        "'m' item 1 is a string, expected a {role, content} object",
        "'m' has no assistant turn to train on",
    ]
    # a taskset (or DPO prompt) needs no assistant turn: row 6 is fine there
    with pytest.raises(BadRowsError) as info:
        load_rows(s, columns=row_schema(s.format, "taskset"))
    assert info.value.num_bad == 4


def test_dpo_responses_are_checked_at_load(tmp_path):
    rows = [
        {"prompt": "hi", "chosen": "ok", "rejected": "no"},
        {"prompt": "hi", "chosen": ["ok"], "rejected": "no"},
    ]
    path = write(tmp_path / "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    s = storage(path, prompt_key="prompt")
    with pytest.raises(BadRowsError, match="line 2: 'chosen' must be a string, not a list"):
        load_rows(s, columns=row_schema(s.format, "dpo"))


def test_row_schema_per_reader():
    explicit = FormatConfig(prompt_key="q", system_prompt_key="sys")
    assert row_schema(explicit, "taskset") == {"q": "text", "sys": "text_or_null"}
    assert row_schema(explicit, "sft") == {"q": "text", "response": "text", "sys": "text_or_null"}
    assert row_schema(explicit, "dpo") == {
        "q": "text",
        "sys": "text_or_null",
        "chosen": "response",
        "rejected": "response",
    }
    multi = FormatConfig(prompt_type="messages", enable_concatenated_multi_turn=True)
    assert row_schema(multi, "sft") == {"message": "conversation_all_turns"}
    with pytest.raises(ValueError, match="reader 'rm'"):
        row_schema(explicit, "rm")


def test_loads_are_cached_until_the_file_changes(tmp_path):
    path = write(tmp_path / "t.jsonl", GOOD * 2)
    first = load_rows(storage(path))
    assert load_rows(storage(path)) is first
    write(path, GOOD * 3)
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse-clock filesystems
    assert len(load_rows(storage(path))) == 3


def test_task_reader_exposes_what_it_skipped(tmp_path):
    path = write(tmp_path / "t.jsonl", GOOD + '{"question": [1], "answer": "1"}\n' + GOOD)
    reader = TaskReader(storage(path, skip=True))
    assert len(reader) == 2 and reader.num_skipped == 1
    assert reader.skipped[0].reason == "'question' is a list, expected a string"
    assert [t.raw_task["question"] for t in reader.read_all()] == ["1+1", "1+1"]


def test_parquet_rows_are_numbered_from_one(tmp_path):
    rows = [{"question": "1", "answer": "2"}, {"question": None, "answer": "3"}]
    path = tmp_path / "t.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    assert "row 2: 'question' is null, expected a string" in error(path)
