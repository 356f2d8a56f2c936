"""Workflows: how a task is run against the model (docs/reference/plugin-api.md, "Workflows").

To add one: subclass ``Workflow``, implement ``run() -> List[Experience]`` (and optionally
``resettable``/``reset``), decorate it with ``@WORKFLOWS.register_module("my_workflow")``, and
put the module in ``trinity/plugins/`` or a directory passed with ``--plugin-dir``. Name it
in ``buffer.explorer_input.taskset.default_workflow_type``. Interface and a tested example:
docs/extending.md. A built-in whose per-task state is all set by ``reset`` subclasses
``workflow.ResettableWorkflow`` (its ``__init__`` calls ``reset``).
"""

from trinity.common.workflows.boxed import MathBoxedWorkflow
from trinity.common.workflows.frozen_lake import FrozenLakeWorkflow
from trinity.common.workflows.guess_number import GuessNumberWorkflow
from trinity.common.workflows.judge import LLMJudgeWorkflow
from trinity.common.workflows.judging import JudgedWorkflow, JudgeReplyError
from trinity.common.workflows.math_ruler import MathRulerWorkflow
from trinity.common.workflows.math_trainable_ruler import MathTrainableRulerWorkflow
from trinity.common.workflows.openenv import OpenEnvWorkflow
from trinity.common.workflows.qwen_math import (
    MathEvalWorkflow,
    OnPolicyDistillMathWorkflow,
    OnPolicyDistillWorkflow,
)
from trinity.common.workflows.reasoning_gym import ReasoningGymWorkflow
from trinity.common.workflows.rubric import RubricWorkflow
from trinity.common.workflows.rubric_judge import RubricJudgeAPIWorkflow, RubricJudgeWorkflow
from trinity.common.workflows.ruler import RulerWorkflow
from trinity.common.workflows.simple import MathWorkflow, SimpleWorkflow
from trinity.common.workflows.textarena import TextArenaWorkflow
from trinity.common.workflows.toolcall import ToolCallWorkflow
from trinity.common.workflows.verifiers import VerifiersWorkflow
from trinity.common.workflows.workflow import WORKFLOWS, Task, Workflow

__all__ = [
    "WORKFLOWS",
    "Task",
    "Workflow",
    "SimpleWorkflow",
    "MathWorkflow",
    "MathBoxedWorkflow",
    "MathEvalWorkflow",
    "OnPolicyDistillWorkflow",
    "OnPolicyDistillMathWorkflow",
    "ToolCallWorkflow",
    "GuessNumberWorkflow",
    "FrozenLakeWorkflow",
    "TextArenaWorkflow",
    "OpenEnvWorkflow",
    "ReasoningGymWorkflow",
    "VerifiersWorkflow",
    "LLMJudgeWorkflow",
    "JudgedWorkflow",
    "JudgeReplyError",
    "RulerWorkflow",
    "MathRulerWorkflow",
    "MathTrainableRulerWorkflow",
    "RubricWorkflow",
    "RubricJudgeWorkflow",
    "RubricJudgeAPIWorkflow",
]
