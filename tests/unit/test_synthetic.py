"""Synthetic datasets: seeded, disjoint splits, correct answers, readable by ``datasets``."""

import os

import pytest
from datasets import load_dataset

from trinity.demo.synthetic import (
    make_arithmetic,
    make_arithmetic_sft,
    make_countdown,
    prepare_quickstart,
    read_jsonl,
)


def test_arithmetic_rows_are_correct_disjoint_and_seeded(tmp_path):
    paths = make_arithmetic(str(tmp_path / "a"), n_train=300, n_test=50, digits=2, seed=1)
    train, test = read_jsonl(paths["train"]), read_jsonl(paths["test"])
    assert len(train) == 300 and len(test) == 50
    for row in train + test:
        left, right = row["question"].rstrip("=").split("+")
        assert row["question"].endswith("=")
        assert int(row["answer"]) == int(left) + int(right)
        assert 0 <= int(left) < 100 and 0 <= int(right) < 100
    questions = [r["question"] for r in train + test]
    assert len(set(questions)) == len(questions)  # distinct, hence train/test disjoint

    again = make_arithmetic(str(tmp_path / "b"), n_train=300, n_test=50, digits=2, seed=1)
    assert read_jsonl(again["train"]) == train
    other = make_arithmetic(str(tmp_path / "c"), n_train=300, n_test=50, digits=2, seed=2)
    assert read_jsonl(other["train"]) != train


@pytest.mark.parametrize("op", ["-", "*"])
def test_arithmetic_other_ops(tmp_path, op):
    paths = make_arithmetic(str(tmp_path), n_train=40, n_test=10, digits=1, op=op)
    for row in read_jsonl(paths["train"]) + read_jsonl(paths["test"]):
        a, b = row["question"].rstrip("=").split(op)
        expected = int(a) - int(b) if op == "-" else int(a) * int(b)
        assert int(row["answer"]) == expected >= 0


def test_arithmetic_refuses_impossible_requests(tmp_path):
    with pytest.raises(ValueError, match="only 100 operand pairs"):
        make_arithmetic(str(tmp_path), n_train=90, n_test=20, digits=1)
    with pytest.raises(ValueError, match="op must be one of"):
        make_arithmetic(str(tmp_path), n_train=1, n_test=1, op="%")


def test_arithmetic_sft_avoids_excluded_questions(tmp_path):
    rl = make_arithmetic(str(tmp_path / "rl"), n_train=10, n_test=60, digits=1)
    test_questions = {r["question"] for r in read_jsonl(rl["test"])}
    # 100 one-digit pairs, 60 excluded: the 40 SFT rows must be exactly the rest.
    sft = make_arithmetic_sft(str(tmp_path / "sft"), n_train=40, digits=1, exclude=test_questions)
    rows = read_jsonl(sft["train"])
    assert set(rows[0]) == {"prompt", "response"}
    prompts = {r["prompt"] for r in rows}
    assert len(prompts) == 40 and not prompts & test_questions
    a, b = rows[0]["prompt"].rstrip("=").split("+")
    assert rows[0]["response"] == str(int(a) + int(b))


def test_countdown_instances_are_solvable_and_distinct(tmp_path):
    paths = make_countdown(str(tmp_path), n_train=80, n_test=20, seed=3)
    rows = read_jsonl(paths["train"]) + read_jsonl(paths["test"])
    assert len(rows) == 100
    keys = set()
    for row in rows:
        assert 3 <= len(row["nums"]) <= 4
        assert row["answer"] == str(row["target"])
        assert str(row["target"]) in row["question"] and str(row["nums"]) in row["question"]
        # the stored solution uses each number exactly once and hits the target
        tokens = row["solution"].replace("(", " ").replace(")", " ").split()
        assert sorted(int(tok) for tok in tokens if tok.isdigit()) == sorted(row["nums"])
        assert eval(row["solution"]) == row["target"]
        keys.add((tuple(sorted(row["nums"])), row["target"]))
    assert len(keys) == 100
    again = make_countdown(str(tmp_path / "again"), n_train=80, n_test=20, seed=3)
    assert read_jsonl(again["train"]) == rows[:80]


def test_files_load_with_datasets(tmp_path):
    make_arithmetic(str(tmp_path), n_train=20, n_test=5, digits=2)
    ds = load_dataset(str(tmp_path))
    assert ds["train"].num_rows == 20 and ds["test"].num_rows == 5
    assert ds["train"].column_names == ["question", "answer"]
    assert isinstance(ds["train"][0]["answer"], str)


def test_prepare_quickstart_builds_once(tmp_path):
    paths = prepare_quickstart(str(tmp_path), preset="micro", n_sft=50, n_train=40, n_test=10)
    assert os.path.isfile(os.path.join(paths["model_path"], "config.json"))
    test_q = {r["question"] for r in read_jsonl(os.path.join(paths["rl_path"], "test.jsonl"))}
    sft_q = {r["prompt"] for r in read_jsonl(os.path.join(paths["sft_path"], "train.jsonl"))}
    assert len(test_q) == 10 and len(sft_q) == 50 and not sft_q & test_q

    stamp = os.path.getmtime(os.path.join(paths["rl_path"], "train.jsonl"))
    weights = os.path.getmtime(os.path.join(paths["model_path"], "model.safetensors"))
    assert (
        prepare_quickstart(str(tmp_path), preset="micro", n_sft=50, n_train=40, n_test=10) == paths
    )
    assert os.path.getmtime(os.path.join(paths["rl_path"], "train.jsonl")) == stamp
    assert os.path.getmtime(os.path.join(paths["model_path"], "model.safetensors")) == weights
