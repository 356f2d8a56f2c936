"""The original Trinity-RFT's rewards, checked against values worked out by hand:
math_boxed_reward, math_dapo_reward, tool_call_reward (ToolACE), countdown's JSON truth and
the Qwen2.5-Math answer check."""

import json

import pytest

from trinity.common.rewards import REWARD_FUNCTIONS, total_reward
from trinity.common.rewards.boxed import last_boxed, normalise_latex
from trinity.common.rewards.dapo import dapo_answer, overlong_penalty
from trinity.common.rewards.qwen_math import final_answer, qwen_math_correct
from trinity.common.rewards.toolcall import tool_call_score

# --- math_boxed_reward -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, content",
    [
        ("so \\boxed{4} and then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last one
        ("\\fbox{7}", "7"),
        ("the answer: \\boxed 5$ done", "5"),  # "\boxed x" runs to the dollar
        ("\\boxed{\\sqrt{2}", None),  # braces never close
        ("no box here: 4", None),
    ],
)
def test_last_boxed(text, content):
    assert last_boxed(text) == content


@pytest.mark.parametrize(
    "written, canonical",
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("1/2", "\\frac{1}{2}"),
        ("x = 5", "5"),
        ("5\\text{ cm}", "5"),  # a unit after the value goes
        ("\\text{Monday}", "Monday"),
        ("72.0", "72"),
        (".5", "0.5"),
        ("90^\\circ", "90"),
        ("50\\%", "50"),
        ("$\\left(3, 4\\right)$", "3,4"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("4.", "4"),
    ],
)
def test_normalise_latex(written, canonical):
    assert normalise_latex(written) == canonical


def test_math_boxed_reward_accuracy_and_format_score():
    fn = REWARD_FUNCTIONS.get("math_boxed_reward")()
    # Right answer, no thinking asked for: accuracy 1, no penalty.
    assert fn("... so \\boxed{\\dfrac{1}{2}}", "\\frac12") == {
        "accuracy": 1.0,
        "format_score": 0.0,
    }
    # A truth written with its own box is read from the box.
    assert fn("\\boxed{72}", "The total is \\boxed{72.0}.")["accuracy"] == 1.0
    # Wrong, and no box at all.
    assert fn("\\boxed{5}", "4")["accuracy"] == 0.0
    assert fn("the answer is 4", "4")["accuracy"] == 0.0
    # with_think: one <think> before one </think> is the format; else -coef (default 0.1).
    good = "<think>2 and 2</think> \\boxed{4}"
    assert fn(good, "4", with_think=True) == {"accuracy": 1.0, "format_score": 0.0}
    assert fn("\\boxed{4}", "4", with_think=True) == {"accuracy": 1.0, "format_score": -0.1}
    twice = "<think>a</think><think>b</think>\\boxed{4}"
    assert total_reward(fn(twice, "4", with_think=True, format_score_coef=0.5)) == 0.5
    backwards = "</think>x<think> \\boxed{3}"
    assert total_reward(fn(backwards, "4", with_think=True)) == pytest.approx(-0.1)
    # No truth: nothing to be right about.
    assert fn("\\boxed{4}", None)["accuracy"] == 0.0


def test_math_boxed_reward_takes_no_arguments():
    with pytest.raises(TypeError, match="takes no arguments"):
        REWARD_FUNCTIONS.get("math_boxed_reward")(format_score=1)


# --- math_dapo_reward --------------------------------------------------------------------


def test_overlong_penalty_by_hand():
    # L_max 20, L_cache 4: free up to 16 tokens, then -(L - 16)/4, -1 past 20.
    values = [overlong_penalty(n, 20, 4, 1.0) for n in (10, 16, 17, 18, 20, 21, 100)]
    assert values == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    assert overlong_penalty(19, 20, 4, 2.0) == pytest.approx(-1.5)


def test_dapo_answer_is_the_box_after_the_thinking():
    assert dapo_answer("<think>maybe \\boxed{3}</think> so \\boxed{4}") == "4"
    assert dapo_answer("<think>\\boxed{3}</think> 4") == "4"  # no box after: the text


def test_math_dapo_reward():
    fn = REWARD_FUNCTIONS.get("math_dapo_reward")(
        enable_overlong_penalty=True, penalty_factor=1.0, max_response_length=20, cache_length=4
    )
    right = "<think>half</think> \\boxed{0.5}"
    assert fn(right, "\\frac{1}{2}", response_tokens=10) == {"accuracy": 1.0, "format_score": 0.0}
    assert fn(right, "1/2", response_tokens=18) == {"accuracy": 1.0, "format_score": -0.5}
    assert fn("\\boxed{3}", "4", response_tokens=30) == {"accuracy": 0.0, "format_score": -1.0}
    with pytest.raises(ValueError, match="response_tokens"):
        fn(right, "1/2")
    plain = REWARD_FUNCTIONS.get("math_dapo_reward")()
    assert plain("\\boxed{x+1}", "1+x") == {"accuracy": 1.0, "format_score": 0.0}


@pytest.mark.parametrize(
    "args, match",
    [
        ({"enable_overlong_penalty": True}, "needs penalty_factor"),
        (
            {
                "enable_overlong_penalty": True,
                "penalty_factor": 1.0,
                "max_response_length": 4,
                "cache_length": 4,
            },
            "below max_response_length",
        ),
    ],
)
def test_math_dapo_reward_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        REWARD_FUNCTIONS.get("math_dapo_reward")(**args)


# --- tool_call_reward --------------------------------------------------------------------

TIME = {"name": "time", "arguments": {}}
CALLS = [
    {"name": "weather", "arguments": {"city": "Paris", "days": 2}},
    {"name": "time", "arguments": {}},
]
TRUTH = json.dumps(CALLS)


def _reply(calls: str, think: str = "<think>two calls</think>") -> str:
    return f"{think} <tool_call>{calls}</tool_call>"


@pytest.mark.parametrize(
    "response, score",
    [
        # The same calls in another order, arguments' keys in another order: right.
        (
            _reply(
                json.dumps([TIME, {"name": "weather", "arguments": {"days": 2, "city": "Paris"}}])
            ),
            1.0,
        ),
        # A wrong argument value.
        (
            _reply(
                json.dumps([{"name": "weather", "arguments": {"city": "Rome", "days": 2}}, TIME])
            ),
            0.0,
        ),
        # Only the names right.
        (_reply('[{"name": "weather", "arguments": {}}, {"name": "time", "arguments": {}}]'), 0.0),
        # One call too few.
        (_reply('[{"name": "time", "arguments": {}}]'), 0.0),
        # No thinking, two think blocks, thinking after the call.
        (_reply(json.dumps(CALLS), think=""), 0.0),
        (_reply(json.dumps(CALLS), think="<think>a</think><think>b</think>"), 0.0),
        (f"<tool_call>{json.dumps(CALLS)}</tool_call><think>done</think>", 0.0),
        # Not JSON, a call without arguments, no tool_call block.
        (_reply("[weather(Paris)]"), 0.0),
        (_reply('[{"name": "time"}]'), 0.0),
        ("<think>no call</think> It is sunny.", 0.0),
    ],
)
def test_tool_call_score(response, score):
    assert tool_call_score(response, TRUTH) == score


def test_tool_call_score_single_call_and_no_call():
    one = [TIME]
    # One call written as an object counts as a list of one; the last block is the answer.
    reply = f"<think>t</think><tool_call>[]</tool_call><tool_call>{json.dumps(TIME)}</tool_call>"
    assert tool_call_score(reply, json.dumps(one)) == 1.0
    # No call is right only when the reference makes none.
    assert tool_call_score(_reply("[]"), "[]") == 1.0
    assert tool_call_score(_reply("[]"), json.dumps(one)) == 0.0
    # A reference written as JSON of a JSON string is read through.
    assert tool_call_score(_reply(json.dumps(one)), json.dumps(json.dumps(one))) == 1.0
    fn = REWARD_FUNCTIONS.get("tool_call_reward")()
    assert fn(_reply(json.dumps(one)), json.dumps(one)) == {"accuracy": 1.0}
    assert fn(_reply(json.dumps(one)), None) == {"accuracy": 0.0}


# --- countdown_reward with the original's JSON truth -----------------------------------------


def test_countdown_reads_the_originals_json_truth():
    fn = REWARD_FUNCTIONS.get("countdown_reward")()
    truth = json.dumps({"target": 22, "numbers": [3, 5, 7]})
    assert total_reward(fn("<answer>3*5+7</answer>", truth, raw_task={})) == 1.0
    assert total_reward(fn("<answer>3+5+7</answer>", truth, raw_task={})) == pytest.approx(0.1)
    assert total_reward(fn("no equation", truth, raw_task={})) == 0.0


# --- the Qwen2.5-Math answer check (math_eval_workflow, on-policy distillation) ------------


@pytest.mark.parametrize(
    "text, answer",
    [
        ("so \\boxed{12} in all", "12"),
        ("Thus the final answer is: 3/4.", "3/4"),
        ("she has 1,200 apples and 3 pears", "3"),
        ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
        ("no answer", None),
    ],
)
def test_final_answer(text, answer):
    assert final_answer(text) == answer


def test_qwen_math_correct():
    assert qwen_math_correct("... \\boxed{72}", "worked solution\n#### 72")
    assert qwen_math_correct("the answer is \\frac{3}{4}", "0.75")  # the same number
    assert qwen_math_correct("\\boxed{50}", "0.5")  # a number and its percentage
    assert qwen_math_correct("\\boxed{x+1}", "\\boxed{x + 1}")  # the same spelling
    assert not qwen_math_correct("\\boxed{73}", "#### 72")
    assert not qwen_math_correct("\\boxed{72}", None)
