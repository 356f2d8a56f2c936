# The developer guide's example workflow written against the OpenAI client (its tip:
# `enable_openai_api: true` and `self.model.get_openai_client()`), with `enable_history: true`
# giving back the engine's exact tokens of every reply.
from typing import List

from trinity.common.experience import Experience
from trinity.common.models.model import ModelWrapper
from trinity.common.workflows import Task, Workflow
from trinity.common.workflows.workflow import WORKFLOWS


@WORKFLOWS.register_module("openai_example_workflow")
class OpenAIExampleWorkflow(Workflow):
    def __init__(self, model: ModelWrapper, task: Task, auxiliary_models: List):
        super().__init__(model, task, auxiliary_models)
        self.openai_client = self.model.get_openai_client()
        self.reset(task)

    def calculate_reward(self, response: str, truth: str) -> float:
        return 1.0 if response.strip() == str(truth) else 0.0

    def run(self) -> List[Experience]:
        reply = self.openai_client.chat.completions.create(
            model=self.openai_client.model_path,
            messages=[{"role": "user", "content": f"Question:\n{self.question}"}],
            n=self.rollout_args.n,
            temperature=self.rollout_args.temperature,
            max_tokens=self.rollout_args.max_tokens,
        )
        experiences = self.model.extract_experience_from_history()
        if len(experiences) != len(reply.choices):
            raise RuntimeError(f"{len(reply.choices)} replies but {len(experiences)} recorded")
        for choice, exp in zip(reply.choices, experiences, strict=True):
            if exp.response_text != choice.message.content:
                raise RuntimeError("the record is not the reply")
            exp.reward = self.calculate_reward(choice.message.content, self.answer)
        return experiences

    def resettable(self):
        return True

    def reset(self, task: Task):
        self.task = task
        self.question = task.raw_task.get("question")
        self.answer = task.raw_task.get("answer")
        self.rollout_args = task.rollout_args
