"""The workload of ``bench/async.py --workload delayed``: arithmetic episodes whose environment
answers after a real delay, as a remote sandbox or tool server would.

The model answers the task's question (``rollout_args.n`` samples in one call); the
environment then takes 0.1 to 2 s (uniform, seeded by the question: the same delays on every
side) to check the answers and hand back the verdict, ``math_reward``. The delay is a sleep:
it costs the explorer time but no CPU, which is where asynchrony pays. One model turn: the
quickstart's SFT model answers single questions only, so a second turn would score 0 and
leave nothing to learn; the environment's turn is what the benchmark needs.
"""

import random
import time
from typing import Any, List

from trinity.common.experience import Experience
from trinity.common.rewards import REWARD_FUNCTIONS, total_reward
from trinity.common.workflows import WORKFLOWS, Task, Workflow

DELAY_S = (0.1, 2.0)


@WORKFLOWS.register_module("delayed_tool_arithmetic")
class DelayedToolArithmetic(Workflow):
    def __init__(self, model: Any, task: Task, auxiliary_models: Any = None) -> None:
        super().__init__(model, task, auxiliary_models)
        self.reward_fn = REWARD_FUNCTIONS.get("math_reward")()

    def run(self) -> List[Experience]:
        row, args = self.task.raw_task, self.task.rollout_args
        question = [{"role": "user", "content": str(row["question"])}]
        replies = self.model.chat(
            question, n=args.n, temperature=args.temperature, max_tokens=args.max_tokens
        )
        time.sleep(random.Random(str(row["question"])).uniform(*DELAY_S))  # the environment
        for reply in replies:
            components = self.reward_fn(reply.response_text, str(row["answer"]))
            reply.reward = total_reward(components)
            reply.metrics.update(components)
        return replies
