"""reasoning-gym tasksets: rows as reasoning-gym draws them, its own scoring, bad input named."""

import importlib.util
import json
import textwrap
from random import Random

import pytest

from tests.unit.test_preflight import BASE
from trinity.buffer.file_reader import load_rows
from trinity.buffer.storages import storage_kind
from trinity.common.config import load_config
from trinity.common.config.schema_buffer import ReasoningGymConfig, StorageConfig
from trinity.common.reasoning_gym import ReasoningGymError, extract, generate_rows, score
from trinity.common.rewards import REWARD_FUNCTIONS
from trinity.common.workflows import WORKFLOWS, Task
from trinity.common.workflows.workflow import missing_packages
from trinity.preflight.derive import derive

rg = pytest.importorskip("reasoning_gym")

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def spec(datasets, size=20, seed=42):
    return ReasoningGymConfig(datasets=datasets, size=size, seed=seed)


def rows_of(datasets, size=20, seed=42):
    return generate_rows(spec(datasets, size, seed), "t.reasoning_gym", "prompt", "response")


# ---- rows ----------------------------------------------------------------------------------
def test_one_dataset_is_reasoning_gyms_create_dataset_with_the_seed_and_size():
    rows = rows_of({"basic_arithmetic": {"config": SMALL}}, size=10, seed=7)
    own = rg.create_dataset("basic_arithmetic", seed=7, size=10, **SMALL)
    assert [(r["prompt"], r["response"]) for r in rows] == [
        (e["question"], e["answer"]) for e in own
    ]
    column = rows[3]["reasoning_gym"]
    assert column["dataset"] == "basic_arithmetic" and column["index"] == 3
    assert json.loads(column["config"]) == {**SMALL, "seed": 7, "size": 10}
    assert json.loads(column["metadata"])["expression"] == own[3]["metadata"]["expression"]


def test_rows_are_the_same_for_a_seed_and_differ_for_another():
    datasets = {"basic_arithmetic": {"config": SMALL}, "chain_sum": {}}
    assert rows_of(datasets, seed=5) == rows_of(datasets, seed=5)
    questions = [r["prompt"] for r in rows_of(datasets, seed=5)]
    assert questions != [r["prompt"] for r in rows_of(datasets, seed=5000)]


def test_a_mix_is_reasoning_gyms_composite_drawn_by_weight():
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    weights = {"basic_arithmetic": 3.0, "chain_sum": 1.0}
    rows = rows_of({n: {"weight": w} for n, w in weights.items()}, size=40, seed=11)
    specs = [DatasetSpec(n, w, {}) for n, w in weights.items()]
    own = CompositeDataset(CompositeConfig(size=40, seed=11, datasets=specs))
    assert [r["prompt"] for r in rows] == [own[i]["question"] for i in range(40)]
    # Row i's dataset is the weights' draw from Random(seed + i).
    drawn = [Random(11 + i).choices(list(weights), list(weights.values()))[0] for i in range(40)]
    assert [r["reasoning_gym"]["dataset"] for r in rows] == drawn
    # Each dataset draws from its own seed: the mix's + its position + 1.
    seeds = {
        r["reasoning_gym"]["dataset"]: json.loads(r["reasoning_gym"]["config"])["seed"]
        for r in rows
    }
    assert seeds == {"basic_arithmetic": 12, "chain_sum": 13}


def test_the_storage_writes_under_the_tasksets_format_keys():
    storage = StorageConfig(
        name="rg",
        storage_type="reasoning_gym",
        format={"prompt_key": "question", "response_key": "answer"},
        reasoning_gym={"datasets": {"chain_sum": {}}, "size": 4, "seed": 1},
    )
    loaded = load_rows(storage, columns={"question": "text"}, path_label="tasksets[0]")
    assert len(loaded) == 4 and {"question", "answer", "reasoning_gym"} <= set(loaded.column_names)
    assert (
        storage_kind(storage).where(storage) == "reasoning-gym datasets chain_sum (seed 1, size 4)"
    )


# ---- scoring -------------------------------------------------------------------------------
def test_the_answer_is_the_last_answer_tag_stripped():
    assert extract("think <answer>1</answer> again <answer> 12 </answer>") == "12"
    assert extract("12") is None


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("<answer>{truth}</answer>", 1.0),
        ("Step by step... <answer> {truth} </answer>", 1.0),
        ("<answer>wrong</answer><answer>{truth}</answer>", 1.0),
        ("{truth}", 0.0),  # no tag: reasoning-gym scores None as 0
        ("<answer>x={truth}</answer>", "partial"),  # oracle inside: len(oracle) / len(answer)
    ],
)
def test_score_is_the_datasets_score_answer_of_the_tagged_answer(reply, expected):
    (row,) = rows_of({"basic_arithmetic": {"config": SMALL}}, size=1, seed=3)
    truth = row["response"]
    reply = reply.format(truth=truth)
    if expected == "partial":
        expected = len(truth) / len(f"x={truth}")
    assert score(reply, row["reasoning_gym"]) == pytest.approx(expected)
    own = rg.create_dataset("basic_arithmetic", seed=3, size=1, **SMALL)
    assert score(reply, row["reasoning_gym"]) == own.score_answer(extract(reply), own[0])


def test_chain_sum_scores_as_its_decimal_rule():
    (row,) = rows_of({"chain_sum": {}}, size=1, seed=2)
    truth = row["response"]
    assert score(f"<answer>+0{truth}.00</answer>", row["reasoning_gym"]) == 1.0


def test_an_entry_of_tuples_scores_its_own_answer_1():
    # arc_agi's grids are tuples; an entry read back from JSON would score its answer 0.05.
    (row,) = rows_of({"arc_agi": {}}, size=1, seed=4)
    assert score(f"<answer>{row['response']}</answer>", row["reasoning_gym"]) == 1.0


def test_a_score_answer_that_raises_on_an_answer_scores_it_0():
    (row,) = rows_of({"prime_factorization": {}}, size=1, seed=1)
    assert score("<answer>no idea</answer>", row["reasoning_gym"]) == 0.0
    assert score(f"<answer>{row['response']}</answer>", row["reasoning_gym"]) == 1.0


def test_the_reward_is_one_accuracy_component_and_needs_reasoning_gym_rows():
    (row,) = rows_of({"basic_arithmetic": {"config": SMALL}}, size=1)
    reward = REWARD_FUNCTIONS.get("reasoning_gym_reward")()
    assert reward(f"<answer>{row['response']}</answer>", raw_task=row) == {"accuracy": 1.0}
    with pytest.raises(ValueError, match="storage_type: reasoning_gym taskset"):
        reward("<answer>1</answer>", raw_task={"prompt": "1+0"})


# ---- the workflow --------------------------------------------------------------------------
def test_the_prompt_is_reasoning_gyms_system_prompt_and_the_question():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    (row,) = rows_of({"basic_arithmetic": {"config": SMALL}}, size=1)
    workflow = WORKFLOWS.get("reasoning_gym_workflow")(model=None, task=Task(raw_task=row))
    assert workflow.messages == [
        {"role": "system", "content": SYSTEM_PROMPTS["default"]},
        {"role": "user", "content": row["prompt"]},
    ]
    task = Task(raw_task=row, workflow_args={"system_prompt": "direct"})
    assert workflow_of(task).messages[0]["content"] == SYSTEM_PROMPTS["direct"]
    with pytest.raises(ValueError, match="no system prompt 'Direct'; did you mean 'direct'"):
        workflow_of(Task(raw_task=row, workflow_args={"system_prompt": "Direct"}))


def workflow_of(task):
    return WORKFLOWS.get("reasoning_gym_workflow")(model=None, task=task)


# ---- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "datasets, message",
    [
        (
            {"basic_arithmetc": {}},
            "t.reasoning_gym.datasets.basic_arithmetc: reasoning-gym has "
            "no dataset 'basic_arithmetc' (closest: basic_arithmetic",
        ),
        ({"composite": {}}, "a mix is several names under reasoning_gym.datasets"),
        (
            {"basic_arithmetic": {"config": {"min_digit": 1}}},
            "t.reasoning_gym.datasets.basic_arithmetic.config.min_digit: basic_arithmetic's "
            "config (BasicArithmeticDatasetConfig) has no field 'min_digit'; did you mean "
            "'min_digits'?",
        ),
        (
            {"basic_arithmetic": {"config": {"min_digits": 3, "max_digits": 2}}},
            "t.reasoning_gym.datasets.basic_arithmetic.config: basic_arithmetic rejects "
            "{'min_digits': 3, 'max_digits': 2}: max_digits must be >= min_digits",
        ),
        (
            {"chain_sum": {"config": {"seed": 1}}},
            "t.reasoning_gym.datasets.chain_sum.config.seed: the seed is the taskset's",
        ),
        ({}, "t.reasoning_gym.datasets is empty"),
    ],
)
def test_what_reasoning_gym_cannot_build_is_named_by_its_key(datasets, message):
    with pytest.raises(ReasoningGymError) as excinfo:
        rows_of(datasets)
    assert message in str(excinfo.value)


def without_reasoning_gym(monkeypatch):
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "reasoning_gym" else found(name),
    )


def test_without_the_package_the_storage_and_workflow_name_the_extra(monkeypatch):
    without_reasoning_gym(monkeypatch)
    storage = StorageConfig(
        name="rg", storage_type="reasoning_gym", reasoning_gym={"datasets": {"chain_sum": {}}}
    )
    with pytest.raises(ValueError) as excinfo:
        load_rows(storage, columns={}, path_label="buffer.explorer_input.tasksets[0]")
    assert str(excinfo.value) == (
        "buffer.explorer_input.tasksets[0].reasoning_gym: storage_type reasoning_gym needs the "
        'reasoning_gym package, which is not installed: pip install -e ".[reasoning_gym]"'
    )
    assert missing_packages(WORKFLOWS.get("reasoning_gym_workflow")) == [
        'needs the reasoning_gym package, which is not installed: pip install -e ".[reasoning_gym]"'
    ]


# ---- before start --------------------------------------------------------------------------
TASKSETS = """
    default_workflow_type: reasoning_gym_workflow
    taskset:
      name: rg_train
      storage_type: reasoning_gym
      reasoning_gym:
        datasets: {{basic_arithmetic: {{config: {{max_digits: 1}}}}, chain_sum: {{}}}}
        size: 100
        seed: 42
    eval_tasksets:
      - name: rg_test
        storage_type: reasoning_gym
        reasoning_gym: {{datasets: {{chain_sum: {{config: {config}}}}}, size: 10, seed: {seed}}}
"""


def problems(tmp_path, tasksets: str) -> list:
    path = tmp_path / "c.yaml"
    base = textwrap.dedent(BASE).replace("    taskset: {name: t, path: /d}\n", "")
    path.write_text(base + textwrap.indent(textwrap.dedent(tasksets), "    "))
    _, found = derive(load_config(str(path)))
    return found


def test_a_held_out_seed_whose_rows_a_taskset_draws_is_refused_with_the_seed_to_set(tmp_path):
    # chain_sum draws the training rows from seeds 44..143 (the mix's 42 + position 1 + 1).
    assert problems(tmp_path, TASKSETS.format(seed=100, config="{}")) == [
        "buffer.explorer_input.eval_tasksets[0].reasoning_gym.seed = 100 draws rows the "
        "training tasksets draw too (chain_sum with buffer.explorer_input.tasksets[0]: the "
        "same dataset and config, and row i comes from Random(seed + i)), so it does not hold "
        "them out; set it to 144 or more"
    ]
    assert problems(tmp_path, TASKSETS.format(seed=144, config="{}")) == []
    assert (
        problems(tmp_path, TASKSETS.format(seed=30, config="{}")) == []
    )  # 30..39: below the training's
    other = TASKSETS.format(seed=100, config="{max_terms: 3}")
    assert problems(tmp_path, other) == []  # another config draws other rows


def test_the_key_of_another_storage_type_and_the_reward_on_file_rows_are_refused(tmp_path):
    found = problems(
        tmp_path,
        """
        default_workflow_type: reasoning_gym_workflow
        taskset:
          name: t
          path: /d
          reasoning_gym: {datasets: {chain_sum: {}}}
        """,
    )
    assert found == [
        "buffer.explorer_input.tasksets[0].reasoning_gym is read only with storage_type "
        "reasoning_gym (buffer.explorer_input.tasksets[0].storage_type is file): set it, or "
        "remove reasoning_gym",
        "buffer.explorer_input.default_workflow_type = reasoning_gym_workflow scores the rows "
        "of a storage_type: reasoning_gym taskset, and buffer.explorer_input.tasksets[0]"
        ".storage_type is file: generate the tasks with reasoning_gym, or name another reward "
        "(default_reward_fn_type)",
    ]
