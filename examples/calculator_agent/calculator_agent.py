"""A tool-using agent written only against ``openai.OpenAI``, trained with GRPO unmodified.

Two parts, kept apart on purpose:

- ``ToolAgent`` is ordinary agent code: it knows the OpenAI chat API and its tool-calling
  protocol, nothing of Trinity. Point it at any OpenAI-compatible server and it runs.
- ``CalculatorAgentWorkflow`` is the only Trinity code: it hands the agent the client of the
  rollout model (``self.model.get_openai_client()``), and after each episode takes the calls
  the wrapper recorded (``enable_history``) and merges them into one experience
  (``merge_turns``): the trainer learns from exactly the tokens the model sampled, and the
  tool's results are context, not trained.

Load it with ``--plugin-dir examples/calculator_agent`` (see ``calculator_agent.yaml``).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Tuple

import openai

from trinity.common.experience import Experience
from trinity.common.workflows import Workflow
from trinity.common.workflows.multiturn import merge_turns
from trinity.common.workflows.workflow import WORKFLOWS, Task
from trinity.demo.calculator import CALC_TOOL, calculate

Messages = List[Dict[str, Any]]


class ToolAgent:
    """Answers a question with an OpenAI-compatible chat model, calling ``tools`` (name ->
    (schema, function of the call's arguments returning text)) until it replies in text."""

    def __init__(
        self,
        client: openai.OpenAI,
        model: str,
        tools: Dict[str, Tuple[Dict[str, Any], Callable[..., str]]],
        max_turns: int = 3,
        **sampling: Any,
    ) -> None:
        self.client, self.model, self.tools = client, model, tools
        self.max_turns, self.sampling = max_turns, sampling

    def run(self, question: str) -> Tuple[Optional[str], Messages]:
        """The final text answer (None if the turns ran out) and the whole conversation."""
        messages: Messages = [{"role": "user", "content": question}]
        for _ in range(self.max_turns):
            try:
                reply = self.client.chat.completions.create(
                    model=self.model,
                    messages=messages,
                    tools=[schema for schema, _ in self.tools.values()],
                    **self.sampling,
                )
            except openai.BadRequestError:  # e.g. the conversation outgrew the context
                return None, messages
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))  # sent back as returned
            if not message.tool_calls:
                return message.content, messages
            for call in message.tool_calls:
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": self.call_tool(call)}
                )
        return None, messages

    def call_tool(self, call: Any) -> str:
        """The tool's result, or an error text the model can read (never raises)."""
        if call.function.name not in self.tools:
            return f"error: no tool named {call.function.name}"
        try:
            arguments = json.loads(call.function.arguments or "{}")
            return self.tools[call.function.name][1](**arguments)
        except (json.JSONDecodeError, TypeError) as exc:
            return f"error: bad arguments: {exc}"


@WORKFLOWS.register_module("calculator_agent_workflow")
class CalculatorAgentWorkflow(Workflow):
    """``rollout_args.n`` episodes of ``ToolAgent`` with the ``calc`` tool on one question;
    one experience per episode, reward 1.0 when the final answer equals the task's answer.
    Needs ``explorer.rollout_model.enable_openai_api`` and ``enable_history``."""

    def __init__(self, model: Any, task: Task, auxiliary_models: Optional[List] = None) -> None:
        super().__init__(model, task, auxiliary_models)
        self.reset(task)

    def resettable(self) -> bool:
        return True

    def reset(self, task: Task) -> None:
        self.task = task
        self.question = str(task.raw_task[task.format_args.prompt_key])
        self.answer = str(task.raw_task[task.format_args.response_key])

    def run(self) -> List[Experience]:
        client = self.model.get_openai_client()
        args = self.task.rollout_args
        agent = ToolAgent(
            client,
            client.models.list().data[0].id,
            {"calc": (CALC_TOOL, calculate)},
            max_turns=int(self.task.workflow_args.get("max_turns", 2)),
            temperature=args.temperature,
            top_p=args.top_p,
            max_tokens=args.max_tokens,
        )
        self.model.extract_experience_from_history()  # drop calls of an attempt that failed
        experiences = []
        for _ in range(args.n):
            answer, messages = agent.run(self.question)
            success = float((answer or "").strip() == self.answer)
            tool_calls = sum(len(m.get("tool_calls") or []) for m in messages)
            exp = merge_turns(
                self.model.extract_experience_from_history(),
                reward=success,
                info={"answer": answer, "tool_calls": tool_calls},
            )
            exp.metrics.update(accuracy=success, tool_calls=float(tool_calls))
            experiences.append(exp)
        return experiences
