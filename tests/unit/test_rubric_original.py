"""The original's rubric judges (``rubric_judge_workflow``, ``rubric_judge_openai_workflow``):
the prompts the judge gets, reading its ratings, ``judge_success``, and the checks before
start, with a stand-in policy and a judge whose replies are fixed strings."""

import logging
from types import SimpleNamespace

import pytest

from tests.unit.test_external_model import derived
from tests.unit.test_judges import Policy
from tests.unit.test_preflight import good
from trinity.common.config import ConfigError, FormatConfig, GenerationConfig
from trinity.common.workflows import JudgeReplyError, Task
from trinity.common.workflows.rubric_judge import (
    JUDGE_SYSTEM_PROMPT,
    NO_RUBRICS,
    POLICY_SYSTEM_PROMPT,
    parse_rating,
)
from trinity.engine.external import external_env
from trinity.preflight.before_start import check_before_start
from trinity.preflight.components import component_problems
from trinity.preflight.derive import derive
from trinity.runtime.explorer_role import external_engine

AUX = "explorer.auxiliary_models"
RUBRIC = [
    {"description": "Names the sum.", "weight": 0.7},
    {"description": "Is one number, no words.", "weight": 0.3},
]


class FixedJudge:
    """``openai.OpenAI`` as far as the workflow uses it: replies are ``replies`` in turn."""

    model_path = "judge-model"

    def __init__(self, *replies):
        self.replies, self.calls = list(replies), []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, model, messages, **kwargs):
        self.calls.append((model, messages, kwargs))
        message = SimpleNamespace(content=self.replies[len(self.calls) - 1])
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


def task(n, rubric=RUBRIC, workflow="rubric_judge_workflow", workflow_args=None, **format_args):
    row = {"question": "2+3=", "answer": "5"}
    if rubric is not None:
        row["rubric"] = rubric
    return Task(
        workflow=workflow,
        raw_task=row,
        format_args=FormatConfig(prompt_key="question", response_key="answer", **format_args),
        rollout_args=GenerationConfig(n=n, temperature=1.0, max_tokens=4),
        workflow_args=workflow_args or {},
        taskset_name="med",
        index=3,
    )


def judged(replies, answers=None, **kwargs):
    """(experiences, judge) of one task whose answers the judge rates with ``replies``."""
    judge, policy = FixedJudge(*replies), Policy(answers or ["5"] * len(replies))
    return task(len(replies), **kwargs).to_workflow(policy, [judge]).run(), judge


# ---- reading ratings ----------------------------------------------------------------------
def test_a_rating_after_prose_in_a_json_fence_is_read():
    reply = 'The answer is right but terse.\n```json\n{"rating": 7}\n```\nDone.'
    assert parse_rating(reply) == 7.0
    (exp,), _ = judged([reply])
    assert exp.reward == pytest.approx(0.7)  # 7 / 10
    assert exp.metrics == {"judge_success": 1.0}
    assert exp.info["judge_reply"] == reply


def test_a_plain_fence_is_read_when_there_is_no_json_fence():
    assert parse_rating('```\n{"rating": 4}\n```') == 4.0
    (exp,), _ = judged(['```{"rating": 10}```'])
    assert exp.reward == pytest.approx(1.0)


@pytest.mark.parametrize(
    "reply, why",
    [
        ('```json\n{"rating": 11}\n```', "score 11 is outside 1-10"),
        ('```json\n{"rating": "seven"}\n```', 'no number under "rating"'),
        ('{"rating": 7}', "no ``` fence"),
        ("```json\nrating: 7\n```", "the fence holds no JSON"),
        ('```json\n{"rating": 7}', "never closed"),
    ],
)
def test_an_unreadable_rating_scores_zero_and_counts_as_failed(reply, why):
    with pytest.raises(JudgeReplyError, match=why):
        parse_rating(reply)
    (exp,), _ = judged([reply])
    assert exp.reward == 0.0
    assert exp.metrics == {"judge_success": 0.0}
    assert why in exp.info["judge_error"]


def test_judge_success_is_the_share_of_the_tasks_ratings_read():
    replies = ['```json\n{"rating": 9}\n```', "I would say seven.", '```\n{"rating": 2}\n```']
    exps, judge = judged(replies, answers=["5", "6", "five"])
    assert len(judge.calls) == 3  # one call per answer
    assert [e.reward for e in exps] == pytest.approx([0.9, 0.0, 0.2])
    # 2 of the 3 replies parsed: the same 2/3 on every answer of the task
    assert [e.metrics["judge_success"] for e in exps] == pytest.approx([2 / 3] * 3)


# ---- what the judge and the policy are sent -----------------------------------------------
def test_the_judge_gets_the_prompt_the_answer_and_the_rubric_lines():
    (exp,), judge = judged(['```json\n{"rating": 6}\n```'], answers=["It is 5."])
    ((model, messages, kwargs),) = judge.calls
    assert model == "judge-model"
    assert kwargs == {"temperature": 0.0}  # greedy; no max_tokens: the server's limit
    system, user = messages
    assert system == {"role": "system", "content": JUDGE_SYSTEM_PROMPT}
    assert user["role"] == "user"
    assert "<prompt>\n2+3=\n</prompt>\n<response>\nIt is 5.\n</response>" in user["content"]
    assert (
        "<rubrics>\nRubric 0 (weight: 0.7): Names the sum.\n"
        "Rubric 1 (weight: 0.3): Is one number, no words.\n</rubrics>"
    ) in user["content"]


@pytest.mark.parametrize("rubric", [None, []])
def test_a_row_without_a_rubric_is_judged_on_the_no_rubric_line(rubric, caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.common.workflows.rubric_judge"):
        (exp,), judge = judged(['```json\n{"rating": 5}\n```'], rubric=rubric)
    user = judge.calls[0][1][1]["content"]
    assert f"<rubrics>\n{NO_RUBRICS}\n</rubrics>" in user
    assert "taskset 'med' row 3 has no rubric" in caplog.text
    assert exp.reward == pytest.approx(0.5)


def test_a_malformed_rubric_column_names_the_row():
    with pytest.raises(ValueError, match="taskset 'med' row 3: column 'rubric' must be a list"):
        judged(["x"], rubric=[{"description": "no weight"}])


def test_the_policy_gets_the_default_system_prompt_unless_the_task_has_one():
    judge, policy = FixedJudge("x"), Policy(["5"])
    task(1).to_workflow(policy, [judge]).run()
    assert policy.calls[0][0] == [
        {"role": "system", "content": POLICY_SYSTEM_PROMPT},
        {"role": "user", "content": "2+3="},
    ]
    policy = Policy(["5"])
    task(1, system_prompt="Be brief.").to_workflow(policy, [FixedJudge("x")]).run()
    assert policy.calls[0][0][0] == {"role": "system", "content": "Be brief."}


def test_the_openai_workflow_judges_alike_with_the_judge_it_is_given():
    # before start its API became explorer.auxiliary_models[0]: the judge it is handed
    args = {"judge_model_name": "gpt-judge", "judge_max_tokens": 64}
    exps, judge = judged(
        ['```json\n{"rating": 8}\n```', "no rating"],
        workflow="rubric_judge_openai_workflow",
        workflow_args=args,
    )
    assert [e.reward for e in exps] == pytest.approx([0.8, 0.0])
    assert [e.metrics["judge_success"] for e in exps] == [0.5, 0.5]
    assert judge.calls[0][2] == {"temperature": 0.0, "max_tokens": 64}


# ---- checks before start ------------------------------------------------------------------
def checked(tmp_path, model, data, workflow, extra=""):
    """The finalized stage of test_preflight's good config run by ``workflow``."""
    config = good(tmp_path, model, data, extra)
    config.buffer.explorer_input.default_workflow_type = workflow
    return check_before_start(config)


def test_the_judge_workflow_without_a_judge_is_refused_before_start(
    tmp_path, micro_model, arithmetic_data
):
    with pytest.raises(ConfigError) as info:
        checked(tmp_path, micro_model, arithmetic_data["rl"], "rubric_judge_workflow")
    assert info.value.problems == [
        "buffer.explorer_input.default_workflow_type = rubric_judge_workflow needs a judge: "
        "set explorer.auxiliary_models (the first one judges)"
    ]


# the taskset's own key, indented under it
API_ARGS = (
    "      workflow_args: {judge_model_name: gpt-judge, judge_api_base_url_env: TEST_JUDGE_URL}\n"
)


def test_the_openai_judge_is_an_external_auxiliary_model_checked_before_start(
    tmp_path, micro_model, arithmetic_data, monkeypatch
):
    data, workflow = arithmetic_data["rl"], "rubric_judge_openai_workflow"
    monkeypatch.delenv("TEST_JUDGE_URL", raising=False)
    with pytest.raises(ConfigError) as info:
        checked(tmp_path, micro_model, data, workflow, API_ARGS)
    assert info.value.problems == [
        f"{AUX}[0].external_model.base_url_env = TEST_JUDGE_URL: the environment variable "
        "TEST_JUDGE_URL is not set; export it to the API's base URL (e.g. http://host:8000/v1)"
    ]
    monkeypatch.setenv("TEST_JUDGE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    (stage,) = checked(tmp_path, micro_model, data, workflow, API_ARGS)
    (judge,) = stage.explorer.auxiliary_models
    assert judge.engine_type == "external" and judge.external_model.model_name == "gpt-judge"
    # the launcher hands the explorer the variables; the runner's client sends the name
    assert external_env(stage) == {"TEST_JUDGE_URL": "http://127.0.0.1:1/v1", "OPENAI_API_KEY": "k"}
    client = external_engine(stage, judge).openai_client()
    assert client.model_path == "gpt-judge" and str(client.base_url) == "http://127.0.0.1:1/v1/"
    # a run's saved config, which holds the derived judge, derives to the same judge
    again, problems = derive(stage)
    assert problems == []
    assert [aux.external_model for aux in again.explorer.auxiliary_models] == [judge.external_model]


OPENAI = ["buffer.explorer_input.default_workflow_type=rubric_judge_openai_workflow"]
TASKSET = "buffer.explorer_input.tasksets[0]"


def test_the_openai_judge_needs_its_model_name(tmp_path):
    config, problems = derived(tmp_path, OPENAI)
    assert problems == [] and config.explorer.auxiliary_models == []
    # the args check says what is missing; no "needs a judge" line: the args name the judge
    assert component_problems(config, construct=False) == [
        f"{TASKSET}.workflow_args.judge_model_name: required key is missing"
    ]


def test_the_openai_judge_is_one_api_and_the_only_auxiliary_model(tmp_path):
    args = "buffer.explorer_input.taskset.workflow_args"
    _, problems = derived(
        tmp_path, [*OPENAI, f"{args}={{judge_model_name: a}}", f"{AUX}=[{{model_path: j}}]"]
    )
    assert problems == [
        f"{AUX} is set, but buffer.explorer_input.default_workflow_type = "
        "rubric_judge_openai_workflow puts its judge (a at $OPENAI_BASE_URL, key "
        f"$OPENAI_API_KEY, from {TASKSET}.workflow_args) at {AUX}[0]; remove {AUX}"
    ]
    evals = "buffer.explorer_input.eval_tasksets"
    _, problems = derived(
        tmp_path,
        [
            *OPENAI,
            f"{args}={{judge_model_name: a}}",
            f"{evals}=[{{name: e, path: /d, workflow_args: {{judge_model_name: b}}}}]",
        ],
    )
    assert problems == [
        f"{evals}[0].workflow_args names the judge b at $OPENAI_BASE_URL, key $OPENAI_API_KEY "
        f"and {TASKSET} names a at $OPENAI_BASE_URL, key $OPENAI_API_KEY: a run has one API "
        f"judge ({AUX}[0]); name the same one"
    ]
