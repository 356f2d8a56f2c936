"""The malformed-dataset corpus: each bad file stops `trinity run` before Ray starts (exit 2)
with a message that names the file and the line/row; ``skip_bad_rows`` gets past them.

Every case runs the real CLI in-process on the small GRPO config with one dataset replaced
(the training taskset unless the case says otherwise); ``init_ray`` is guarded, so a case that
reached it fails with ``RayStartAttempted`` instead of starting a cluster.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

import pytest

from tests.reliability.conftest import RayStartAttempted, run_cli, write_config

Content = Union[str, bytes, Callable[[str], None]]


def row(question: Any = "1+1=", answer: Any = "2", **extra: Any) -> str:
    return json.dumps({"question": question, "answer": answer, **extra}) + "\n"


GOOD = row() * 6


def parquet(rows: list) -> Callable[[str], None]:
    def write(path: str) -> None:
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(path)

    return write


@dataclass
class Case:
    name: str
    file: str  # name of the data file (or of a folder with its shards) under tmp_path
    content: Union[Content, Dict[str, Content]]  # a dict: a folder of files
    where: Optional[str]  # the line/row the message must name (None: a whole-file problem)
    target: str = "taskset"  # which dataset of the config it replaces


SFT_GOOD = json.dumps({"prompt": "1+1=", "response": "2"}) + "\n"
CHAT = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]
CHAT_GOOD = json.dumps({"messages": CHAT}) + "\n"
CSV_GOOD = "1+1=,2\n"
OBJ = {"question": "1+1=", "answer": "2"}
PARQUET_QUESTIONS = ["1+1=", "1+1=", None, "1", "2", "3"]
SHARDS = {"data/train-00000-of-00002.jsonl": GOOD, "data/train-00001-of-00002.jsonl": row() + "{\n"}
CASES = [
    Case(
        "invalid_json", "t.jsonl", row() * 2 + '{"question": "1" "answer": "2"}\n' + GOOD, "line 3"
    ),
    Case("truncated_last_line", "t.jsonl", GOOD + '{"question": "3+', "line 7"),
    Case("non_utf8_byte", "t.jsonl", GOOD.encode() + b'{"question": "1\xff"}\n', "line 7"),
    Case(
        "latin1_row",
        "t.jsonl",
        (row() * 4 + '{"question": "caf\u00e9"}\n' + GOOD).encode("latin-1"),
        "line 5",
    ),
    Case("json_array_line", "t.jsonl", row() + "[1, 2]\n" + GOOD, "line 2"),
    Case("json_number_line", "t.jsonl", row() * 5 + "42\n" + row(), "line 6"),
    Case("json_string_line", "t.jsonl", '"just text"\n' + GOOD, "line 1"),
    Case("empty_file", "t.jsonl", "", None),
    Case("blank_lines_only", "t.jsonl", "\n \n\n", None),
    Case("null_prompt", "t.jsonl", row() * 2 + row(None) + GOOD, "line 3"),
    Case("number_prompt", "t.jsonl", row() + row(17) + GOOD, "line 2"),
    Case("missing_prompt", "t.jsonl", row() * 4 + '{"answer": "2"}\n' + GOOD, "line 5"),
    Case("null_answer", "t.jsonl", row() * 3 + row(answer=None) + GOOD, "line 4"),
    Case("mixed_type_column", "t.jsonl", row(s=1) * 2 + row(s="web") + row(s=2) * 4, "line 3"),
    Case(
        "csv_extra_field",
        "t.csv",
        "question,answer\n" + CSV_GOOD * 2 + "2+2=,4,x\n" + CSV_GOOD * 4,
        "line 4",
    ),
    Case(
        "csv_non_utf8",
        "t.csv",
        b"question,answer\n1+1=,2\n\xfe,2\n" + CSV_GOOD.encode() * 5,
        "line 3",
    ),
    Case("not_parquet", "t.parquet", "question,answer\n1+1=,2\n", None),
    Case(
        "parquet_null_prompt",
        "t.parquet",
        parquet([{**OBJ, "question": q} for q in PARQUET_QUESTIONS]),
        "row 3",
    ),
    Case("json_array_broken", "t.json", json.dumps([OBJ])[:-1] + ',\n {"question" "1"}]', "line 2"),
    Case("json_array_non_object", "t.json", json.dumps([OBJ, "oops"] + [OBJ] * 5), "row 2"),
    Case("hf_folder_bad_shard", "d", SHARDS, "line 2"),
    Case("eval_taskset_bad_row", "t.jsonl", row() + row([1, 2]) + GOOD, "line 2", target="eval"),
    Case(
        "sft_null_response",
        "t.jsonl",
        SFT_GOOD * 3 + '{"prompt": "1", "response": null}\n' + SFT_GOOD * 3,
        "line 4",
        target="sft",
    ),
    Case(
        "sft_messages_not_a_list",
        "t.jsonl",
        CHAT_GOOD * 2 + '{"messages": "hi"}\n' + CHAT_GOOD * 3,
        "line 3",
        target="sft_messages",
    ),
]


def _write(base: str, content: Union[Content, Dict[str, Content]]) -> None:
    if isinstance(content, dict):
        for name, part in content.items():
            _write(os.path.join(base, name), part)
        return
    os.makedirs(os.path.dirname(base), exist_ok=True)
    if callable(content):
        content(base)
    else:
        with open(base, "wb") as f:
            f.write(content if isinstance(content, bytes) else content.encode())


def _use(config: Dict[str, Any], target: str, path: str, skip: bool = False) -> None:
    """Point the config's ``target`` dataset at ``path``."""
    inputs = config["buffer"]["explorer_input"]
    if target in ("taskset", "eval"):
        storage = inputs["taskset"] if target == "taskset" else inputs["eval_tasksets"][0]
        storage.update(path=path, skip_bad_rows=skip)
        return
    messages = target == "sft_messages"
    fmt = (
        {"prompt_type": "messages", "messages_key": "messages"}
        if messages
        else {"prompt_key": "prompt", "response_key": "response"}
    )
    config.update(mode="train", algorithm={"algorithm_type": "sft"})
    config["buffer"].update(train_batch_size=2, total_steps=1)
    config["buffer"]["trainer_input"] = {
        "experience_buffer": {
            "name": "sft_data",
            "storage_type": "file",
            "path": path,
            "format": fmt,
            "skip_bad_rows": skip,
        }
    }


def _run(tmp_path, base_config: Dict[str, Any], case: Case, skip: bool = False):
    path = str(tmp_path / case.file)
    _write(path, case.content)
    _use(base_config, case.target, path, skip)
    return run_cli(["run", "--config", write_config(tmp_path, base_config)]), path


def test_corpus_has_at_least_15_datasets():
    assert len({c.name for c in CASES}) == len(CASES) >= 15


def _storage(config: Dict[str, Any], target: str) -> Tuple[Dict[str, Any], str, str]:
    """The ``target`` dataset's YAML mapping, its YAML path and the reader that reads it."""
    if target == "taskset":
        return config["buffer"]["explorer_input"]["taskset"], "explorer_input.taskset", "taskset"
    if target == "eval":
        eval_set = config["buffer"]["explorer_input"]["eval_tasksets"][0]
        return eval_set, "explorer_input.eval_tasksets[0]", "taskset"
    buffer = config["buffer"]["trainer_input"]["experience_buffer"]
    return buffer, "trainer_input.experience_buffer", "sft"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_loader_names_file_and_row(tmp_path, base_config, case):
    """The corpus as the readers load it (no CLI): the message names the file and the row."""
    from trinity.buffer.file_reader import load_rows
    from trinity.buffer.row_checks import row_schema
    from trinity.common.config import StorageConfig

    path = str(tmp_path / case.file)
    _write(path, case.content)
    _use(base_config, case.target, path)
    mapping, yaml_path, reader = _storage(base_config, case.target)
    storage = StorageConfig(**mapping)
    with pytest.raises(ValueError) as info:
        columns = row_schema(storage.format, reader)
        load_rows(storage, columns=columns, path_label=f"buffer.{yaml_path}")
    message = str(info.value)
    assert message.startswith(f"buffer.{yaml_path} (path '{path}')") and "\n" not in message
    assert case.where is None or case.where in message


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_dataset_stops_before_ray_naming_file_and_row(tmp_path, base_config, ray_guard, case):
    run, path = _run(tmp_path, base_config, case)
    assert ray_guard == [], f"Ray would have started: {run.output}"
    assert run.exit_code == 2, run.output
    assert path in run.output
    if case.where:
        assert case.where in run.output
    assert "Traceback" not in run.output


def test_skip_bad_rows_gets_past_the_data_checks(tmp_path, base_config, ray_guard):
    bad = Case("two_bad_rows", "t.jsonl", row() * 3 + row(None) + "[]\n" + GOOD, "line 4")
    base_config["cluster"] = {"in_process": False}  # on Ray: the guard sees it start
    run, _ = _run(tmp_path, base_config, bad, skip=True)
    assert isinstance(run.exception, RayStartAttempted), run.output
    assert len(ray_guard) == 1


def test_skip_bad_rows_with_every_row_bad_still_stops(tmp_path, base_config, ray_guard):
    bad = Case("all_bad", "t.jsonl", "[1]\n[2]\n", "line 1")
    run, path = _run(tmp_path, base_config, bad, skip=True)
    assert ray_guard == [] and run.exit_code == 2, run.output
    assert path in run.output and "every row is malformed" in run.output
