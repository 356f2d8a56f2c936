import pytest

from trinity.common.rewards import REWARD_FUNCTIONS, total_reward
from trinity.common.rewards.math import extract_answer


@pytest.mark.parametrize(
    "text,expected",
    [
        ("The sum is 579", "579"),
        ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("<think>1+1</think><answer> 2 </answer>", "2"),
        ("12 then 13", "13"),
        ("no digits", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "response,truth,score",
    [
        ("579", "579", 1.0),
        ("578", "579", 0.0),
        ("\\boxed{0.5}", "1/2", 1.0),  # numeric equivalence across notations
        ("1,000", "1000", 1.0),
        ("", "3", 0.0),
        # GSM8K's answers are worked solutions ending with "#### <answer>"
        (
            "She sold 72 clips.",
            "48/2 = <<48/2=24>>24 in May.\n48+24 = <<48+24=72>>72\n#### 72",
            1.0,
        ),
        (
            "She sold 24 clips.",
            "48/2 = <<48/2=24>>24 in May.\n48+24 = <<48+24=72>>72\n#### 72",
            0.0,
        ),
        ("1000", "It is 1,000.\n#### 1,000", 1.0),
    ],
)
def test_math_reward(response, truth, score):
    assert REWARD_FUNCTIONS.get("math_reward")()(response, truth) == {"accuracy": score}


def test_accuracy_reward_is_textual():
    fn = REWARD_FUNCTIONS.get("accuracy_reward")()
    assert fn("<answer>Paris</answer>", "paris") == {"accuracy": 1.0}
    assert fn("0.5", "1/2") == {"accuracy": 0.0}  # no numeric parsing, unlike math_reward


def test_format_reward():
    fn = REWARD_FUNCTIONS.get("format_reward")()
    assert fn("<think>a</think> <answer>b</answer>")["format"] == 1.0
    assert fn("<answer>b</answer>")["format"] == 0.0


def test_countdown_reward():
    fn = REWARD_FUNCTIONS.get("countdown_reward")()
    row = {"nums": [3, 5, 7], "target": 22}
    # 3 * 5 + 7 = 22 uses each number once: full reward.
    assert total_reward(fn("<answer>3*5+7</answer>", "22", raw_task=row)) == 1.0
    # Well-formed but wrong value: format score only.
    assert total_reward(fn("<answer>3+5+7</answer>", "22", raw_task=row)) == pytest.approx(0.1)
    # Right value with a number used twice is wrong: 3*5+7 needs 7 once, 7+7+... uses it twice.
    assert fn("<answer>5*3+7+7-7</answer>", "22", raw_task=row)["accuracy"] == 0.0
    assert total_reward(fn("I don't know", "22", raw_task=row)) == 0.0


def test_unknown_reward_suggests_name():
    with pytest.raises(KeyError, match="math_reward"):
        REWARD_FUNCTIONS.get("math_rewards")
