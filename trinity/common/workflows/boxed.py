"""``math_boxed_workflow``: a math problem answered with the final answer in ``\\boxed{}``.

The original Trinity-RFT's boxed math workflow. The policy is asked to reason step by step
and box its answer: the system prompt is the taskset's ``format.system_prompt``, else
``BOXED_PROMPT`` (``THINK_PROMPT`` when ``workflow_args.with_think``). Each answer is scored by
``math_boxed_reward`` unless the taskset names another reward, which is also given
``with_think`` and ``format_score_coef`` (the reward's format penalty) and the answer's token
count (``response_tokens``, DAPO's overlong penalty). With ``workflow_args.use_base`` the
prompt is plain text for a base model, ``System:<system>\\nUser:\\n<question>\\nAssistant:\\n``,
sampled without the chat template.
"""

from __future__ import annotations

from typing import Any, Dict, List

from pydantic import Field

from trinity.common.config.base import ConfigModel
from trinity.common.experience import Experience
from trinity.common.workflows.simple import SimpleWorkflow, with_default_system
from trinity.common.workflows.workflow import WORKFLOWS, Task, read_workflow_args

# Qwen2.5-Math's chain-of-thought instruction, which the original uses as its default.
BOXED_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
THINK_PROMPT = (
    "You solve math problems. Think the problem through first, writing your reasoning as "
    "<think>\n your reasoning </think>\n, then give the final answer as a closed form "
    "inside \\boxed{}."
)


class BoxedArgs(ConfigModel):
    """``workflow_args`` of ``math_boxed_workflow``."""

    use_base: bool = Field(
        False,
        description="Prompt with plain text 'System:...\\nUser:\\n...\\nAssistant:\\n' (a base "
        "model) instead of the chat template.",
    )
    with_think: bool = Field(
        False,
        description="Ask for one <think>...</think> block; an answer without it loses "
        "format_score_coef (math_boxed_reward).",
    )
    format_score_coef: float = Field(
        0.1, ge=0, description="What an answer without its think block loses (with_think)."
    )
    greedy_baseline: bool = Field(
        False, description="Also score a greedy answer as ReMax's baseline (info)."
    )


@WORKFLOWS.register_module("async_math_boxed_workflow")  # the same: see simple_workflow
@WORKFLOWS.register_module("math_boxed_workflow")
class MathBoxedWorkflow(SimpleWorkflow):
    """Reason step by step, box the answer; ``math_boxed_reward`` by default."""

    default_reward_fn = "math_boxed_reward"
    args_model = BoxedArgs

    def reset(self, task: Task) -> None:
        self.args = read_workflow_args(BoxedArgs, task)
        super().reset(task)

    def prompt_messages(self, task: Task) -> List[Dict[str, Any]]:
        default = THINK_PROMPT if self.args.with_think else BOXED_PROMPT
        return with_default_system(super().prompt_messages(task), task, default)

    def base_prompt(self) -> str:
        """The conversation as the plain text a base model continues."""
        system = "".join(m["content"] for m in self.messages if m["role"] == "system")
        question = self.messages[-1]["content"]
        head = f"System:{system}\n" if system else ""
        return f"{head}User:\n{question}\nAssistant:\n"

    def sample(self) -> List[Experience]:
        if not self.args.use_base:
            return super().sample()
        return self.model.generate([self.base_prompt()], **self.sampling())

    def reward_kwargs(self, exp: Experience) -> Dict[str, Any]:
        # The original's contract with the reward it calls: these three always.
        return {
            "with_think": self.args.with_think,
            "format_score_coef": self.args.format_score_coef,
            "response_tokens": exp.response_length,
        }
