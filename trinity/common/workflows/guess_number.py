"""``guess_number_workflow``: the multi-turn "guess the number" game (``trinity.demo``).

Each task is one game; the workflow plays ``rollout_args.n`` episodes of it, one model call
per turn, and returns one ``Experience`` per episode. The dialogue grows turn by turn: the
model's reply (``response_text``) and the environment's answer are appended to the messages
of the next call. With ``explorer.rollout_model.enable_history`` the wrapper records every
call with its exact prompt and sampled tokens; after each episode the workflow takes that
record (``extract_experience_from_history``) and merges it into one experience
(``merge_turns``): the tokens the model sampled are trained on, the environment's messages
are context. Reward: 1.0 if the secret was found within ``max_turns``, else 0.0; metrics
``accuracy`` (the same 1/0) and ``turns``. Each turn's environment state (the interval and
the guesses left, ``GuessNumberEnv.state``) goes into the experience's ``turn_states``.
"""

from __future__ import annotations

from typing import Any, Dict, Generator, List

from trinity.common.experience import Experience
from trinity.common.workflows.multiturn import merge_turns, turn_sampling
from trinity.common.workflows.workflow import WORKFLOWS, ResettableWorkflow, Task
from trinity.demo.guess_number import GuessNumberEnv, GuessNumberTask

Messages = List[Dict[str, Any]]
# Yields the conversation to send, receives the model's reply, returns the episodes.
Episodes = Generator[Messages, Experience, List[Experience]]


@WORKFLOWS.register_module("guess_number_workflow")
class GuessNumberWorkflow(ResettableWorkflow):
    """Plays ``rollout_args.n`` episodes of one guess-the-number game (needs
    ``explorer.rollout_model.enable_history: true``)."""

    records_turn_states = True

    def reset(self, task: Task) -> None:
        self.task = task
        try:
            self.game = GuessNumberTask.from_row(task.raw_task)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"taskset '{task.taskset_name}' row {task.index}: {exc}") from None
        self.sampling = turn_sampling(task.rollout_args)

    def run(self) -> List[Experience]:
        episodes = self._episodes()
        try:
            messages = next(episodes)
            while True:
                messages = episodes.send(self.model.chat(messages, **self.sampling)[0])
        except StopIteration as done:
            return done.value

    async def run_async(self) -> List[Experience]:
        episodes = self._episodes()
        try:
            messages = next(episodes)
            while True:
                replies = await self.model.chat_async(messages, **self.sampling)
                messages = episodes.send(replies[0])
        except StopIteration as done:
            return done.value

    def _episodes(self) -> Episodes:
        """The episodes of ``run`` and ``run_async``, whichever way the model is called."""
        self.model.extract_experience_from_history()  # drop calls of an attempt that failed
        experiences = []
        for _ in range(self.task.rollout_args.n):
            env = GuessNumberEnv(self.game)
            messages: Messages = [{"role": "user", "content": env.opening()}]
            states = []
            while True:
                states.append(env.state())
                reply = yield messages
                feedback = env.step(reply.response_text or "")
                # The reply as returned: the wrapper continues its sampled tokens from it.
                messages = messages + [{"role": "assistant", "content": reply.response_text}]
                if feedback.done:
                    break
                messages = messages + [{"role": "user", "content": feedback.text}]
            experiences.append(self._experience(env, states))
        return experiences

    def _experience(self, env: GuessNumberEnv, states: List[str]) -> Experience:
        """The episode just played, from the wrapper's record of its calls."""
        calls = self.model.extract_experience_from_history()
        if len(calls) != env.turns:
            raise RuntimeError(
                f"the model's history holds {len(calls)} call(s) for an episode of {env.turns} "
                "turn(s): calls from elsewhere were recorded with it (history must be per task)"
            )
        success = float(env.success)
        exp = merge_turns(calls, reward=success, info={"success": env.success}, states=states)
        exp.metrics.update(accuracy=success, turns=float(env.turns))
        return exp
