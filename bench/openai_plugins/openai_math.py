"""The built-in math workflow's job, done through the OpenAI client (for bench/openai_overhead.py):
one chat completion with ``n`` choices, scored like ``math_workflow``, experiences from history."""

from trinity.common.rewards import REWARD_FUNCTIONS, total_reward
from trinity.common.workflows import Workflow
from trinity.common.workflows.simple import build_messages
from trinity.common.workflows.workflow import WORKFLOWS


@WORKFLOWS.register_module("openai_math_bench")
class OpenAIMath(Workflow):
    def run(self):
        args = self.task.rollout_args
        client = self.model.get_openai_client()
        client.chat.completions.create(
            model=client.model_path,
            messages=build_messages(self.task),
            n=args.n,
            temperature=args.temperature,
            max_tokens=args.max_tokens,
        )
        reward = REWARD_FUNCTIONS.get("math_reward")()
        truth = str(self.task.raw_task[self.task.format_args.response_key])
        experiences = self.model.extract_experience_from_history()
        for exp in experiences:
            components = reward(exp.response_text, truth)
            exp.reward = total_reward(components)
            exp.metrics.update(components)
        return experiences
