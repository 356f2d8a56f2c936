"""RULER and rubric judges: reading replies, normalising scores, the workflows with stand-ins.

The policy and the judge are stand-ins here (the judge an object with ``openai.OpenAI``'s
``chat.completions.create``); tests/unit/test_judge_retries.py runs the real runner and a
judge served over HTTP.
"""

import json
import os
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from trinity.cli.main import app
from trinity.common.config import FormatConfig, GenerationConfig
from trinity.common.config.base import ConfigError, validate_model
from trinity.common.experience import Experience
from trinity.common.workflows import JudgeReplyError, Task
from trinity.common.workflows.judging import (
    check_template,
    normalise_group,
    parse_ruler_scores,
    parse_score,
)
from trinity.common.workflows.rubric import RubricArgs, rubric_reward

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "judges")


# ---- reading replies ----------------------------------------------------------------------
def test_ruler_reply_one_line_per_answer():
    assert parse_ruler_scores("1: 7\n2: 3.5\n3: 10", 3, 10) == [7.0, 3.5, 10.0]
    # explanations on other lines are skipped; "answer k", "#k" and "=" are read too
    reply = "Scores:\nAnswer 2: 4\n#1 = 9\nthe third is wrong\n3: 0"
    assert parse_ruler_scores(reply, 3, 10) == [9.0, 4.0, 0.0]


@pytest.mark.parametrize(
    "reply, n, words",
    [
        ("1: 7\n3: 2", 3, "no 'k: score' line for answer 2 of 3"),
        ("1: 7\n1: 8\n2: 1", 2, "answer 1 is scored twice"),
        ("1: 7\n2: 3\n3: 1", 2, "answer 3 is scored but there are 2 answers"),
        ("1: 11\n2: 3", 2, "score 11 is outside 0-10"),
        ("k2#:x 1 9}", 2, "no 'k: score' line for answer 1"),
        ("", 1, "no 'k: score' line for answer 1 of 1"),
    ],
)
def test_ruler_replies_that_are_not_scores(reply, n, words):
    with pytest.raises(JudgeReplyError, match=words):
        parse_ruler_scores(reply, n, 10)


def test_a_rubric_reply_is_a_score_alone():
    assert parse_score("7", 10) == 7.0
    assert parse_score(" 7.5\n", 10) == 7.5
    assert parse_score("7/10", 10) == 7.0
    assert parse_score("7.", 10) == 7.0
    for reply in ("seven", "7 because it is right", "1. The answer", "", "12"):
        with pytest.raises(JudgeReplyError):
            parse_score(reply, 10)


# ---- normalisation and weights -----------------------------------------------------------
def test_scores_are_scaled_within_the_group():
    # min 2, max 10: (s - 2) / 8
    assert normalise_group([2.0, 6.0, 10.0, 4.0]) == [0.0, 0.5, 1.0, 0.25]
    # no answer better than another: the midpoint for all
    assert normalise_group([3.0, 3.0, 3.0]) == [0.5, 0.5, 0.5]
    assert normalise_group([9.0]) == [0.5]


def test_the_rubric_reward_is_the_weighted_sum_of_scaled_scores():
    args = validate_model(
        RubricArgs,
        {
            "rubric": [
                {"name": "correct", "description": "equals the reference", "weight": 0.8},
                {"name": "number", "description": "is a whole number", "weight": 0.2},
            ]
        },
    )
    # 0.8 * 10/10 + 0.2 * 5/10 = 0.9
    assert rubric_reward({"correct": 10.0, "number": 5.0}, args.rubric, 10.0) == pytest.approx(0.9)
    assert rubric_reward({"correct": 0.0, "number": 10.0}, args.rubric, 10.0) == pytest.approx(0.2)


def test_template_placeholders_are_checked():
    assert check_template("{answer} {{literal}}", ("answer",), ("answer",))
    with pytest.raises(ValueError, match=r"unknown placeholder \{anwser\}; it may use answer"):
        check_template("{anwser}", ("answer",), ())
    with pytest.raises(ValueError, match=r"needs the placeholder \{answers\}"):
        check_template("{question}", ("question", "answers"), ("answers",))
    with pytest.raises(ValueError, match="not a format string"):
        check_template("{answer", ("answer",), ())


def test_rubric_args_name_the_key_at_fault():
    with pytest.raises(ConfigError) as caught:
        validate_model(
            RubricArgs,
            {
                "rubric": [
                    {"name": "a", "description": "x"},
                    {"name": "a", "description": "y", "weight": -1},
                ],
                "judge_prompt": "{answer}",
            },
            "buffer.explorer_input.tasksets[0].workflow_args",
        )
    problems = "\n".join(caught.value.problems)
    assert "workflow_args.rubric[1].weight = -1" in problems
    assert "workflow_args.judge_prompt: needs the placeholder {criterion}" in problems
    with pytest.raises(ConfigError, match="rubric: .*at least 1"):
        validate_model(RubricArgs, {"rubric": []})
    with pytest.raises(ConfigError, match="criterion name 'a' is used twice"):
        validate_model(RubricArgs, {"rubric": [{"name": "a", "description": "x"}] * 2})


# ---- the workflows -------------------------------------------------------------------------
class Policy:
    """What a workflow sees of ``ModelWrapper``: ``chat`` gives the scripted answers."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def chat(self, messages, **kwargs):
        self.calls.append((messages, kwargs))
        return [
            Experience(tokens=[1, 2, 3], prompt_length=2, response_text=text)
            for text in self.answers[: kwargs["n"]]
        ]


class Judge:
    """``openai.OpenAI`` as far as the judges use it; ``reply(prompt)`` answers."""

    model_path = "judge-model"

    def __init__(self, reply):
        self.reply, self.prompts, self.kwargs = reply, [], []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, model, messages, **kwargs):
        assert model == self.model_path
        self.prompts.append(messages[-1]["content"])
        self.kwargs.append(kwargs)
        message = SimpleNamespace(content=self.reply(messages[-1]["content"]))
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


def task(workflow, n, **workflow_args):
    return Task(
        workflow=workflow,
        raw_task={"question": "2+3=", "answer": "5"},
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        rollout_args=GenerationConfig(n=n, temperature=1.0, max_tokens=4),
        workflow_args=workflow_args,
        taskset_name="arith",
        index=7,
    )


def test_ruler_scores_the_group_in_one_call():
    judge = Judge(lambda prompt: "1: 10\n2: 2\n3: 6")
    policy = Policy(["5", "9", "6"])
    exps = task("ruler_workflow", 3).to_workflow(policy, [judge]).run()
    (prompt,) = judge.prompts  # one call for the whole group
    assert prompt == (
        "Several answers to one question follow. Compare them and score each from 0 to 10: a "
        "better answer gets a higher score.\nQuestion: 2+3=\nAnswers:\n1) 5\n2) 9\n3) 6\n"
        "Reply with one line per answer, number: score (e.g. 1: 7)."
    )
    assert judge.kwargs[0] == {"temperature": 0.0, "max_tokens": 64}
    # min 2, max 10: (10-2)/8, (2-2)/8, (6-2)/8
    assert [e.reward for e in exps] == [1.0, 0.0, 0.5]
    assert [e.metrics["judge_score"] for e in exps] == [1.0, 0.2, 0.6]
    assert all(e.info["judge_reply"] == "1: 10\n2: 2\n3: 6" for e in exps)


def test_ruler_prompt_template_comes_from_the_config():
    judge = Judge(lambda prompt: "1: 1\n2: 1")
    template = "Q={question} R={reference} n={n} top={max_score}\n{answers}"
    args = {"judge_prompt": template, "max_score": 1, "judge_max_tokens": 9}
    exps = task("ruler_workflow", 2, **args).to_workflow(Policy(["a", "b"]), [judge]).run()
    assert judge.prompts == ["Q=2+3= R=5 n=2 top=1\n1) a\n2) b"]
    assert judge.kwargs[0]["max_tokens"] == 9
    assert [e.reward for e in exps] == [0.5, 0.5]  # a tie


def test_an_unreadable_verdict_fails_the_task_and_scores_nothing():
    judge = Judge(lambda prompt: "1: 9\nI cannot judge the second one")
    workflow = task("ruler_workflow", 2).to_workflow(Policy(["5", "7"]), [judge])
    with pytest.raises(JudgeReplyError, match=r"taskset 'arith' row 7: .*answer 2.*retried"):
        workflow.run()
    rubric = [{"name": "correct", "description": "equals the reference"}]
    workflow = task("rubric_workflow", 1, rubric=rubric).to_workflow(
        Policy(["5"]), [Judge(lambda p: "yes")]
    )
    with pytest.raises(JudgeReplyError, match="expected a score only, got 'yes'"):
        workflow.run()


def test_rubric_asks_once_per_answer_and_criterion():
    rubric = [
        {"name": "correct", "description": "equals the reference", "weight": 0.8},
        {"name": "number", "description": "is a whole number", "weight": 0.2},
    ]

    def reply(prompt):
        answer = prompt.split("\nAnswer: ")[1].split("\n")[0]
        if "equals the reference" in prompt:
            return "10" if answer == "5" else "0"
        return "10" if answer.isdigit() else "4/10"

    judge = Judge(reply)
    exps = task("rubric_workflow", 3, rubric=rubric).to_workflow(
        Policy(["5", "6", "five"]), [judge]
    )
    exps = exps.run()
    assert len(judge.prompts) == 3 * 2
    assert judge.prompts[0] == (
        "Score an answer on one criterion, from 0 to 10.\nQuestion: 2+3=\nReference answer: 5\n"
        "Answer: 5\nCriterion: equals the reference\nReply with the score only."
    )
    # "5": 0.8*1 + 0.2*1; "6": 0.8*0 + 0.2*1; "five": 0.8*0 + 0.2*0.4
    assert [e.reward for e in exps] == pytest.approx([1.0, 0.2, 0.08])
    assert exps[2].metrics == {"rubric/correct": 0.0, "rubric/number": pytest.approx(0.4)}
    assert exps[1].info["judge_replies"] == {"correct": "0", "number": "10"}


def test_judged_workflows_need_a_judge_and_valid_args():
    with pytest.raises(ValueError, match="RulerWorkflow needs a judge: set explorer.auxiliary"):
        task("ruler_workflow", 2).to_workflow(Policy(["1"]), None)
    with pytest.raises(
        ValueError, match="taskset 'arith': workflow_args.rubric: required key is missing$"
    ):
        task("rubric_workflow", 2).to_workflow(Policy(["1"]), [Judge(str)])


def test_llm_judge_reads_yes_as_reward_one():
    judge = Judge(lambda prompt: "Yes." if "Student answer: 5" in prompt else "no")
    exps = task("llm_judge_workflow", 2).to_workflow(Policy(["5", "4"]), [judge]).run()
    assert [e.reward for e in exps] == [1.0, 0.0]
    assert judge.kwargs[0] == {"temperature": 0.0, "max_tokens": 8}


# ---- the examples' tiny judge ---------------------------------------------------------------
def test_the_examples_prompt_the_tiny_judge_as_it_was_taught():
    from trinity.common.config import load_config
    from trinity.demo.judges import CRITERIA, RUBRIC_PROMPT, RULER_PROMPT

    for name, template in (("ruler", RULER_PROMPT), ("rubric", RUBRIC_PROMPT)):
        config = load_config(os.path.join(EXAMPLES, f"{name}.yaml"))
        args = config.buffer.explorer_input.tasksets[0].workflow_args
        assert args["judge_prompt"] == template, name
    rubric = load_config(os.path.join(EXAMPLES, "rubric.yaml"))
    criteria = rubric.buffer.explorer_input.tasksets[0].workflow_args["rubric"]
    assert {c["description"] for c in criteria} == set(CRITERIA)


def test_the_tiny_judge_is_taught_scores_worked_out_from_the_truth():
    from trinity.demo.judges import in_format, judgments, ruler_score

    # 10 for the sum, one less per unit off, 0 for anything but a number
    assert [ruler_score(a, 46) for a in ("46", "44", "56", "100", "4a", "")] == [10, 8, 0, 0, 0, 0]
    made = judgments(200, seed=3)
    assert made == judgments(200, seed=3)  # seeded
    for j in made:
        a, b = j.prompt.split("Question: ")[1].split("=")[0].split("+")
        assert j.truth == int(a) + int(b)
        assert in_format(j, j.reply)
        if j.criterion is None:
            listed = "\n".join(f"{k}) {x}" for k, x in enumerate(j.answers, 1))
            assert f"Answers:\n{listed}\nScore each" in j.prompt
            expected = [f"{k}: {ruler_score(x, j.truth)}" for k, x in enumerate(j.answers, 1)]
            assert j.reply == "\n".join(expected)
        else:
            (answer,) = j.answers
            assert f"\nAnswer: {answer}\nCriterion: {j.criterion}\n" in j.prompt
            meets = answer == str(j.truth) if "equals" in j.criterion else answer.isdigit()
            assert j.reply == ("10" if meets else "0")
    # as an untrained policy answers: groups of random strings only, some with a newline
    noise_only = [
        j for j in made if j.criterion is None and not any(x.isdigit() for x in j.answers)
    ]
    assert len(noise_only) >= 10 and any("\n" in x for j in noise_only for x in j.answers)


def test_a_reply_is_in_the_judges_format_only_line_for_line():
    from trinity.demo.judges import Judgment, in_format

    group = Judgment("p", "1: 10\n2: 0", 5, ("5", "x"), None)
    verdict = Judgment("p", "10", 5, ("5",), "the answer equals the reference")
    assert in_format(group, "1: 3\n2: 0") and in_format(verdict, "7")
    for reply in ("1: 3", "2: 3\n1: 0", "1: 3\n2: 11", "1: 3\n2: 0\n3: 0", "10\n10", "1: x\n2: 0"):
        assert not in_format(group, reply)
    for reply in ("1: 7", "11", "", "7 "):
        assert not in_format(verdict, reply)


def test_the_judge_trains_on_until_it_replies_in_the_format(tmp_path, monkeypatch):
    from trinity.demo import DemoBuildError, judges

    # one training step a round: what is checked is the rounds, not what the judge learns
    monkeypatch.setattr(
        judges.prepare_judges, "__kwdefaults__", {"steps": 1, "n_judgments": 40, "seed": 0}
    )
    rates = iter([0.5, 0.97])
    monkeypatch.setattr(judges, "read_rate", lambda *args: next(rates))
    judges.prepare_judges(str(tmp_path))
    marker = json.loads((tmp_path / "judge" / "judge.json").read_text())
    assert marker["read_rates"] == [0.5, 0.97] and marker["steps"] == 1

    monkeypatch.setattr(judges, "read_rate", lambda *args: 0.9)
    with pytest.raises(DemoBuildError, match=r"90% of held-out judgments after 3 x 1 steps"):
        judges.prepare_judges(str(tmp_path), n_judgments=41)
    assert not (tmp_path / "judge" / "judge.json").exists()  # no half-trained judge reused

    # the command says so in a line, exit code 2, no traceback
    out = str(tmp_path)
    result = CliRunner().invoke(app, ["prepare-quickstart", "--task", "judges", "--out", out])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "replies in the format to 90% of held-out judgments" in result.output
