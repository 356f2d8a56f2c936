import threading
from fractions import Fraction

import pytest

from trinity.common.rewards import REWARD_FUNCTIONS, total_reward
from trinity.common.rewards.math import MAX_EXPONENT, extract_answer, to_number


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


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2e3", Fraction(2000)),
        ("1.5E-3", Fraction(3, 2000)),
        (f"1e{MAX_EXPONENT}", Fraction(10**MAX_EXPONENT)),
        (f"1e{MAX_EXPONENT + 1}", None),
        ("1e10000000", None),
        ("-4e-10000000", None),
        ("1e" + "0" * 50 + "7", Fraction(10**7)),  # leading zeros are not size
        ("1e" + "9" * 100_000, None),
        ("1" * 5000, None),  # more digits than Python turns into an int
    ],
)
def test_numbers_past_a_bounded_size_are_not_parsed(text, expected):
    assert to_number(text) == expected


def test_an_absurd_reference_number_is_scored_as_text_and_returns():
    """``1e10000000`` as an exact Fraction took 8.6 s; ten times the exponent, minutes. The
    thread is a hang guard, not a timing assertion."""
    reward = REWARD_FUNCTIONS.get("math_reward")()
    scores = {}

    def score() -> None:
        scores["wrong"] = reward("the answer is 7", truth="1e100000000")["accuracy"]
        scores["same"] = reward("the answer is \\boxed{1E100000000}", truth="1e100000000")[
            "accuracy"
        ]

    worker = threading.Thread(target=score, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert scores == {"wrong": 0.0, "same": 1.0}


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
