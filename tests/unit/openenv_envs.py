"""An OpenEnv environment for the openenv_workflow tests, written with openenv-core's API.

LetterEnv: reset(seed) picks a letter (``letter(seed)``); each step's reward is how many times
the reply holds it, a tenth each; "stop" in a reply ends the episode, and so does the third
step; "boom" makes the environment raise. Served by ``app`` (openenv's ``create_app``).
"""

import random
import string
from typing import Any, Optional

from openenv.core.env_server import Action, Environment, Observation, State, create_app

LAST_STEP = 3


def letter(seed: Optional[int]) -> str:
    return random.Random(seed).choice(string.ascii_lowercase[:5])


def step_reward(reply: str, seed: Optional[int]) -> float:
    return reply.count(letter(seed)) / 10


class LetterAction(Action):
    message: str


class LetterObservation(Observation):
    prompt: str
    turn: int = 0


class LetterEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.seed: Optional[int] = None

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kw: Any):
        self._state, self.seed = State(step_count=0), seed
        suffix = f" ({kw['note']})" if "note" in kw else ""
        return LetterObservation(prompt=f"Write words with many '{letter(seed)}'{suffix}.")

    def step(self, action: LetterAction, timeout_s: Optional[float] = None, **kw: Any):
        if "boom" in action.message:
            raise RuntimeError("the letter machine broke")
        self._state.step_count += 1
        turn = self._state.step_count
        done = "stop" in action.message or turn == LAST_STEP
        reward = step_reward(action.message, self.seed)
        return LetterObservation(prompt=f"Turn {turn}: more.", turn=turn, reward=reward, done=done)

    @property
    def state(self) -> State:
        return self._state


def turn_text(observation: dict) -> str:
    """observation_to_text for the tests: the turn number and the prompt."""
    return f"#{observation['turn']} {observation['prompt']}"


def shouting(reply: str, observation: dict) -> dict:
    """reply_to_action for the tests: the reply in capitals."""
    return {"message": reply.upper()}


app = create_app(LetterEnv, LetterAction, LetterObservation, max_concurrent_envs=64)
