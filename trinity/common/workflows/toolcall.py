"""``toolcall_workflow`` (also ``tool_call_workflow``): ToolACE-style function calling (Tool-N1).

The original Trinity-RFT's tool-call workflow, for rows in its ToolACE format: ``tools`` (a
JSON list of function schemas), ``raw_system`` (the system text), ``conversations`` (turns
``{"from": "human"|"user"|"gpt"|"assistant"|"observation"|"tool"|"function_call",
"value": ...}``) and ``answer`` (the reference calls as JSON). The system message is
``raw_system`` followed by ``TOOL_PROMPT``, which lists the tools one JSON object per line and
asks for the reasoning in ``<think>`` and the calls as a JSON list in ``<tool_call>``; the
turns follow as user, assistant and tool messages (a ``function_call`` turn as the
assistant's JSON). Each answer is scored by ``tool_call_reward`` against ``answer`` unless the
taskset names another reward. The original registered it as ``tool_call_workflow`` from 0.4.0
and ``toolcall_workflow`` before; both names run it.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

from trinity.common.workflows.simple import SimpleWorkflow
from trinity.common.workflows.workflow import WORKFLOWS, Task

TOOL_PROMPT = """# Tools

You can call these functions:
<tools>
{tools}
</tools>

Each reply MUST do both of these, in this order:
1. Reason about the request inside <think> </think> tags.
2. Write the calls to make as a JSON list inside <tool_call></tool_call> tags, each call an \
object with the function's name and its arguments: <tool_call>[{{"name": <function-name>, \
"arguments": <arguments-object>}}, ...]</tool_call>
For example: <think>The user wants the weather in Paris, so I call get_weather.</think> \
<tool_call>[{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}]</tool_call>
Give every argument the type its schema asks for.
"""

# ToolACE's speaker names -> chat roles
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "observation": "tool",
    "tool": "tool",
    "function_call": "assistant",
}


def tools_block(tools: Any) -> str:
    """The tools, one ``{"type": "function", "function": ...}`` JSON object per line."""
    schemas = json.loads(tools) if isinstance(tools, str) else tools
    return "\n".join(json.dumps({"type": "function", "function": t}) for t in schemas)


def toolace_messages(row: Dict[str, Any], where: str) -> List[Dict[str, Any]]:
    """The conversation a ToolACE row describes; ``where`` names the row in errors."""
    missing = [key for key in ("tools", "conversations") if key not in row]
    if missing:
        raise KeyError(
            f"{where} has no column '{missing[0]}' (ToolACE rows: tools, raw_system, "
            f"conversations, answer); columns: {sorted(row)}"
        )
    system = str(row.get("raw_system") or "") + TOOL_PROMPT.format(tools=tools_block(row["tools"]))
    messages = [{"role": "system", "content": system}]
    for turn in row["conversations"]:
        speaker, value = turn["from"], turn["value"]
        if speaker not in ROLES:
            raise ValueError(
                f"{where}: conversation turn from '{speaker}' is none of {sorted(ROLES)}"
            )
        content = json.dumps(value) if speaker == "function_call" else value
        messages.append({"role": ROLES[speaker], "content": content})
    return messages


@WORKFLOWS.register_module("toolcall_workflow")
@WORKFLOWS.register_module("tool_call_workflow")
class ToolCallWorkflow(SimpleWorkflow):
    """The policy answers a ToolACE conversation with tool calls, scored against ``answer``."""

    default_reward_fn = "tool_call_reward"

    def prompt_messages(self, task: Task) -> List[Dict[str, Any]]:
        return toolace_messages(task.raw_task, f"taskset '{task.taskset_name}' row {task.index}")

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.truth = task.raw_task.get("answer")  # ToolACE's reference calls
