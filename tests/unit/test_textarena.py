"""textarena_workflow: real TextArena games played by a scripted stand-in model, each episode
one experience whose trained tokens are the replies; rewards as the game gives them; the
checks before start."""

import importlib.util
import random
import re
import textwrap

import pytest

from tests.unit.test_frozen_lake import TOKENIZER, ScriptedModel, trained
from tests.unit.test_preflight import BASE
from trinity.common.config import GenerationConfig, load_config
from trinity.common.config.base import ConfigError, validate_model
from trinity.common.workflows import WORKFLOWS, Task, TextArenaWorkflow
from trinity.common.workflows.textarena import TextArenaArgs
from trinity.common.workflows.textarena_env import Game, GameError, why_it_failed
from trinity.demo.tiny import IM_END
from trinity.preflight.components import component_problems
from trinity.preflight.derive import derive

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("textarena") is None,
    reason='textarena is not installed (pip install -e ".[textarena]")',
)
GUESS = "GuessTheNumber-v0"


def secret(seed: int) -> int:
    return Game(GUESS, {}, 1, seed).base.game_number


def play(model, seed=5, n=1, max_tokens=None, row=None, **args):
    task = Task(
        workflow="textarena_workflow",
        raw_task={"seed": seed, **(row or {})},
        rollout_args=GenerationConfig(n=n, temperature=0.7, max_tokens=max_tokens),
        workflow_args={"env_id": GUESS, **args},
        taskset_name="arena",
        index=2,
    )
    return task.to_workflow(model).run()


class TicTacToePlayer(ScriptedModel):
    """Plays the first of the moves the game's last board lists ('Available Moves: ...')."""

    def __init__(self):
        super().__init__([])

    def chat(self, messages, tools=None, **sampling):
        board = messages[-1]["content"].rsplit("Available Moves:", 1)[-1]
        self.replies = [re.findall(r"\[\d\]", board)[0]]
        return super().chat(messages, tools, **sampling)


# ---- games of one --------------------------------------------------------------------------
def test_a_found_number_earns_1_and_only_the_replies_are_trained():
    target = secret(5)
    low = 1 if target != 1 else 2
    replies = [f"I guess [{low}]", f"[{target}]"]
    model = ScriptedModel(replies)
    (exp,) = play(model)
    assert exp.reward == 1.0
    assert exp.metrics == {"turns": 2.0, "game_over": 1.0, "invalid_move": 0.0}
    assert exp.info["end"] == "game_over" and exp.info["seed"] == 5
    assert trained(exp) == "".join(r + IM_END for r in replies)
    assert exp.logprobs.tolist() == [-0.5 if m else 0.0 for m in exp.action_mask.tolist()]
    # the conversation: the standard game prompt, the rules, a hint between the guesses
    system, rules = model.sent[0][0]
    assert system["content"].startswith("You are a competitive game player.")
    assert rules["content"].startswith("[GAME] You are Player 0. You are playing Guess The Number")
    hint = "higher" if target > low else "lower"
    assert model.sent[1][0][-1]["content"] == f"[GAME] The target number is {hint}."
    # token-exact: the experience is the whole conversation as the chat template writes it
    conversation = model.sent[1][0] + [{"role": "assistant", "content": replies[1]}]
    text = TOKENIZER.apply_chat_template(conversation, tokenize=False)
    assert TOKENIZER.decode(exp.tokens.tolist()) == text.removesuffix("\n")


def test_two_invalid_moves_end_the_game_with_its_partial_score():
    target = secret(5)
    guess = 10 if target != 10 else 11
    # the game answers one invalid move with a warning and a second try; the second ends it
    (exp,), model = play_with([f"[{guess}]", "no idea", "still no idea"])
    assert exp.metrics == {"turns": 3.0, "game_over": 1.0, "invalid_move": 1.0}
    assert exp.reward == pytest.approx(1 - abs(guess - target) / 19)  # 1 - distance / (20 - 1)
    assert "You attempted an invalid move" in model.sent[2][0][-1]["content"]
    (exp,), _ = play_with(["no idea", "none"])
    assert exp.reward == 0.0 and exp.metrics["invalid_move"] == 1.0  # no guess to score


def play_with(replies, **args):
    model = ScriptedModel(replies)
    return play(model, **args), model


def test_a_game_not_over_within_max_turns_scores_0():
    target = secret(5)
    wrong = [g for g in range(1, 21) if g != target][:3]
    (exp,), model = play_with([f"[{g}]" for g in wrong], max_turns=3)
    assert exp.reward == 0.0 and exp.info["end"] == "max_turns"
    assert exp.metrics == {"turns": 3.0, "game_over": 0.0, "invalid_move": 0.0}
    (exp,), model = play_with(["[1]"] * 3, max_tokens=20)  # the second message outgrows it
    assert exp.info["end"] == "max_tokens" and len(model.sent) == 1


def test_env_kwargs_reach_the_game_and_a_row_may_name_its_own_game():
    (exp,), model = play_with(["[3]"], max_turns=1, env_kwargs={"max_number": 5})
    assert "between 1 and 5" in model.sent[0][0][1]["content"]
    (exp,), model = play_with(["[A C]"], max_turns=1, row={"env_id": "TowerOfHanoi-v0"})
    assert exp.info["env_id"] == "TowerOfHanoi-v0"
    assert "Tower of Hanoi" in model.sent[0][0][1]["content"]
    with pytest.raises(ValueError, match="row 2: TextArena has no game 'Hanoi'"):
        play(ScriptedModel([]), row={"env_id": "Hanoi"})
    with pytest.raises(ValueError, match="row 2: column 'seed' must be a Integral"):
        play(ScriptedModel([]), seed="x")


def test_a_seed_gives_the_same_game_whatever_else_draws_from_random():
    first = Game(GUESS, {}, 1, seed=11)
    random.seed(0)
    outside = random.getstate()
    second = Game(GUESS, {}, 1, seed=11)
    assert random.getstate() == outside  # the game's draws are its own
    assert first.base.game_number == second.base.game_number
    assert {secret(s) for s in range(20)} != {secret(11)}  # other seeds, other games


def test_a_game_that_raises_fails_its_episode_naming_game_seed_and_move(monkeypatch):
    from textarena.envs.GuessTheNumber.env import GuessTheNumberEnv

    def broken(self, action):
        raise KeyError("board")

    monkeypatch.setattr(GuessTheNumberEnv, "step", broken)
    with pytest.raises(GameError, match=r"GuessTheNumber-v0 \(seed 5\) raised at step "):
        play(ScriptedModel(["[3]"]))


def test_nltk_word_lists_missing_say_how_to_fetch_them():
    exc = LookupError("\n****\n  Resource \x1b[93mwords\x1b[0m not found.\n  Please use ...")
    assert why_it_failed(exc).endswith("python -m nltk.downloader words")
    assert why_it_failed(ValueError("bad\nmore")) == "ValueError: bad"


# ---- games of two --------------------------------------------------------------------------
@pytest.mark.parametrize("seat", [0, 1])
def test_tic_tac_toe_against_the_random_opponent(seat):
    args = {"env_id": "TicTacToe-v0", "num_players": 2, "opponent": {"kind": "random"}}
    model = TicTacToePlayer()
    first, again = play(model, seed=3, n=2, row={"player_id": seat}, **args)
    assert first.tokens.tolist() == again.tokens.tolist()  # the seed fixes the opponent too
    outcome = {1.0: "win", 0.0: "draw", -1.0: "loss"}[first.reward]
    assert first.metrics[outcome] == 1.0
    assert sum(first.metrics[k] for k in ("win", "draw", "loss")) == 1.0
    opening = model.sent[0][0][1]["content"]
    assert f"You are Player {seat} in Tic Tac Toe" in opening
    # the opponent's move is shown; the player's own moves are its replies only
    assert ("[Player 0]" in opening) == (seat == 1)
    assert f"[Player {seat}]" not in model.sent[1][0][-1]["content"]


def test_invalid_moves_in_a_game_of_two_lose_it():
    args = {"env_id": "TicTacToe-v0", "num_players": 2, "opponent": {"kind": "random"}}
    (exp,) = play(ScriptedModel(["[9]", "[x]"]), seed=3, **args)
    assert exp.reward == -1.0 and exp.metrics["loss"] == 1.0 and exp.metrics["invalid_move"] == 1.0


def test_a_random_opponent_with_no_move_it_can_find_fails_the_episode():
    # Nim's rules show '[0 3]' alone; once the player empties pile 0 it is no move at all
    args = {"env_id": "Nim-v0", "num_players": 2, "opponent": {"kind": "random"}}
    with pytest.raises(GameError, match=r"Nim-v0 \(seed 1\): the random opponent found no mo"):
        play(ScriptedModel(["[0 3]"]), seed=1, **args)
    listed = {"kind": "random", "moves": ["[1 1]", "[2 1]"]}
    model = ScriptedModel(["[0 3]", "[1 4]"])
    (exp,) = play(model, seed=1, max_turns=2, **{**args, "opponent": listed})
    after = model.sent[1][0][-1]["content"]
    assert re.search(r"\[Player 1\] \[[12] 1\]", after), after


# ---- before start --------------------------------------------------------------------------
def test_workflow_args_are_checked_with_the_closest_game():
    with pytest.raises(
        ConfigError,
        match="env_id: TextArena has no game 'GuessTheNumber-v1'; did you mean 'GuessTheNumber-v0'",
    ):
        validate_model(TextArenaArgs, {"env_id": "GuessTheNumber-v1"})
    with pytest.raises(ConfigError, match="a game of 2 player.s. needs an opponent"):
        validate_model(TextArenaArgs, {"env_id": "TicTacToe-v0", "num_players": 2})
    with pytest.raises(ConfigError, match="TypeError: .*unexpected keyword argument 'max_num'"):
        validate_model(TextArenaArgs, {"env_id": GUESS, "env_kwargs": {"max_num": 5}})
    with pytest.raises(ConfigError, match="could not start: AssertionError"):
        validate_model(TextArenaArgs, {"env_id": GUESS, "num_players": 2, "opponent": {}})


def config_with(tmp_path, workflow_args: str = "{env_id: GuessTheNumber-v0}"):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(BASE) + "    default_workflow_type: textarena_workflow\n")
    args = f"buffer.explorer_input.taskset.workflow_args={workflow_args}"
    config, _ = derive(load_config(str(path), [args]))
    return config


def test_an_opponent_model_needs_an_auxiliary_model_before_start(tmp_path):
    args = "{env_id: TicTacToe-v0, num_players: 2, opponent: {kind: model}}"
    assert component_problems(config_with(tmp_path, args), construct=False) == [
        "buffer.explorer_input.tasksets[0].workflow_args asks textarena_workflow for 1 "
        "auxiliary model(s), and explorer.auxiliary_models has 0: add them"
    ]
    assert component_problems(config_with(tmp_path), construct=False) == []
    unknown = component_problems(config_with(tmp_path, "{env_id: Wordle-v1}"), construct=False)
    assert unknown == [
        "buffer.explorer_input.tasksets[0].workflow_args.env_id: TextArena has no game "
        "'Wordle-v1'; did you mean 'Wordle-v0'?"
    ]


def test_without_textarena_it_is_refused_before_start_naming_the_extra(monkeypatch, tmp_path):
    config = config_with(tmp_path)
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "textarena" else found(name)
    )
    problems = component_problems(config, construct=False)
    assert (
        "buffer.explorer_input.default_workflow_type = textarena_workflow needs the textarena "
        'package, which is not installed: pip install -e ".[textarena]"'
    ) in problems


def test_the_workflow_is_registered():
    assert WORKFLOWS.get("textarena_workflow") is TextArenaWorkflow
