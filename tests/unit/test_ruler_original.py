"""The original Trinity-RFT's ``math_ruler_workflow``: the judge's ``[s1, ..., sn]`` list read,
clipped and given as rewards, the math reward kept as ``gold_reward``; the policy and the judge
are the stand-ins of tests/unit/test_judges.py."""

import textwrap

import pytest

from tests.unit.test_judges import Judge, Policy, task
from tests.unit.test_preflight import BASE
from trinity.common.config import load_config
from trinity.common.workflows import WORKFLOWS, MathRulerWorkflow
from trinity.common.workflows.math_ruler import THINK_ANSWER_PROMPT, parse_score_list
from trinity.preflight.components import component_problems
from trinity.preflight.derive import derive

ANSWERS = ["<think>2 and 3</think><answer>5</answer>", "<answer>4</answer>", "it is 7"]


class RecordingJudge(Judge):
    """The stand-in judge, keeping every conversation it was sent whole."""

    def __init__(self, reply):
        super().__init__(reply)
        self.conversations = []

    def _create(self, model, messages, **kwargs):
        self.conversations.append(messages)
        return super()._create(model, messages, **kwargs)


# ---- reading the judge's list ------------------------------------------------------------
def test_the_last_bracketed_list_counts_and_scores_are_clipped():
    reply = "Draft: [0.2, 0.4, 0.6]. On reflection the second is flawless.\n[0.9, 1.7, -0.2] done"
    assert parse_score_list(reply, 3) == [0.9, 1.0, 0.0]
    assert parse_score_list("[1, 0]", 2) == [1.0, 0.0]  # integers are scores too


@pytest.mark.parametrize(
    "reply",
    [
        "[0.5, 0.5]",  # two scores for three answers
        "[0.5, 0.5, 0.5, 0.5]",
        "no scores at all",
        "[0.5, 'good', 1]",
        "[0.5, True, 1]",
        "scores: [0.1, 0.2, 0.3",  # never closed
        "] then [",
        "[0.5; 0.5; 0.5]",
        "[__import__('os').getpid(), 0, 0]",  # read as a literal, never run
    ],
)
def test_a_reply_without_a_list_of_n_numbers_is_unread(reply):
    assert parse_score_list(reply, 3) is None


# ---- the workflow ------------------------------------------------------------------------
def test_the_judges_scores_are_the_rewards_and_the_math_reward_a_metric():
    reply = "The first is right; the others are not.\n[0.1, 0.2, 0.3]\nFinal: [0.9, 1.7, -0.2]"
    judge = RecordingJudge(lambda prompt: reply)
    policy = Policy(ANSWERS)
    exps = task("math_ruler_workflow", 3).to_workflow(policy, [judge]).run()
    assert [e.reward for e in exps] == [0.9, 1.0, 0.0]
    assert [e.metrics for e in exps] == [
        {"accuracy": 1.0, "gold_reward": 1.0, "judge_success": 1.0},
        {"accuracy": 0.0, "gold_reward": 0.0, "judge_success": 1.0},
        {"accuracy": 0.0, "gold_reward": 0.0, "judge_success": 1.0},
    ]
    assert all(e.info["judge_reply"] == reply for e in exps)
    # the policy was asked for the tags (no system prompt given, the default math reward)
    messages, kwargs = policy.calls[0]
    assert messages == [
        {"role": "system", "content": THINK_ANSWER_PROMPT},
        {"role": "user", "content": "2+3="},
    ]
    assert kwargs["n"] == 3
    # one call for the group: a system message, then the question and numbered candidates
    (conversation,) = judge.conversations
    system, user = conversation
    assert system["role"] == "system" and "3 candidate solutions" in system["content"]
    assert user["content"].startswith("Here are a question and several candidate solutions")
    assert "Question: 2+3=\n\n" in user["content"]
    assert "<think> </think>" in user["content"] and "<answer> </answer>" in user["content"]
    for k, answer in enumerate(ANSWERS, 1):
        assert f"Candidate solution {k}: {answer}" in user["content"]
    assert user["content"].endswith(
        "[score for solution 1, score for solution 2, ..., score for solution 3]"
    )
    # greedy, and no token limit sent: the judge may use the room left in its window
    assert judge.kwargs == [{"temperature": 0.0}]


@pytest.mark.parametrize("reply", ["[0.5, 0.5]", "I cannot decide.", "[0.5, 'x', 1]"])
def test_an_unread_list_scores_every_answer_zero_and_says_so(reply):
    judge = Judge(lambda prompt: reply)
    exps = task("math_ruler_workflow", 3).to_workflow(Policy(ANSWERS), [judge]).run()
    assert [e.reward for e in exps] == [0.0, 0.0, 0.0]
    assert [e.metrics["judge_success"] for e in exps] == [0.0, 0.0, 0.0]
    assert [e.metrics["gold_reward"] for e in exps] == [1.0, 0.0, 0.0]  # still watched


def test_a_given_system_prompt_or_reward_keeps_the_tags_prompt_out():
    given = task("math_ruler_workflow", 1)
    given.format_args.system_prompt = "Be brief."
    policy = Policy(["5"])
    given.to_workflow(policy, [Judge(lambda p: "[1]")]).run()
    assert policy.calls[0][0][0] == {"role": "system", "content": "Be brief."}
    other = task("math_ruler_workflow", 1)
    other.reward_fn = "accuracy_reward"
    policy = Policy(["5"])
    exps = other.to_workflow(policy, [Judge(lambda p: "[0.25]")]).run()
    assert policy.calls[0][0] == [{"role": "user", "content": "2+3="}]
    assert exps[0].reward == 0.25 and exps[0].metrics["gold_reward"] == 1.0


def test_the_judges_token_limit_comes_from_the_config():
    judge = Judge(lambda prompt: "[1]")
    sized = task("math_ruler_workflow", 1, judge_max_tokens=512, judge_temperature=0.7)
    sized.to_workflow(Policy(["5"]), [judge]).run()
    assert judge.kwargs == [{"temperature": 0.7, "max_tokens": 512}]


def test_the_async_name_is_the_same_workflow():
    assert WORKFLOWS.get("async_math_ruler_workflow") is MathRulerWorkflow
    assert WORKFLOWS.get("math_ruler_workflow") is MathRulerWorkflow


def test_without_a_judge_it_is_refused_before_start_naming_the_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(BASE) + "    default_workflow_type: math_ruler_workflow\n")
    config, _ = derive(load_config(str(path), []))
    assert component_problems(config, construct=False) == [
        "buffer.explorer_input.default_workflow_type = math_ruler_workflow needs a judge: set "
        "explorer.auxiliary_models (the first one judges)"
    ]
    with pytest.raises(ValueError, match="MathRulerWorkflow needs a judge"):
        task("math_ruler_workflow", 2).to_workflow(Policy(ANSWERS), None)
