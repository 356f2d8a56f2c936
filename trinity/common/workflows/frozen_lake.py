"""``frozen_lake_workflow``: the original Trinity-RFT's FrozenLake game, one walk an episode.

Each task is one lake: drawn from the row's ``size``, ``p`` (the share of frozen tiles) and
``seed`` (``frozen_lake_env.generate_map``, the original's maps), or the same lake for every
task where ``workflow_args.desc`` gives one. The workflow plays ``rollout_args.n`` walks of it.
A walk is one conversation: the rules as the system turn, then each turn a user message with
the grid and the model's reply, whose last fenced block is the move (``parse_action``).

A walk ends on the goal (reward 1), in a hole (reward 0), after ``agent_max_steps`` replies
(reward 0), or when its token budget is spent (reward 0): the replies and the messages
between them may take ``rollout_args.max_tokens`` tokens in all (``model.max_response_tokens``
unless the taskset sets it), each reply at most what is left. Each turn's prompt continues
the previous turn's exact tokens (``trinity.engine.conversation``), so the calls of a walk
merge into one experience (``merge_turns``): the replies are trained on, the rules and the
grids are context. No record of the calls is needed (``enable_history``): the workflow keeps
the replies the model returns. Metrics, as the original's: ``env_steps`` (moves answered),
``env_done`` (1 when the walk ended on the goal or in a hole) and ``test_score`` (the reward).
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, List, Optional, Tuple

from pydantic import Field, field_validator

from trinity.common.config.base import ConfigModel, validate_model
from trinity.common.experience import Experience
from trinity.common.workflows.frozen_lake_env import (
    FrozenLake,
    check_desc,
    generate_map,
    parse_action,
)
from trinity.common.workflows.multiturn import merge_turns, reply_room, turn_sampling
from trinity.common.workflows.workflow import WORKFLOWS, Task, Workflow

# The row columns' defaults, the original's; a drawn lake needs its size.
DEFAULT_P, DEFAULT_SEED = 0.8, 42

SYSTEM_PROMPT = """You are on a frozen lake. Walk the player P onto the goal G, one move at a time.

The grid shows one tile a cell:
P player | _ frozen ice | O hole | G goal

- Walking into a hole O ends the game: reward 0.
- Standing on the goal G ends the game: reward 1.0.
- The ice can be slippery, so a move may now and then take you sideways; do not dwell on it.

Moves: Up | Down | Left | Right

Each turn you see the grid as it is now. Think it through, then end your reply with the next \
move alone inside ``` ```, for example ```Left```. Reach G in as few moves as you can."""

STUCK = (
    "P did not move after your last reply. Check your reasoning and how you wrote the move: "
    "the next move alone inside ``` ```, such as ```Up``` to go up."
)


class FrozenLakeArgs(ConfigModel):
    """``workflow_args`` of ``frozen_lake_workflow`` (the original's names and defaults)."""

    env_max_steps: int = Field(
        8,
        ge=0,
        description="A drawn lake's goal is at most env_max_steps + 1 moves from its start "
        "(the depth of the generator's search).",
    )
    agent_max_steps: int = Field(
        10, ge=1, description="Replies a walk may take; one not over by then scores 0."
    )
    desc: Optional[List[str]] = Field(
        None,
        description="One lake for every task, a string of S/F/H/G tiles a row (one S, a G); "
        "unset: each row's size, p and seed draw its lake.",
    )
    is_slippery: bool = Field(
        False,
        description="A move goes the way asked or to either side of it (1/3 each), drawn "
        "from the row's seed.",
    )

    @field_validator("desc")
    @classmethod
    def _a_lake(cls, value: Optional[List[str]]) -> Optional[List[str]]:
        return None if value is None else check_desc(value)


def turn_message(step: int, grid: str, stuck: bool, moves_left: int) -> str:
    """The user message of turn ``step`` (from 0): the grid, a note when the last reply left
    the player where it was, and the replies left."""
    lines = [f"Current observation ({step}):", grid, "P is not on G yet. What is your next move?"]
    if stuck:
        lines.append(STUCK)
    lines.append(f"You have at most {moves_left} more move(s).")
    return "\n".join(lines)


def _column(row: Dict[str, Any], key: str, default: Any, kind: type) -> Any:
    """Column ``key`` of ``row`` (``default`` when absent), checked to be a ``kind`` number."""
    value = row.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"column '{key}' must be a number ({kind.__name__}), got {value!r}")
    return value


def read_lake(row: Dict[str, Any], args: FrozenLakeArgs) -> Tuple[List[str], int]:
    """(lake, seed) of a task: ``args.desc`` or the map ``size``, ``p``, ``seed`` draw."""
    seed = int(_column(row, "seed", DEFAULT_SEED, numbers.Integral))
    if seed < 0:
        raise ValueError(f"column 'seed' must be 0 or more, got {seed}")
    if args.desc is not None:
        return args.desc, seed
    if "size" not in row:
        raise ValueError(f"a drawn lake needs the column 'size' (columns: {sorted(row)})")
    size = int(_column(row, "size", None, numbers.Integral))
    p = float(_column(row, "p", DEFAULT_P, numbers.Real))
    if p < 0:
        raise ValueError(f"column 'p' (the share of frozen tiles) must be 0 or more, got {p}")
    return generate_map(size, p, seed, args.env_max_steps), seed


@WORKFLOWS.register_module("frozen_lake_workflow")
class FrozenLakeWorkflow(Workflow):
    """Plays ``rollout_args.n`` walks on one task's frozen lake, each one experience."""

    args_model = FrozenLakeArgs
    records_turn_states = True
    needs_packages = {"gymnasium": "envs"}

    def __init__(self, model: Any, task: Task, auxiliary_models: Optional[List] = None) -> None:
        super().__init__(model, task, auxiliary_models)
        self.args: FrozenLakeArgs = validate_model(FrozenLakeArgs, task.workflow_args)
        try:
            self.desc, self.seed = read_lake(task.raw_task, self.args)
        except ValueError as exc:
            raise ValueError(f"taskset '{task.taskset_name}' row {task.index}: {exc}") from None

    async def run_async(self) -> List[Experience]:
        """``rollout_args.n`` walks, one after the other (``run`` runs this on its own loop)."""
        return [await self._walk() for _ in range(self.task.rollout_args.n)]

    async def _walk(self) -> Experience:
        """One walk from the start, as one experience."""
        lake = FrozenLake(self.desc, self.args.is_slippery, self.seed)
        messages: List[Dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
        calls: List[Experience] = []
        states: List[str] = []
        reward, done, end, previous = 0.0, False, "max_steps_reached", None
        for step in range(self.args.agent_max_steps):
            grid, moves_left = lake.render(), self.args.agent_max_steps - step
            text = turn_message(step, grid, grid == previous, moves_left)
            messages = messages + [{"role": "user", "content": text}]
            budget = self.task.rollout_args.max_tokens
            room = await reply_room(self.model, messages, calls, budget)
            if room is not None and room <= 0:
                end = "max_tokens_reached"
                break
            sampling = turn_sampling(self.task.rollout_args, max_tokens=room)
            reply = (await self.model.chat_async(messages, **sampling))[0]
            calls.append(reply)
            states.append(f"P at {lake.player} with {moves_left} move(s) left")
            # The reply as returned: the engine continues its sampled tokens from it.
            messages = messages + [{"role": "assistant", "content": reply.response_text}]
            reward, done = lake.step(parse_action(reply.response_text or ""))
            previous = grid
            if done:
                end = "goal" if reward > 0 else "hole"
                break
        return self._experience(calls, states, reward, done, end)

    def _experience(
        self, calls: List[Experience], states: List[str], reward: float, done: bool, end: str
    ) -> Experience:
        """The walk as one experience, with the original's metrics."""
        metrics = {"env_steps": float(len(calls)), "env_done": float(done), "test_score": reward}
        exp = merge_turns(
            calls, reward=reward, info={**metrics, "terminate_reason": end}, states=states
        )
        exp.metrics.update(metrics)
        return exp
