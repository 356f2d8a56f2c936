"""A single-turn verifiers environment: say a word; the reward counts the reply's characters.

The reward is ``0.5 * min(len(reply), 20) / 20`` (weight 0.5), the metric ``chars`` the reply's
length: values a test derives from the reply text alone. ``fail_on`` makes the reward raise
for a task whose prompt contains it (an environment that raises mid-episode).
"""

import verifiers.v1 as vf


class EchoData(vf.TaskData):
    word: str = ""


class EchoTaskConfig(vf.TaskConfig):
    fail_on: str = ""


class EchoTask(vf.Task[EchoData, vf.State, EchoTaskConfig]):
    @vf.reward(weight=0.5)
    async def length(self, trace: vf.Trace) -> float:
        if self.config.fail_on and self.config.fail_on in self.data.prompt:
            raise RuntimeError(f"scoring broke on '{self.config.fail_on}'")
        return min(len(_reply(trace)), 20) / 20

    @vf.metric
    async def chars(self, trace: vf.Trace) -> float:
        return float(len(_reply(trace)))


def _reply(trace: vf.Trace) -> str:
    return (trace.last_message.content or "") if trace.nodes else ""


class EchoConfig(vf.TasksetConfig):
    num_tasks: int = 4
    task: EchoTaskConfig = EchoTaskConfig()


class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self) -> list:
        words = ["apple", "river", "stone", "cloud", "flame", "grass"]
        return [
            EchoTask(EchoData(prompt=f"Say {w}.", word=w), self.config.task)
            for w in words[: self.config.num_tasks]
        ]


__all__ = ["EchoTaskset"]
