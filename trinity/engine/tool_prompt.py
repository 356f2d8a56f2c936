"""Tools for chat templates that have no place for them: the prompt side of ``tool_calls``.

Many instruct models' templates (SmolLM2's, for one) ignore ``tools`` and an assistant
message's ``tool_calls``: rendered, the model would never hear of its tools, and its own
earlier calls would vanish from the conversation. For such a template the tools are written
into the system message instead, in the Hermes format ``parse_tool_calls`` reads back: the
function schemas as JSON lines inside ``<tools></tools>`` and how to call one
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``); an assistant message's calls
become that text after its content. Tool results (role ``tool``) are left to the template.
A template that renders tools itself is used as it is.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional

Messages = List[Dict[str, Any]]

_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe_tool", "description": "", "parameters": {"type": "object"}},
}
_PROBE = [{"role": "user", "content": "x"}]

TOOLS_PREAMBLE = (
    "You can call functions to help answer. They are listed below as JSON schemas inside "
    "<tools></tools>:\n<tools>\n{tools}\n</tools>\nTo call one, write "
    '<tool_call>{{"name": <function name>, "arguments": <arguments as a JSON object>}}'
    "</tool_call>; its result comes back in the next message."
)


def renders_tools(render: Callable[[Messages, Optional[List[Dict[str, Any]]], bool], str]) -> bool:
    """Whether a chat template (``render(messages, tools, add_generation_prompt)``) puts a
    tool list in its prompt: it renders a conversation differently with a tool than without."""
    return render(_PROBE, [_PROBE_TOOL], True) != render(_PROBE, None, True)


def with_tools_in_text(messages: Messages, tools: Optional[List[Dict[str, Any]]]) -> Messages:
    """``messages`` for a template that ignores tools: the tool list in the system message
    (the first message's, or a new one) and every assistant tool call written as text."""
    out = [_calls_as_text(m) for m in messages]
    if not tools:
        return out
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    preamble = TOOLS_PREAMBLE.format(tools=listed)
    if out and out[0].get("role") == "system":
        return [{**out[0], "content": f"{out[0].get('content') or ''}\n\n{preamble}"}, *out[1:]]
    return [{"role": "system", "content": preamble}, *out]


def _calls_as_text(message: Dict[str, Any]) -> Dict[str, Any]:
    calls = message.get("tool_calls") if message.get("role") == "assistant" else None
    if not calls:
        return message
    blocks = []
    for call in calls:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        written = json.dumps({"name": function.get("name"), "arguments": arguments})
        blocks.append(f"<tool_call>{written}</tool_call>")
    text = "\n".join(filter(None, [message.get("content") or "", *blocks]))
    return {key: value for key, value in message.items() if key != "tool_calls"} | {"content": text}
