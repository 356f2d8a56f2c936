# math_workflow that returns nothing for every other task: each explore step then fills half
# of the train batch, and the replay buffer has room to fill.
from typing import List

from trinity.common.experience import Experience
from trinity.common.workflows.simple import MathWorkflow
from trinity.common.workflows.workflow import WORKFLOWS


@WORKFLOWS.register_module("half_math_workflow")
class HalfMathWorkflow(MathWorkflow):
    def run(self) -> List[Experience]:
        return [] if self.task.index % 2 else super().run()
