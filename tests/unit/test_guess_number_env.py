"""Guess the number (trinity.demo): the rules, their budgets, the seeded data, the SFT dialogues."""

import os
from fractions import Fraction

import pytest
from typer.testing import CliRunner

from trinity.buffer.sft import SFTFormatter
from trinity.cli.main import app
from trinity.common.config import FormatConfig
from trinity.demo import prepare_demo
from trinity.demo.guess_number import (
    GuessNumberEnv,
    GuessNumberTask,
    binary_search,
    make_guess_number,
    make_guess_number_sft,
    opening_ranges,
    play,
    prepare_guess_number,
    split_ranges,
    turns_for,
)
from trinity.demo.synthetic import read_jsonl
from trinity.demo.tiny import IM_END, build_char_tokenizer


def test_answers_name_the_interval_left_and_the_episode_ends_on_the_secret():
    env = GuessNumberEnv(GuessNumberTask(low=0, high=14, secret=9, max_turns=4))
    assert env.opening() == "guess 0-14"
    first = env.step("7")
    assert (first.text, first.done, first.success) == ("higher 8-14", False, False)
    assert env.step(" 11\n").text == "lower 8-10"  # surrounding whitespace is not an error
    last = env.step("9")
    assert (last.text, last.done, last.success) == ("correct", True, True)
    assert env.turns == 3
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("9")


def test_a_guess_outside_the_interval_is_answered_truthfully_and_wastes_a_turn():
    env = GuessNumberEnv(GuessNumberTask(low=4, high=10, secret=6, max_turns=3))
    assert env.step("2").text == "higher 4-10"  # below the range: the interval stays
    assert env.step("30").text == "lower 4-10"
    out = env.step("5")  # third and last turn, still wrong
    assert (out.text, out.done, out.success) == ("higher 6-10", True, False)


@pytest.mark.parametrize("reply", ["seven", "", "7.", "-3", "²", "7 8"])
def test_a_reply_that_is_not_a_whole_number_ends_the_episode_lost(reply):
    env = GuessNumberEnv(GuessNumberTask(low=0, high=6, secret=3, max_turns=3))
    out = env.step(reply)
    assert (out.text, out.done, out.success, env.turns) == ("invalid", True, False, 1)


def test_rows_are_checked():
    assert GuessNumberTask.from_row({"low": 1, "high": 7, "secret": 2, "max_turns": 3}).high == 7
    with pytest.raises(KeyError, match="missing secret"):
        GuessNumberTask.from_row({"low": 1, "high": 7, "max_turns": 3})
    with pytest.raises(ValueError, match="must be integers"):
        GuessNumberTask.from_row({"low": 1, "high": "7", "secret": 2, "max_turns": 3})
    with pytest.raises(ValueError, match="low <= secret <= high"):
        GuessNumberTask.from_row({"low": 1, "high": 7, "secret": 9, "max_turns": 3})


def test_binary_search_wins_every_game_in_exactly_the_turns_allowed():
    ranges = opening_ranges(31, (7, 15))
    assert len(ranges) == 26 + 18  # lows 0..25 for 7 numbers, 0..17 for 15
    worst = {}
    for low, high in ranges:
        size = high - low + 1
        for secret in range(low, high + 1):
            task = GuessNumberTask(low, high, secret, turns_for(size))
            dialogue, won = play(task, binary_search)
            assert won
            worst[size] = max(worst.get(size, 0), sum(m["role"] == "assistant" for m in dialogue))
    assert worst == {7: 3, 15: 4} and turns_for(7) == 3 and turns_for(15) == 4


def _random_policy_win_probability(env: GuessNumberEnv, turns_played: list) -> Fraction:
    """Exact probability that uniform guesses inside the interval left win from here."""
    total = Fraction(0)
    options = range(env.low, env.high + 1)
    for guess in options:
        replay = GuessNumberEnv(env.task)
        for g in turns_played:
            replay.step(str(g))
        out = replay.step(str(guess))
        if out.success:
            total += 1
        elif not out.done:
            total += _random_policy_win_probability(replay, turns_played + [guess])
    return total / len(options)


@pytest.mark.parametrize(
    "size,turns,expected", [(3, 2, Fraction(7, 9)), (7, 3, Fraction(166, 245))]
)
def test_random_guessing_wins_as_often_as_derived_by_hand(size, turns, expected):
    # f(n, 2) = (3n - 2) / n^2 and f(n, 3) = 1/n + (2/n^2) * sum_{j<n} (3 - 2/j): for n = 7,
    # 1/7 + (2/49)(18 - 2 * 49/20) = 166/245 (0.678). The rules must give exactly that.
    games = [GuessNumberTask(0, size - 1, s, turns) for s in range(size)]
    won = sum(_random_policy_win_probability(GuessNumberEnv(g), []) for g in games) / size
    assert won == expected


def test_games_are_seeded_and_test_openings_are_held_out(tmp_path):
    paths = make_guess_number(str(tmp_path / "a"), n_train=200, n_test=60, seed=3)
    train, test = read_jsonl(paths["train"]), read_jsonl(paths["test"])
    assert len(train) == 200 and len(test) == 60
    for row in train + test:
        task = GuessNumberTask.from_row(row)
        assert task.max_turns == turns_for(task.high - task.low + 1)
        assert task.high - task.low + 1 in (7, 15) and task.high <= 31
    openings = lambda rows: {(r["low"], r["high"]) for r in rows}  # noqa: E731
    assert not openings(train) & openings(test)
    keys = [tuple(sorted(r.items())) for r in train + test]
    assert len(set(keys)) == len(keys)
    again = make_guess_number(str(tmp_path / "b"), n_train=200, n_test=60, seed=3)
    assert read_jsonl(again["train"]) == train and read_jsonl(again["test"]) == test
    other = make_guess_number(str(tmp_path / "c"), n_train=200, n_test=60, seed=4)
    assert read_jsonl(other["train"]) != train
    with pytest.raises(ValueError, match="only .* distinct ones exist; raise max_value"):
        make_guess_number(str(tmp_path / "d"), n_train=10_000, n_test=10)


def test_sft_dialogues_are_valid_won_games_opening_with_training_ranges(tmp_path):
    train_ranges, test_ranges = split_ranges(31, (7, 15), 0.25, seed=0)
    assert len(test_ranges) == 11 and not set(train_ranges) & set(test_ranges)
    path = make_guess_number_sft(str(tmp_path), n_dialogues=300, ranges=train_ranges)["train"]
    rows = read_jsonl(path)
    assert len(rows) == 300
    turns_seen = set()
    for row in rows:
        messages = row["messages"]
        low, high = map(int, messages[0]["content"].removeprefix("guess ").split("-"))
        assert (low, high) in train_ranges
        secret = int(messages[-1]["content"])  # a won game ends with the right guess
        env = GuessNumberEnv(GuessNumberTask(low, high, secret, turns_for(high - low + 1)))
        assert messages[0]["content"] == env.opening()
        assert [m["role"] for m in messages[1:]] == ["assistant", "user"] * (
            len(messages) // 2 - 1
        ) + ["assistant"]
        for k in range(1, len(messages), 2):
            guess = int(messages[k]["content"])
            assert env.low <= guess <= env.high  # the policy guesses inside the interval
            out = env.step(messages[k]["content"])
            if k + 1 < len(messages):
                assert messages[k + 1]["content"] == out.text and not out.done
        assert env.success
        turns_seen.add(env.turns)
    assert turns_seen == {1, 2, 3, 4}  # not the optimal policy: games of every length


def test_the_sft_reader_trains_every_guess_of_a_dialogue():
    tokenizer = build_char_tokenizer()
    fmt = FormatConfig(
        prompt_type="messages", messages_key="messages", enable_concatenated_multi_turn=True
    )
    task = GuessNumberTask(0, 14, 9, 4)
    dialogue, _ = play(task, binary_search)
    exp = SFTFormatter(tokenizer, fmt).format({"messages": dialogue})
    response = exp.tokens[exp.prompt_length :].tolist()
    trained = [t for t, m in zip(response, exp.action_mask.tolist(), strict=True) if m]
    assert tokenizer.decode(trained, skip_special_tokens=False) == f"7{IM_END}11{IM_END}9{IM_END}"
    first = tokenizer.apply_chat_template(dialogue[:1], add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(exp.tokens[: exp.prompt_length], skip_special_tokens=False) == first


def test_prepare_builds_model_and_data_once_and_the_cli_names_demos(tmp_path):
    args = dict(preset="micro", n_sft=40, n_train=30, n_test=10)
    paths = prepare_guess_number(str(tmp_path), **args)
    assert os.path.isfile(os.path.join(paths["model_path"], "config.json"))
    assert len(read_jsonl(os.path.join(paths["sft_path"], "train.jsonl"))) == 40
    assert len(read_jsonl(os.path.join(paths["rl_path"], "test.jsonl"))) == 10
    stamp = os.path.getmtime(os.path.join(paths["rl_path"], "train.jsonl"))
    assert prepare_guess_number(str(tmp_path), **args) == paths
    assert os.path.getmtime(os.path.join(paths["rl_path"], "train.jsonl")) == stamp

    bad = CliRunner().invoke(app, ["prepare-quickstart", "--task", "chess", "--out", "x"])
    assert bad.exit_code == 2 and "guess_number" in bad.output
    with pytest.raises(KeyError, match="choose one of arithmetic, calculator, guess_number"):
        prepare_demo("chess", str(tmp_path))
