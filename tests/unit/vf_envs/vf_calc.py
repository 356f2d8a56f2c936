"""A multi-turn verifiers environment with a tool: add two numbers with ``calc_add``; the reward
is 1 when the last reply holds the sum."""

import verifiers.v1 as vf
from vf_calc_tool import CalcToolset


class CalcData(vf.TaskData):
    answer: str = ""


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        reply = (trace.last_message.content or "") if trace.nodes else ""
        return 1.0 if self.data.answer in reply else 0.0


class CalcConfig(vf.TasksetConfig):
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self) -> list:
        return [
            CalcTask(CalcData(prompt="What is 2+3? Use the tool.", answer="5"), self.config.task)
        ]


__all__ = ["CalcTaskset"]
