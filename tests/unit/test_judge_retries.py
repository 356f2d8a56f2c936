"""A judge reply that cannot be read fails the task's attempt and the runner retries it: the
real ``WorkflowRunner``, the micro model answering, a judge served over HTTP (scripted replies)
reached through ``openai.OpenAI`` as workflows reach auxiliary models."""

from typing import List

import pytest

from tests.unit.test_judges import task
from tests.unit.test_openai_server import served_by
from trinity.common.experience import Experience
from trinity.engine.transformers_model import TransformersInferenceModel
from trinity.explorer.runner import WorkflowRunner


class Replies:
    """A judge engine that replies with the next of ``texts``, one per call."""

    def __init__(self, texts: List[str]) -> None:
        self.texts = list(texts)

    async def generate_ids(self, prompt_ids, params) -> list:
        text = self.texts.pop(0)
        return [
            Experience(
                tokens=prompt_ids + [5],
                prompt_length=len(prompt_ids),
                logprobs=[-0.5],
                response_text=text,
                info={"finish_reason": "stop"},
            )
        ]


def judge_result(policy, replies: List[str], n: int):
    """The runner's result of a RULER task of ``n`` answers whose judge replies ``replies``
    in turn (one attempt each; one retry allowed)."""
    judge = served_by(Replies(replies))
    try:
        runner = WorkflowRunner(policy, {"max_tokens": 4}, 1, auxiliary_engines=[judge])
        return runner.run_task(task("ruler_workflow", n))
    finally:
        judge.close()


@pytest.fixture(scope="module")
def policy(micro_model):
    return TransformersInferenceModel(
        model_path=micro_model, max_model_len=64, max_prompt_tokens=48, max_response_tokens=4
    )


def test_an_unreadable_verdict_is_retried_then_scored(policy):
    result = judge_result(policy, ["I think they are all fine.", "1: 2\n2: 6\n3: 10"], 3)
    assert result.error is None and result.attempts == 2
    assert [e.reward for e in result.experiences] == [0.0, 0.5, 1.0]


def test_a_verdict_never_readable_fails_the_task_without_rewards(policy):
    result = judge_result(policy, ["no", "still no"], 2)
    assert result.attempts == 2 and result.experiences == []
    assert "JudgeReplyError: taskset 'arith' row 7: the judge's reply cannot be read" in (
        result.error
    )
