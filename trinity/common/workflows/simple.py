"""Built-in single-turn workflows: ask once, sample ``n`` answers, score each."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from trinity.common.experience import Experience
from trinity.common.rewards import REWARD_FUNCTIONS, total_reward
from trinity.common.workflows.workflow import WORKFLOWS, ResettableWorkflow, Task


def build_messages(task: Task) -> List[Dict[str, Any]]:
    """The conversation a task's ``format_args`` describe (plaintext or a messages column)."""
    fmt, row = task.format_args, task.raw_task
    if fmt.prompt_type == "messages":
        messages = row.get(fmt.messages_key)
        if not isinstance(messages, list):
            raise ValueError(
                f"taskset '{task.taskset_name}' row {task.index}: column '{fmt.messages_key}' "
                f"(format.messages_key) must hold a list of messages"
            )
        # A trailing assistant turn is the reference answer, not part of the prompt.
        return messages[:-1] if messages and messages[-1].get("role") == "assistant" else messages
    if fmt.prompt_key not in row:
        raise KeyError(
            f"taskset '{task.taskset_name}' row {task.index} has no column '{fmt.prompt_key}' "
            f"(format.prompt_key); columns: {sorted(row)}"
        )
    system = row.get(fmt.system_prompt_key) if fmt.system_prompt_key else None
    system = system or fmt.system_prompt
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": str(row[fmt.prompt_key])}]


def with_default_system(
    messages: List[Dict[str, Any]], task: Task, system: str
) -> List[Dict[str, Any]]:
    """``messages`` opened with the system message ``system`` when a plaintext task gives none
    of its own (a messages column is the conversation as the data wrote it)."""
    if task.format_args.prompt_type != "plaintext" or messages[0]["role"] == "system":
        return messages
    return [{"role": "system", "content": system}, *messages]


class PromptWorkflow(ResettableWorkflow):
    """One user turn built from the task's ``format_args``, ``rollout_args.n`` answers sampled
    (``sample``); ``truth`` is the row's ``response_key`` column. Subclasses score them."""

    def reset(self, task: Task) -> None:
        self.task = task
        self.messages = self.prompt_messages(task)
        self.truth = task.raw_task.get(task.format_args.response_key)

    def prompt_messages(self, task: Task) -> List[Dict[str, Any]]:
        """The conversation the policy answers (subclasses with their own prompts override)."""
        return build_messages(task)

    def sample(self) -> List[Experience]:
        """The policy's ``rollout_args.n`` answers to the task's prompt."""
        return self.model.chat(self.messages, **self.sampling())

    def sampling(self) -> Dict[str, Any]:
        """The sampling arguments ``rollout_args`` give, as the model's calls take them."""
        args = self.task.rollout_args
        return {
            "n": args.n,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
            "max_tokens": args.max_tokens,
            "stop": args.stop or None,
            "top_logprobs": args.logprobs,
        }


# Every workflow here runs in every explorer.concurrent_mode (Workflow.run/run_async), so the
# original's async_* names are the same workflows.
@WORKFLOWS.register_module("async_simple_workflow")
@WORKFLOWS.register_module("simple_workflow")
class SimpleWorkflow(PromptWorkflow):
    """One user turn, ``rollout_args.n`` sampled answers, each scored by the reward function."""

    default_reward_fn: Optional[str] = None

    def reset(self, task: Task) -> None:
        super().reset(task)
        reward_name = task.reward_fn or self.default_reward_fn
        if reward_name is None:
            raise ValueError(
                f"{type(self).__name__} needs a reward function: set "
                "buffer.explorer_input.default_reward_fn_type (or the taskset's "
                "default_reward_fn_type)"
            )
        reward_cls = (
            REWARD_FUNCTIONS.get(reward_name) if isinstance(reward_name, str) else reward_name
        )
        self.reward_fn = reward_cls(**task.reward_fn_args)

    def run(self) -> List[Experience]:
        responses = self.sample()
        for exp in responses:
            components = self._score(exp)
            exp.reward = total_reward(components)
            exp.metrics.update(components)
        if self.task.workflow_args.get("greedy_baseline"):
            # ReMax's baseline: the reward of the greedy answer to the same prompt.
            greedy = self.model.chat(
                self.messages, n=1, temperature=0.0, max_tokens=self.task.rollout_args.max_tokens
            )
            baseline = total_reward(self._score(greedy[0]))
            for exp in responses:
                exp.info["baseline_reward"] = baseline
        return responses

    def _score(self, exp: Experience) -> Dict[str, float]:
        truth = None if self.truth is None else str(self.truth)
        return self.reward_fn(
            exp.response_text, truth, raw_task=self.task.raw_task, **self.reward_kwargs(exp)
        )

    def reward_kwargs(self, exp: Experience) -> Dict[str, Any]:
        """Arguments the reward function takes besides the response, truth and row: the
        response's token count for one that declares ``takes_response_tokens`` (DAPO's
        overlong penalty). A plugin's reward written without ``**kwargs`` gets none."""
        if getattr(self.reward_fn, "takes_response_tokens", False):
            return {"response_tokens": exp.response_length}
        return {}


@WORKFLOWS.register_module("async_math_workflow")
@WORKFLOWS.register_module("math_workflow")
class MathWorkflow(SimpleWorkflow):
    """A math problem: ``math_reward`` (numeric equivalence) unless the taskset names another."""

    default_reward_fn = "math_reward"
