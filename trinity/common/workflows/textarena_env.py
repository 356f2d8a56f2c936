"""TextArena's games for ``textarena_workflow``: one game played through textarena's own API.

A ``Game`` is ``textarena.make(env_id, **env_kwargs)`` reset with ``num_players`` and a seed.
Moves go through the game's registered action wrappers (``ActionFormattingWrapper`` puts a
bare move in brackets); observations are read from the game itself, below its observation
wrappers: textarena's ``LLMObservationWrapper`` returns the whole history every turn, while a
conversation needs only what is new since the player's last move (each turn's prompt must
continue the previous turn's tokens, ``multiturn.merge_turns``).

textarena's states seed and draw from the global ``random`` module (``State.__init__`` calls
``random.seed``), so games running at once in a runner's threads or coroutines would draw
from each other's sequences. Each game keeps its own state of that module and swaps it in,
under one lock, around each call into textarena: a seed gives the same game whatever else
runs (draws of numpy's generator, which three games use, are not covered).

textarena is an optional dependency (the ``textarena`` extra), imported on first use; the
checks before start refuse a taskset naming the workflow where it is not installed.
"""

from __future__ import annotations

import copy
import functools
import json
import random
import re
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from trinity.utils.suggest import did_you_mean

INSTALL = 'pip install -e ".[textarena]" (or: pip install textarena)'

# (sender id, text, textarena's ObservationType); sender -1 is the game.
Message = Tuple[int, str, Any]
GAME_ID = -1

_IMPORT_LOCK = threading.Lock()  # two threads importing a package at once can both fail
_RANDOM_LOCK = threading.Lock()  # one game at a time holds the global ``random`` state
# A move as games list them: '[4]', '[col 3]', '[bet]' (no nested brackets, one line).
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")
# nltk's "Resource <name> not found" (the name may be wrapped in terminal colour codes).
_NLTK_RESOURCE = re.compile(r"Resource (?:\x1b\[\d+m)?'?([\w/.-]+?)'?(?:\x1b\[0m)? not found")


class GameError(RuntimeError):
    """A TextArena game raised while it was played: the episode fails (and is counted)."""


def textarena() -> Any:
    """The ``textarena`` module; ``ImportError`` with the install command without it."""
    with _IMPORT_LOCK:
        try:
            import textarena as ta
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] != "textarena":
                raise
            raise ImportError(
                f"textarena_workflow needs the textarena package: {INSTALL}"
            ) from None
    return ta


def check_env_id(env_id: str) -> str:
    """``env_id`` if textarena registers a game under it, else ``ValueError`` naming the
    closest registered id."""
    from textarena.envs.registration import ENV_REGISTRY

    textarena()  # registers the games
    if env_id not in ENV_REGISTRY:
        hint = did_you_mean(env_id, ENV_REGISTRY) or " (textarena.envs.registration.ENV_REGISTRY)"
        raise ValueError(f"TextArena has no game '{env_id}'{hint}")
    return env_id


def why_it_failed(exc: BaseException) -> str:
    """One line saying why a game could not be made or started (nltk's many-line message for
    a missing word list becomes the command that fetches it)."""
    found = _NLTK_RESOURCE.search(str(exc)) if isinstance(exc, LookupError) else None
    if found:
        name = found.group(1)
        return (
            f"it needs NLTK's '{name}' data, which is not on this machine (the game downloads "
            f"it, and no network answered): python -m nltk.downloader {name}"
        )
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


@functools.lru_cache(maxsize=64)
def _probe(env_id: str, kwargs_json: str, num_players: int) -> Optional[str]:
    try:
        Game(env_id, json.loads(kwargs_json), num_players, seed=0)
    except GameError as exc:
        return str(exc)
    return None


def probe_game(env_id: str, env_kwargs: Dict[str, Any], num_players: int) -> Optional[str]:
    """Why ``env_id`` cannot be made with ``env_kwargs`` and reset for ``num_players``
    (one line), or None when it starts; each combination is tried once per process."""
    return _probe(check_env_id(env_id), json.dumps(env_kwargs, sort_keys=True), num_players)


class Game:
    """One game of ``env_id``: ``observe()`` whose turn it is and what is new for that
    player, ``step(move)``, ``accepts(move)`` (tried on a copy), ``close()`` the rewards."""

    def __init__(
        self, env_id: str, env_kwargs: Dict[str, Any], num_players: int, seed: int
    ) -> None:
        ta = textarena()
        self.label = f"{env_id} (seed {seed})"
        self.steps = 0
        self._random = random.Random(seed).getstate()
        try:
            with self._drawing():
                self.env = ta.make(env_id, **env_kwargs)
                self.env.reset(num_players=num_players, seed=seed)
        except Exception as exc:
            raise GameError(f"{self.label} could not start: {why_it_failed(exc)}") from exc
        self.base = self.env
        while isinstance(self.base, ta.Wrapper):  # below the observation wrappers
            self.base = self.base.env

    @contextmanager
    def _drawing(self, keep: bool = True) -> Iterator[None]:
        """The global ``random`` state is this game's while the block runs (``keep``: its
        draws advance the game's state; else they are forgotten: a move only tried)."""
        with _RANDOM_LOCK:
            outside = random.getstate()
            random.setstate(self._random)
            try:
                yield
            finally:
                if keep:
                    self._random = random.getstate()
                random.setstate(outside)

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            with self._drawing():
                return fn(*args)
        except Exception as exc:
            raise GameError(
                f"{self.label} raised at {what} (after {self.steps} move(s)): {why_it_failed(exc)}"
            ) from exc

    def role(self, player_id: int) -> str:
        if player_id == GAME_ID:
            return "GAME"
        return self.base.state.role_mapping.get(player_id, f"Player {player_id}")

    def observe(self) -> Tuple[int, List[Message]]:
        """(the player whose turn it is, the messages that player has not seen yet)."""
        player, messages = self._call("get_observation", self.base.get_observation)
        return int(player), list(messages)

    def step(self, move: str) -> bool:
        """Play ``move`` for the player whose turn it is; whether the game is over."""
        done, _ = self._call("step", self.env.step, move)
        self.steps += 1
        return bool(done)

    def accepts(self, move: str) -> bool:
        """Whether the game takes ``move`` from the player whose turn it is as a valid move
        (played on a copy of the game, whose draws are forgotten)."""
        trial = copy.deepcopy(self.env)
        state = trial.state  # a wrapper passes attributes on to the game it wraps
        player, errors = state.current_player_id, getattr(state, "error_count", 0)
        try:
            with self._drawing(keep=False):
                trial.step(move)
        except Exception:  # a move a game cannot even read is not one it accepts
            return False
        invalid = state.game_info.get(player, {}).get("invalid_move", False)
        return not invalid and getattr(state, "error_count", 0) <= errors

    def close(self) -> Tuple[Dict[int, float], Dict[int, Dict[str, Any]]]:
        """(reward of each player, textarena's game info of each player) of a finished game."""
        rewards, info = self._call("close", self.env.close)
        return {int(k): float(v) for k, v in (rewards or {}).items()}, dict(info or {})


def observation_text(game: Game, player_id: int, messages: Sequence[Message]) -> str:
    """What is new for ``player_id`` as one chat message, a ``[sender] text`` line each (as
    textarena's ``LLMObservationWrapper`` writes them). The player's own moves are left out:
    they are its replies, already in the conversation."""
    lines = [
        f"[{game.role(sender)}] {text.strip()}"
        for sender, text, kind in messages
        if not (sender == player_id and getattr(kind, "name", "") == "PLAYER_ACTION")
    ]
    return "\n".join(lines) or "[GAME] Nothing changed since your last move. Your move."


class RandomOpponent:
    """A scripted opponent: plays a move, drawn from its own seeded generator, among those the
    game accepts of ``moves`` and of every ``[bracketed]`` move its observations showed."""

    def __init__(self, moves: Sequence[str], seed: int) -> None:
        self.candidates: Dict[str, None] = dict.fromkeys(moves)
        self.rng = random.Random(seed)

    async def move(self, game: Game, messages: Sequence[Message]) -> str:
        for _, text, _ in messages:
            self.candidates.update(dict.fromkeys(_BRACKETED.findall(text)))
        valid = [move for move in self.candidates if game.accepts(move)]
        if not valid:
            tried = ", ".join(list(self.candidates)[:10]) or "none"
            raise GameError(
                f"{game.label}: the random opponent found no move the game accepts (tried: "
                f"{tried}); list its moves in workflow_args.opponent.moves"
            )
        return self.rng.choice(valid)
