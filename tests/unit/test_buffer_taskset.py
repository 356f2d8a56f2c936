"""Tasksets: loading files offline, Task fields, selector order, resume, errors."""

import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest

from trinity.buffer import TaskReader, load_rows
from trinity.common.config import FormatConfig

ROWS = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(5)]


def write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def storage(path, **overrides) -> SimpleNamespace:
    fmt = SimpleNamespace(
        prompt_type="plaintext",
        prompt_key="question",
        response_key="answer",
        system_prompt_key=None,
        messages_key="message",
    )
    values = dict(
        name="math",
        storage_type="file",
        path=str(path),
        subset_name=None,
        split="train",
        format=fmt,
        rollout_args=SimpleNamespace(temperature=0.7, n=4),
        default_workflow_type="math_workflow",
        default_reward_fn_type="math_reward",
        workflow_args={"k": 1},
        reward_fn_args={"scale": 2.0},
        task_selector=SimpleNamespace(selector_type="sequential", seed=42),
        is_eval=False,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", ROWS[:2])
    return tmp_path


def test_directory_splits_are_resolved_by_name(data_dir):
    assert load_rows(storage(data_dir))["question"] == [r["question"] for r in ROWS]
    assert len(load_rows(storage(data_dir, split="test"))) == 2


def test_unknown_split_lists_the_splits_found(data_dir):
    with pytest.raises(ValueError, match="split` 'validation' does not exist.*train.*test"):
        load_rows(storage(data_dir, split="validation"))


def test_missing_path_names_the_key_and_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"`path` '.*nowhere' does not exist"):
        load_rows(storage(tmp_path / "nowhere"))


def test_empty_file_is_an_error(tmp_path):
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_rows(storage(tmp_path / "train.jsonl"))


def test_single_parquet_file_and_hf_parquet_layout(tmp_path):
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "one.parquet"))
    assert len(load_rows(storage(tmp_path / "one.parquet"))) == 5
    layout = tmp_path / "hub" / "data"
    layout.mkdir(parents=True)
    datasets.Dataset.from_list(ROWS[:3]).to_parquet(str(layout / "train-00000-of-00001.parquet"))
    assert load_rows(storage(tmp_path / "hub"))["answer"] == ["1", "2", "3"]


PLAIN_LAYOUTS = {
    "jsonl splits": {"train.jsonl": ROWS, "test.jsonl": ROWS[:2]},
    "three splits": {"train.json": ROWS, "validation.json": ROWS[1:3], "test.json": ROWS[:1]},
    "csv": {"test.csv": ROWS[2:]},
    "parquet": {"train.parquet": ROWS[:4]},
    "an extra file": {"train.jsonl": ROWS, "notes.jsonl": ROWS[:1]},
}


def write_layout(root: Path, files: dict) -> None:
    root.mkdir(parents=True)
    for name, rows in files.items():
        path, frame = root / name, datasets.Dataset.from_list(rows)
        if path.suffix == ".jsonl":
            write_jsonl(path, rows)
        elif path.suffix == ".json":
            path.write_text(json.dumps(rows))
        elif path.suffix == ".csv":
            frame.to_csv(str(path), index=False)
        else:
            frame.to_parquet(str(path))


@pytest.mark.parametrize("layout", PLAIN_LAYOUTS)
def test_plain_directories_read_as_datasets_resolves_them(tmp_path, layout):
    """The reader resolves a plain directory itself; each split must hold the rows, in the
    order, that ``datasets.load_dataset`` gives, and a split ``datasets`` does not find is
    refused with the same list of splits."""
    write_layout(tmp_path / layout, PLAIN_LAYOUTS[layout])
    reference = datasets.load_dataset(str(tmp_path / layout))
    for split in ("train", "validation", "test"):
        if split in reference:
            rows = load_rows(storage(tmp_path / layout, split=split))
            assert rows["question"] == reference[split]["question"]
            assert [str(a) for a in rows["answer"]] == [str(a) for a in reference[split]["answer"]]
        else:
            with pytest.raises(ValueError, match=f"split` '{split}' does not exist") as err:
                load_rows(storage(tmp_path / layout, split=split))
            assert err.value.args[0].endswith(", ".join(reference))


def test_splits_of_two_formats_are_refused_by_name(tmp_path):
    write_layout(tmp_path / "mixed", {"train.jsonl": ROWS, "test.csv": ROWS[:2]})
    with pytest.raises(ValueError, match="buffer 'math'.*splits mix file formats"):
        load_rows(storage(tmp_path / "mixed"))


def test_the_quickstart_layout_is_read_without_importing_datasets_or_pandas(data_dir):
    """Both take 0.2-0.4 s to import, which every run would pay before its first step."""
    code = (
        "import sys; from types import SimpleNamespace as N; from trinity.buffer import load_rows;"
        f"s = N(name='t', storage_type='file', path={str(data_dir)!r}, subset_name=None,"
        " split='test', format=N(prompt_key='question', response_key='answer'));"
        "print(load_rows(s)['answer'], 'datasets' in sys.modules, 'pandas' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["['1',", "'2']", "False", "False"], done.stderr


def test_subset_name_selects_a_readme_config(tmp_path):
    write_jsonl(tmp_path / "easy" / "train.jsonl", ROWS[:1])
    write_jsonl(tmp_path / "hard" / "train.jsonl", ROWS[1:4])
    (tmp_path / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: easy\n  data_files:\n  - split: train\n    path: easy/train.jsonl\n"
        "- config_name: hard\n  data_files:\n  - split: train\n    path: hard/train.jsonl\n---\n"
    )
    assert len(load_rows(storage(tmp_path, subset_name="hard"))) == 3
    with pytest.raises(
        ValueError, match="subset_name` 'medium' does not exist; its subsets: easy, hard"
    ):
        load_rows(storage(tmp_path, subset_name="medium"))
    with pytest.raises(ValueError, match="subset_name` is not set, and the dataset has subsets"):
        load_rows(storage(tmp_path))


def test_tasks_carry_the_taskset_settings(data_dir):
    s = storage(data_dir, is_eval=True)
    task = TaskReader(s).read(2)[1]
    assert task.raw_task == {"question": "1+1", "answer": "2"}
    assert (task.workflow, task.reward_fn) == ("math_workflow", "math_reward")
    assert task.format_args is s.format and task.rollout_args is s.rollout_args
    assert task.workflow_args == {"k": 1} and task.reward_fn_args == {"scale": 2.0}
    assert task.is_eval and task.taskset_name == "math" and task.index == 1


def test_sequential_batches_and_short_last_batch(data_dir):
    reader = TaskReader(storage(data_dir), total_epochs=1)
    assert [t.index for t in reader.read(2)] == [0, 1]
    assert [t.index for t in reader.read(2)] == [2, 3]
    assert [t.index for t in reader.read(2)] == [4]  # the last batch of the last epoch is short
    with pytest.raises(StopIteration):
        reader.read(2)
    assert reader.num_steps(2) == 3  # ceil(5 rows * 1 epoch / 2)


def test_batches_run_across_epochs(data_dir):
    reader = TaskReader(storage(data_dir), total_epochs=2)
    batches = [[t.index for t in reader.read(3)] for _ in range(4)]
    # 10 row reads in batches of 3: epoch 0 = 0..4, epoch 1 = 0..4
    assert batches == [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4]]


def test_total_steps_overrides_epochs(data_dir):
    reader = TaskReader(storage(data_dir), total_epochs=1, total_steps=4)
    batches = [[t.index for t in reader.read(2)] for _ in range(4)]
    assert batches == [[0, 1], [2, 3], [4, 0], [1, 2]]
    with pytest.raises(StopIteration):
        reader.read(2)


def test_shuffle_is_a_seeded_permutation_per_epoch(data_dir):
    s = storage(data_dir, task_selector=SimpleNamespace(selector_type="shuffle", seed=7))
    reader = TaskReader(s, total_epochs=2)
    epoch0 = [t.index for t in reader.read(5)]
    epoch1 = [t.index for t in reader.read(5)]
    expected = []
    for epoch in (0, 1):  # the documented rule: random.Random(seed + epoch).shuffle
        order = list(range(5))
        random.Random(7 + epoch).shuffle(order)
        expected.append(order)
    assert [epoch0, epoch1] == expected
    assert epoch0 != epoch1 and sorted(epoch0) == sorted(epoch1) == list(range(5))


def test_resume_continues_where_it_stopped(data_dir):
    s = storage(data_dir, task_selector=SimpleNamespace(selector_type="shuffle", seed=3))
    full = TaskReader(s, total_epochs=3)
    expected = [[t.index for t in full.read(2)] for _ in range(7)]
    first = TaskReader(s, total_epochs=3)
    got = [[t.index for t in first.read(2)] for _ in range(4)]
    resumed = TaskReader(s, total_epochs=3)
    resumed.load_state_dict(first.state_dict())
    got += [[t.index for t in resumed.read(2)] for _ in range(3)]
    assert got == expected
    assert resumed.state_dict()["steps"] == 7


def test_unknown_selector_names_the_key_and_choices(data_dir):
    s = storage(data_dir, task_selector=SimpleNamespace(selector_type="randm", seed=1))
    match = "task_selector.selector_type.*'randm'.*did you mean 'random'.*sequential"
    with pytest.raises(ValueError, match=match):
        TaskReader(s)


def test_missing_column_is_reported_at_load(data_dir):
    s = storage(data_dir)
    s.format.prompt_key = "problem"
    with pytest.raises(ValueError, match=r"\['problem'\].*missing.*question"):
        TaskReader(s)


def test_row_without_the_key_names_the_line_at_load(tmp_path):
    rows = ROWS[:2] + [{"question": "x"}] + ROWS[3:]
    path = write_jsonl(tmp_path / "tasks.jsonl", rows)
    with pytest.raises(ValueError, match=r"tasks.jsonl.*line 3: 'answer' is missing"):
        TaskReader(storage(path))


def test_only_keys_set_by_the_user_are_required_for_tasksets(tmp_path):
    # a custom workflow reads raw_task itself: default prompt/response keys need not exist
    path = write_jsonl(tmp_path / "t.jsonl", [{"nums": [1, 2], "target": 3}])
    assert TaskReader(storage(path, format=FormatConfig())).read_all()[0].raw_task["target"] == 3
    with pytest.raises(ValueError, match="question"):
        TaskReader(storage(path, format=FormatConfig(prompt_key="question")))


def test_read_all_is_file_order_and_keeps_position(data_dir):
    reader = TaskReader(storage(data_dir, split="test"))
    assert [t.raw_task["answer"] for t in reader.read_all()] == ["1", "2"]
    assert [t.index for t in reader.read(2)] == [0, 1]
