"""The workflow ``bench/concurrency.py`` measures: three turns per episode on arithmetic tasks.

Turn 1 asks the task's question, turns 2 and 3 ask the model to check and restate its answer;
the reward is ``math_reward`` of the last reply, which is the experience returned (its tokens
hold the whole conversation). ``run`` talks to the model with ``chat`` (blocking: for
``concurrent_mode: multi-threading``), ``run_async`` with ``chat_async`` (for
``asynchronous``); both drive one dialogue, so the two modes run the same episode.
"""

from typing import Any, Dict, Generator, List

from trinity.common.experience import Experience
from trinity.common.rewards import REWARD_FUNCTIONS, total_reward
from trinity.common.workflows import WORKFLOWS, Task, Workflow

FOLLOW_UPS = ("Check your answer.", "Final answer?")

Messages = List[Dict[str, Any]]


@WORKFLOWS.register_module("multi_turn_arithmetic")
class MultiTurnArithmetic(Workflow):
    """``rollout_args.n`` episodes of ``1 + len(FOLLOW_UPS)`` turns, one after another."""

    def __init__(self, model: Any, task: Task, auxiliary_models: Any = None) -> None:
        super().__init__(model, task, auxiliary_models)
        self.reward_fn = REWARD_FUNCTIONS.get("math_reward")()

    def dialogue(self) -> Generator[Messages, Experience, Experience]:
        """Yields each turn's conversation; is sent the reply; returns the scored last one."""
        row = self.task.raw_task
        messages: Messages = [{"role": "user", "content": str(row["question"])}]
        reply = yield messages
        for follow_up in FOLLOW_UPS:
            messages = messages + [
                {"role": "assistant", "content": reply.response_text},
                {"role": "user", "content": follow_up},
            ]
            reply = yield messages
        components = self.reward_fn(reply.response_text, str(row["answer"]))
        reply.reward = total_reward(components)
        reply.metrics.update(components)
        return reply

    def _args(self) -> Dict[str, Any]:
        args = self.task.rollout_args
        return dict(n=1, temperature=args.temperature, max_tokens=args.max_tokens)

    def run(self) -> List[Experience]:
        episodes = []
        for _ in range(self.task.rollout_args.n):
            turns = self.dialogue()
            try:
                messages = next(turns)
                while True:
                    messages = turns.send(self.model.chat(messages, **self._args())[0])
            except StopIteration as done:
                episodes.append(done.value)
        return episodes

    async def run_async(self) -> List[Experience]:
        episodes = []
        for _ in range(self.task.rollout_args.n):
            turns = self.dialogue()
            try:
                messages = next(turns)
                while True:
                    replies = await self.model.chat_async(messages, **self._args())
                    messages = turns.send(replies[0])
            except StopIteration as done:
                episodes.append(done.value)
        return episodes
