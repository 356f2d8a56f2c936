"""A small OpenEnv environment for examples/environments/openenv.yaml: guess a number from 1
to 9, told "higher" or "lower" after each guess; reward 1 for the guess that finds it.

Written with openenv-core's own API (an ``Environment`` with its Action and Observation
types, served by ``create_app``), as any OpenEnv environment is; ``openenv_workflow`` serves
``guess_env:app`` itself (``workflow_args.app``), or run it yourself and set ``url``:

    uvicorn guess_env:app --app-dir examples/environments/openenv --port 8000
"""

import random
import re
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server import Action, Environment, Observation, State, create_app

HIGHEST = 9


class GuessAction(Action):
    message: str  # a reply; its first number is the guess


class GuessObservation(Observation):
    text: str


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each WebSocket session has its own instance

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.secret = 1

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kw: Any):
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = random.Random(seed).randint(1, HIGHEST)
        rules = f"I am thinking of a number from 1 to {HIGHEST}. Reply with your guess."
        return GuessObservation(text=rules)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kw: Any):
        self._state.step_count += 1
        found = re.search(r"\d+", action.message)
        if found is None:
            return GuessObservation(text="Reply with a number.", reward=0.0)
        guess = int(found.group())
        if guess == self.secret:
            return GuessObservation(text="Found it.", reward=1.0, done=True)
        hint = "higher" if guess < self.secret else "lower"
        return GuessObservation(text=f"{guess} is wrong: the number is {hint}.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=64)
