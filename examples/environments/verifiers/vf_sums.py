"""A verifiers environment (verifiers 0.4, ``verifiers.v1``): sums of two numbers, one turn.

Written with verifiers' own API, as an environment package would be: a ``Taskset`` exported in
``__all__``, its tasks' data, a ``@vf.reward`` and a ``@vf.metric``. ``seed`` and
``num_tasks`` (``workflow_args.env_args``) fix the tasks; the held-out tasks are another seed's.
"""

import random
import re

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: int = 0


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the reply's last number is the sum."""
        numbers = re.findall(r"-?\d+", _reply(trace))
        return 1.0 if numbers and int(numbers[-1]) == self.data.answer else 0.0

    @vf.metric
    async def answered(self, trace: vf.Trace) -> float:
        """1 when the reply holds a number at all."""
        return 1.0 if re.search(r"\d", _reply(trace)) else 0.0


def _reply(trace: vf.Trace) -> str:
    return (trace.last_message.content or "") if trace.nodes else ""


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 64
    seed: int = 0
    max_value: int = 20


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> list:
        draw = random.Random(self.config.seed)
        tasks = []
        for _ in range(self.config.num_tasks):
            a, b = draw.randint(1, self.config.max_value), draw.randint(1, self.config.max_value)
            prompt = f"What is {a} + {b}? Answer with the number only."
            tasks.append(SumTask(SumData(prompt=prompt, answer=a + b), self.config.task))
        return tasks


__all__ = ["SumTaskset"]
