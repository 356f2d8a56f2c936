# A MathWorkflow that takes at least a second a task: an explorer as slow as a real one, so
# the trainer of a decoupled run saves checkpoints while the explorer still explores (with
# the micro model an explorer finishes six steps before the first checkpoint exists).
import time

from trinity.common.workflows.simple import MathWorkflow
from trinity.common.workflows.workflow import WORKFLOWS


@WORKFLOWS.register_module("slow_math_workflow")
class SlowMathWorkflow(MathWorkflow):
    def run(self):
        time.sleep(1.0)
        return super().run()
