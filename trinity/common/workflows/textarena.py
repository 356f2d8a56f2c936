"""``textarena_workflow``: TextArena's text games (``textarena.make``), one game an episode.

Each task is one game: ``workflow_args.env_id`` (or the row's ``env_id`` column) made with
``env_kwargs`` and reset with the row's ``seed``, so a row is the same game wherever it runs
and held-out games are rows of other seeds. The workflow plays ``rollout_args.n`` episodes
of it. The trained model is one player (``player_id``, or the row's column); in a game of
two the other is the ``opponent``: a scripted one (``random``: a move the game accepts,
drawn from the row's seed) or an auxiliary model (``explorer.auxiliary_models``), which is
not trained.

An episode is one conversation: the system turn (textarena's standard game prompt unless
``system_prompt`` says otherwise), then each of the player's turns a user message holding
what the game showed that player since its last move (``observation_text``) and the model's
reply, which is the move as it is (textarena reads the ``[bracketed]`` part; a reply with no
brackets is put in brackets whole). Each turn's prompt continues the previous turn's exact
tokens, so the replies merge into one experience (``merge_turns``): the replies are trained
on, the game's messages are context.

Reward: what the game gives the player at its end (``env.close()``), as it is. Games of one
player give 1 when solved and their own partial score otherwise (GuessTheNumber: how close
the last guess was; TowerOfHanoi: the share of disks on the last tower). Games of two give 1
for a win, -1 for a loss, 0 for a draw. An invalid move is answered by the game with a
message and one more try; a second invalid move in a row ends the game: -1 in games of two,
the game's partial score in games of one. An episode the game does not end within
``max_turns`` replies, or whose token budget is spent, scores 0: the replies and the
messages between them may take ``rollout_args.max_tokens`` tokens in all
(``model.max_response_tokens`` unless the taskset sets it), each reply at most
``max_reply_tokens`` of what is left. A game that raises fails its task (``GameError``),
which the runner retries and counts (``rollout/tasks_failed``).
"""

from __future__ import annotations

import asyncio
import numbers
from typing import Any, Dict, List, Literal, Optional

from pydantic import Field, field_validator, model_validator

from trinity.common.config.base import ConfigError, ConfigModel, validate_model
from trinity.common.experience import Experience
from trinity.common.workflows.multiturn import merge_turns, reply_room, turn_sampling
from trinity.common.workflows.textarena_env import (
    Game,
    Message,
    RandomOpponent,
    check_env_id,
    observation_text,
    probe_game,
    textarena,
)
from trinity.common.workflows.workflow import WORKFLOWS, ResettableWorkflow, Task

Messages = List[Dict[str, Any]]


class OpponentArgs(ConfigModel):
    """``workflow_args.opponent``: who plays the other seat of a game of two."""

    kind: Literal["random", "model"] = Field(
        "random",
        description="random: a scripted player of random valid moves (drawn from the row's "
        "seed); model: an auxiliary model (explorer.auxiliary_models), not trained.",
    )
    moves: List[str] = Field(
        default_factory=list,
        description="random: moves to try besides the [bracketed] ones the game shows it "
        "(e.g. ConnectFour's '[col 0]'..'[col 6]'); it plays one the game accepts.",
    )
    auxiliary_model: int = Field(
        0, ge=0, description="model: which of explorer.auxiliary_models plays (from 0)."
    )
    temperature: float = Field(0.0, ge=0, description="model: its sampling temperature.")
    max_tokens: Optional[int] = Field(
        None, ge=1, description="model: the longest reply it may write (unset: the server's)."
    )


class TextArenaArgs(ConfigModel):
    """``workflow_args`` of ``textarena_workflow``."""

    env_id: str = Field(
        description="The TextArena game, as textarena.make names it (e.g. GuessTheNumber-v0); "
        "a row's env_id column overrides it."
    )
    env_kwargs: Dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments of the game's constructor over its registered ones (e.g. "
        "GuessTheNumber-v0's max_number).",
    )
    num_players: int = Field(1, ge=1, le=2, description="Players of the game: 1, or 2.")
    player_id: int = Field(
        0, ge=0, description="The trained model's seat (a row's player_id column overrides it)."
    )
    max_turns: int = Field(
        20, ge=1, description="Replies an episode may take; a game not over by then scores 0."
    )
    max_reply_tokens: Optional[int] = Field(
        None,
        ge=1,
        description="Tokens one reply may take, within the episode's budget "
        "(rollout_args.max_tokens); unset: all that is left of it.",
    )
    opponent: Optional[OpponentArgs] = Field(
        None, description="Who plays the other seat of a game of two (required there)."
    )
    system_prompt: Optional[str] = Field(
        None,
        description="The episode's system turn (unset: textarena's STANDARD_GAME_PROMPT; "
        "empty: none).",
    )

    @field_validator("env_id")
    @classmethod
    def _known_game(cls, value: str) -> str:
        return check_env_id(value) if _installed() else value

    @model_validator(mode="after")
    def _seats(self) -> TextArenaArgs:
        if self.player_id >= self.num_players:
            raise ValueError(f"player_id {self.player_id} is not a seat of {self.num_players}")
        if (self.num_players == 2) != (self.opponent is not None):
            need = "needs an opponent" if self.num_players == 2 else "has no opponent to set"
            raise ValueError(f"opponent: a game of {self.num_players} player(s) {need}")
        why = probe_game(self.env_id, self.env_kwargs, self.num_players) if _installed() else None
        if why is not None:
            raise ValueError(f"env_id/env_kwargs/num_players: {why}")
        return self


def _installed() -> bool:
    """Whether textarena imports (the checks that need it are skipped where it does not: the
    missing package is reported on its own, ``needs_packages``)."""
    try:
        textarena()
    except ImportError:
        return False
    return True


def _column(row: Dict[str, Any], key: str, default: Any, kind: type) -> Any:
    value = row.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"column '{key}' must be a {kind.__name__}, got {value!r}")
    return value


@WORKFLOWS.register_module("textarena_workflow")
class TextArenaWorkflow(ResettableWorkflow):
    """Plays ``rollout_args.n`` episodes of one task's TextArena game, each one experience."""

    args_model = TextArenaArgs
    needs_packages = {"textarena": "textarena"}

    @classmethod
    def auxiliary_models_needed(cls, workflow_args: Dict[str, Any]) -> int:
        """How many of ``explorer.auxiliary_models`` the tasks use: the opponent model's."""
        opponent = (workflow_args or {}).get("opponent") or {}
        if not isinstance(opponent, dict) or opponent.get("kind") != "model":
            return 0
        index = opponent.get("auxiliary_model", 0)
        return index + 1 if isinstance(index, int) else 0

    def reset(self, task: Task) -> None:
        self.task = task
        where = f"taskset '{task.taskset_name}' row {task.index}"
        try:
            self.args: TextArenaArgs = validate_model(
                TextArenaArgs, task.workflow_args, "workflow_args"
            )
            row = task.raw_task
            self.seed = int(_column(row, "seed", None, numbers.Integral))
            self.env_id = check_env_id(str(_column(row, "env_id", self.args.env_id, str)))
            self.player = int(_column(row, "player_id", self.args.player_id, numbers.Integral))
        except ConfigError as exc:
            raise ValueError(f"{where}: {'; '.join(exc.problems)}") from None
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if not 0 <= self.player < self.args.num_players:
            raise ValueError(f"{where}: column 'player_id' {self.player} is not a seat")
        opponent = self.args.opponent
        if opponent is not None and opponent.kind == "model":
            if len(self.auxiliary_models or []) <= opponent.auxiliary_model:
                raise ValueError(
                    f"{where}: workflow_args.opponent.auxiliary_model = "
                    f"{opponent.auxiliary_model}, but explorer.auxiliary_models has "
                    f"{len(self.auxiliary_models or [])} model(s)"
                )

    async def run_async(self) -> List[Experience]:
        """``rollout_args.n`` episodes, one after the other (``run`` runs this on its loop)."""
        return [await self._episode() for _ in range(self.task.rollout_args.n)]

    def _system(self) -> Messages:
        prompt = self.args.system_prompt
        if prompt is None:
            from textarena.agents.basic_agents import STANDARD_GAME_PROMPT

            prompt = STANDARD_GAME_PROMPT
        return [{"role": "system", "content": prompt}] if prompt else []

    def _opponent(self) -> Optional[Any]:
        args = self.args.opponent
        if args is None:
            return None
        if args.kind == "random":
            return RandomOpponent(args.moves, self.seed)
        client = self.auxiliary_models[args.auxiliary_model]
        return ModelOpponent(client, args, self._system())

    async def _episode(self) -> Experience:
        """One game from its start, as one experience."""
        game = Game(self.env_id, self.args.env_kwargs, self.args.num_players, self.seed)
        opponent = self._opponent()
        messages, calls = self._system(), []
        done, end = False, "game_over"
        while not done:
            player, seen = game.observe()
            if player != self.player:
                done = game.step(await opponent.move(game, seen))
                continue
            if len(calls) == self.args.max_turns:
                end = "max_turns"
                break
            text = observation_text(game, self.player, seen)
            messages = messages + [{"role": "user", "content": text}]
            budget = self.task.rollout_args.max_tokens
            room = await reply_room(self.model, messages, calls, budget)
            if room is not None and room <= 0:
                end = "max_tokens"
                break
            cap = self.args.max_reply_tokens
            room = cap if room is None else min(room, cap or room)
            sampling = turn_sampling(self.task.rollout_args, max_tokens=room)
            reply = (await self.model.chat_async(messages, **sampling))[0]
            calls.append(reply)
            # The reply as returned: the engine continues its sampled tokens from it.
            messages = messages + [{"role": "assistant", "content": reply.response_text}]
            done = game.step(reply.response_text or "")
        if not calls:
            raise RuntimeError(f"{game.label} ended before the trained player's first turn")
        return self._experience(game, calls, done, end)

    def _experience(self, game: Game, calls: List[Experience], done: bool, end: str) -> Experience:
        """The episode as one experience: the game's reward and its metrics."""
        rewards, info = game.close() if done else ({}, {})
        reward = rewards.get(self.player, 0.0)
        mine = info.get(self.player, {})
        metrics = {
            "turns": float(len(calls)),
            "game_over": float(done),
            "invalid_move": float(bool(mine.get("invalid_move", False))),
        }
        if self.args.num_players == 2:
            other = rewards.get(1 - self.player, 0.0) if done else reward
            metrics.update(win=float(reward > other), draw=float(done and reward == other))
            metrics["loss"] = float(reward < other)
        details = {"env_id": self.env_id, "seed": self.seed, "end": end}
        details["reason"] = str(mine.get("reason", ""))
        exp = merge_turns(calls, reward=reward, info={**metrics, **details})
        exp.metrics.update(metrics)
        return exp


class ModelOpponent:
    """An auxiliary model in the other seat: its own conversation of the game (the same
    system turn, the game's messages to it, its replies), one chat completion a move."""

    def __init__(self, client: Any, args: OpponentArgs, system: Messages) -> None:
        self.client, self.args = client, args
        self.messages: Messages = list(system)

    async def move(self, game: Game, seen: List[Message]) -> str:
        player = game.base.state.current_player_id
        self.messages.append({"role": "user", "content": observation_text(game, player, seen)})
        sized = {} if self.args.max_tokens is None else {"max_tokens": self.args.max_tokens}
        reply = await asyncio.to_thread(
            self.client.chat.completions.create,
            model=self.client.model_path,
            messages=self.messages,
            temperature=self.args.temperature,
            **sized,
        )
        text = reply.choices[0].message.content or ""
        self.messages.append({"role": "assistant", "content": text})
        return text
