"""The original Trinity-RFT's ``math_ruler_workflow``: the judge's ``[s1, ..., sn]`` list read,
clipped and given as rewards, the math reward kept as ``gold_reward``; and its
``math_trainable_ruler_workflow``, the policy judging its own answers. The policy and the judge
are the stand-ins of tests/unit/test_judges.py."""

import random
import textwrap

import pytest

from tests.unit.test_judges import Judge, Policy, task
from tests.unit.test_preflight import BASE
from trinity.common.config import load_config
from trinity.common.experience import Experience
from trinity.common.workflows import WORKFLOWS, MathRulerWorkflow, MathTrainableRulerWorkflow
from trinity.common.workflows.math_ruler import (
    THINK_ANSWER_PROMPT,
    judge_prompts,
    parse_score_list,
)
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


# ---- math_trainable_ruler_workflow: the policy judges itself -----------------------------
class SelfJudgingPolicy(Policy):
    """The stand-in policy, answering the judge prompt with ``judgments`` and anything else
    with the answers; it keeps what each call returned."""

    def __init__(self, answers, judgments):
        super().__init__(answers)
        self.judgments, self.returned = judgments, []

    def chat(self, messages, **kwargs):
        judging = messages[0]["content"].startswith("You are an impartial judge")
        texts = self.judgments if judging else self.answers
        self.calls.append((messages, kwargs))
        made = [
            Experience(tokens=[1, 2, 3], prompt_length=2, response_text=text, logprobs=[-0.5])
            for text in texts[: kwargs["n"]]
        ]
        self.returned.append(made)
        return made


def trainable(n, probability, task_id="train-1-arith-7"):
    made = task("math_trainable_ruler_workflow", n, ground_truth_probability=probability)
    made.task_id = task_id
    return made


def test_with_the_ground_truth_the_answers_earn_gold_and_the_judgments_are_trained():
    # gold [1, 0, 0] scaled by (g + 0.1) / 1.2: [11/12, 1/12, 1/12]
    judgments = ["Only the first is right.\n[1, 0, 0]", "[0, 1, 1]", "I cannot tell."]
    policy = SelfJudgingPolicy(ANSWERS, judgments)
    exps = trainable(3, 1.0).to_workflow(policy, None).run()  # no auxiliary model
    answers, replies = exps[:3], exps[3:]
    assert [e.reward for e in answers] == [1.0, 0.0, 0.0]
    assert [e.metrics["gold_reward"] for e in answers] == [1.0, 0.0, 0.0]
    # 1 - mean(|1 - 11/12|, |0 - 1/12|, |0 - 1/12|) = 11/12; 1 - mean(11/12 * 3) = 1/12; unread 0
    assert [e.reward for e in replies] == pytest.approx([11 / 12, 1 / 12, 0.0])
    assert [e.metrics["reward_for_judge"] for e in replies] == [e.reward for e in replies]
    assert [e.metrics["judge_success"] for e in exps] == pytest.approx([2 / 3] * 6)
    # the judgments are a group of their own; the runner puts the task's id in front
    assert [e.group_id for e in exps] == ["", "", "", "/judge", "/judge", "/judge"]
    # what the policy judged with: the judge prompt, the task's rollout args, n of them
    (answering, _), (judging, kwargs) = policy.calls
    system, user = judge_prompts("2+3=", ANSWERS)
    assert judging == [{"role": "system", "content": system}, {"role": "user", "content": user}]
    assert (kwargs["n"], kwargs["temperature"], kwargs["max_tokens"]) == (3, 1.0, 4)
    assert answering == policy.calls[0][0] and answering[-1]["content"] == "2+3="
    # trained on as the engine made them: the same experiences, tokens and logprobs untouched
    assert all(a is b for a, b in zip(replies, policy.returned[1], strict=True))
    assert all(e.tokens.tolist() == [1, 2, 3] and e.logprobs.tolist() == [-0.5] for e in replies)


def test_without_the_ground_truth_the_policys_one_judgment_is_the_reward():
    policy = SelfJudgingPolicy(ANSWERS, ["The first.\n[0.8, 1.7, -0.2]"])
    exps = trainable(3, 0.0).to_workflow(policy, None).run()
    assert len(exps) == 3  # the answers only: the judgment is not trained on
    assert [e.reward for e in exps] == [0.8, 1.0, 0.0]  # its scores, clipped to [0, 1]
    assert [e.metrics["judge_success"] for e in exps] == [1.0, 1.0, 1.0]
    assert [e.metrics["gold_reward"] for e in exps] == [1.0, 0.0, 0.0]  # watched only
    assert all(e.group_id == "" for e in exps)
    assert policy.calls[1][1]["n"] == 1  # judged once


@pytest.mark.parametrize("reply", ["[0.5, 0.5]", "no list", "[0.5, 'x', 1]"])
def test_an_unread_self_judgment_gives_zeros_and_counts_as_failed(reply):
    exps = trainable(3, 0.0).to_workflow(SelfJudgingPolicy(ANSWERS, [reply]), None).run()
    assert [e.reward for e in exps] == [0.0, 0.0, 0.0]
    assert [e.metrics["judge_success"] for e in exps] == [0.0, 0.0, 0.0]


def test_the_coin_is_drawn_from_the_task_id():
    def available(task_id, probability=0.5):
        policy = SelfJudgingPolicy(ANSWERS[:2], ["[1, 0]", "[1, 0]"])
        return len(trainable(2, probability, task_id).to_workflow(policy, None).run()) == 4

    ids = [f"train-{step}-arith-7" for step in range(40)]
    draws = [available(i) for i in ids]
    assert draws == [available(i) for i in ids]  # the same task, the same coin
    assert 0 < sum(draws) < len(ids)  # a row draws anew at each step
    expected = [random.Random(i).random() < 0.2 for i in ids]
    assert [available(i, 0.2) for i in ids] == expected and any(expected)
    # outside an explorer (no task id) the taskset and row seed it
    no_id = trainable(2, 0.5, task_id="").to_workflow(Policy(ANSWERS[:2]), None)
    assert no_id.ground_truth_available() == (random.Random("arith-7").random() < 0.5)


def test_the_trainable_workflow_needs_no_judge_and_checks_its_probability(tmp_path):
    assert WORKFLOWS.get("math_trainable_ruler_workflow") is MathTrainableRulerWorkflow
    path = tmp_path / "c.yaml"
    path.write_text(
        textwrap.dedent(BASE) + "    default_workflow_type: math_trainable_ruler_workflow\n"
    )
    config, _ = derive(load_config(str(path), []))
    assert component_problems(config, construct=False) == []  # no auxiliary_models
    key = "buffer.explorer_input.taskset.workflow_args.ground_truth_probability"
    config, _ = derive(load_config(str(path), [f"{key}=1.5"]))
    assert component_problems(config, construct=False) == [
        "buffer.explorer_input.tasksets[0].workflow_args.ground_truth_probability = 1.5 must "
        "be <= 1.0"
    ]
