# An asynchronous plugin workflow (concurrent_mode: asynchronous): each task runs its
# rollout_args.n episodes at once, each two turns of chat_async; the reward (a parity rule an
# untrained model earns about half the time, so advantages are not all zero) scores the last
# reply. It also reports how many tasks its event loop has run, to show a runner's tasks
# share one long-lived loop (a thread runner would give each task a fresh loop: always 1).
import asyncio
from collections import Counter
from typing import List

from trinity.common.experience import Experience
from trinity.common.workflows import Workflow
from trinity.common.workflows.workflow import WORKFLOWS

_TASKS_PER_LOOP: Counter = Counter()


@WORKFLOWS.register_module("async_two_turns")
class AsyncTwoTurns(Workflow):
    async def episode(self) -> Experience:
        messages = [{"role": "user", "content": self.task.raw_task["question"]}]
        (reply,) = await self.model.chat_async(messages, n=1)
        messages += [
            {"role": "assistant", "content": reply.response_text},
            {"role": "user", "content": "Sure?"},
        ]
        (reply,) = await self.model.chat_async(messages, n=1)
        reply.reward = float(len(reply.response_text) % 2 == 0)
        return reply

    async def run_async(self) -> List[Experience]:
        loop = id(asyncio.get_running_loop())
        _TASKS_PER_LOOP[loop] += 1
        replies = await asyncio.gather(*(self.episode() for _ in range(self.task.rollout_args.n)))
        for reply in replies:
            reply.metrics["tasks_on_loop"] = float(_TASKS_PER_LOOP[loop])
        return list(replies)
