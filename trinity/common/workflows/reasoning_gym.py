"""``reasoning_gym_workflow``: a reasoning-gym task, asked and scored as reasoning-gym does.

The rows come from a ``storage_type: reasoning_gym`` taskset (``trinity.buffer.storages``).
The prompt is reasoning-gym's: its system prompt (``SYSTEM_PROMPTS[workflow_args.
system_prompt]``, ``default`` unless set: think step by step, then the answer alone in
``<answer>...</answer>``) and the question as the user turn; the taskset's
``format.system_prompt`` replaces that system prompt. ``rollout_args.n`` replies are sampled
and each scored by ``reasoning_gym_reward`` (the dataset's own ``score_answer`` of the tagged
answer) unless the taskset names another reward.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Dict, List

from pydantic import Field, field_validator

from trinity.common.config.base import ConfigModel
from trinity.common.workflows.simple import SimpleWorkflow, with_default_system
from trinity.common.workflows.workflow import WORKFLOWS, Task, read_workflow_args
from trinity.utils.suggest import did_you_mean


def system_prompts() -> Dict[str, str]:
    """reasoning-gym's system prompts by name (``reasoning_gym.utils.SYSTEM_PROMPTS``)."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return SYSTEM_PROMPTS


class ReasoningGymArgs(ConfigModel):
    """``workflow_args`` of ``reasoning_gym_workflow``."""

    system_prompt: str = Field(
        "default",
        description="Name of reasoning-gym's system prompt (reasoning_gym.utils.SYSTEM_PROMPTS: "
        "default, DeepSeekZero, simple, direct, chain_of_draft).",
    )
    greedy_baseline: bool = Field(
        False, description="Also score a greedy answer as ReMax's baseline (info)."
    )

    @field_validator("system_prompt")
    @classmethod
    def _known(cls, value: str) -> str:
        if importlib.util.find_spec("reasoning_gym") is None:
            return value  # the missing package is said once, by the workflow's check
        names = list(system_prompts())
        if value not in names:
            raise ValueError(
                f"reasoning-gym has no system prompt '{value}'{did_you_mean(value, names)} "
                f"({', '.join(names)})"
            )
        return value


@WORKFLOWS.register_module("reasoning_gym_workflow")
class ReasoningGymWorkflow(SimpleWorkflow):
    """reasoning-gym's system prompt and question; its dataset's own score of each reply."""

    default_reward_fn = "reasoning_gym_reward"
    args_model = ReasoningGymArgs
    needs_packages = {"reasoning_gym": "reasoning_gym"}

    def reset(self, task: Task) -> None:
        self.args = read_workflow_args(ReasoningGymArgs, task)
        super().reset(task)

    def prompt_messages(self, task: Task) -> List[Dict[str, Any]]:
        system = system_prompts()[self.args.system_prompt]
        return with_default_system(super().prompt_messages(task), task, system)
