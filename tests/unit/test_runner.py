"""WorkflowRunner stamps each task's experiences with the weights that sampled them."""

import asyncio

import pytest

from trinity.common.experience import Experience
from trinity.common.workflows import Task, Workflow
from trinity.engine.transformers_model import TransformersInferenceModel
from trinity.explorer.runner import WorkflowRunner


@pytest.fixture()
def engine(micro_model):
    return TransformersInferenceModel(
        model_path=micro_model, max_model_len=64, max_prompt_tokens=48, max_response_tokens=4
    )


def _load(engine, version: int) -> None:
    asyncio.run(engine.load_weights(engine.engine.model.state_dict(), version))


class TwoTurns(Workflow):
    """Asks twice; new weights (version 7) arrive between the two replies."""

    def run(self):
        first = self.model.chat([{"role": "user", "content": "1+1="}], n=2)
        _load(self.model.engine, 7)
        second = self.model.chat([{"role": "user", "content": "2+2="}], n=2)
        return first + second


class NoModelCall(Workflow):
    def run(self):
        return [Experience(tokens=[1, 2, 3], prompt_length=1, reward=1.0)]


def test_experiences_carry_the_oldest_version_that_sampled_the_task(engine):
    _load(engine, 5)
    runner = WorkflowRunner(engine, default_params={"max_tokens": 4})
    result = runner.run_task(Task(workflow=TwoTurns, task_id="t"))
    assert result.error is None
    assert [e.model_version for e in result.experiences] == [5, 5, 5, 5]
    assert {e.group_id for e in result.experiences} == {"t"}


def test_a_workflow_without_model_calls_gets_the_engine_version(engine):
    _load(engine, 3)
    runner = WorkflowRunner(engine, default_params={})
    result = runner.run_task(Task(workflow=NoModelCall, task_id="t"))
    assert [e.model_version for e in result.experiences] == [3]


def test_replies_are_stamped_by_the_engine(engine):
    _load(engine, 2)
    runner = WorkflowRunner(engine, default_params={"max_tokens": 4})
    exps = runner.model.chat([{"role": "user", "content": "1+1="}], n=2)
    assert [e.model_version for e in exps] == [2, 2]


class TwoGroups(Workflow):
    """Answers, and a judgment of them in a group of its own (``group_id`` a suffix)."""

    def run(self):
        answers = [Experience(tokens=[1, 2, 3], prompt_length=1, reward=1.0) for _ in range(2)]
        judged = Experience(tokens=[4, 5, 6], prompt_length=1, reward=0.5, group_id="/judge")
        return answers + [judged]


def test_a_workflows_group_id_follows_the_tasks(engine):
    runner = WorkflowRunner(engine, default_params={})
    result = runner.run_task(Task(workflow=TwoGroups, task_id="train-1-gsm8k-3"))
    assert [e.group_id for e in result.experiences] == [
        "train-1-gsm8k-3",
        "train-1-gsm8k-3",
        "train-1-gsm8k-3/judge",
    ]
