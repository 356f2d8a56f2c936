"""Tool calls in a reply's text, turned into OpenAI ``tool_calls``.

Chat models trained for tool use write a call as text in a format their chat template
teaches. ``parse_tool_calls`` reads the Hermes format, which Qwen2/2.5/3 and many other
templates use::

    Let me compute that.
    <tool_call>
    {"name": "add", "arguments": {"a": 1, "b": 2}}
    </tool_call>

Another format is another function with the same contract (text in; content outside the
calls, and the calls, out), chosen where the server parses replies.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Dict, List, Optional, Tuple

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> Tuple[Optional[str], List[Dict[str, Any]]]:
    """(content, tool_calls) of a reply written in the Hermes format.

    ``content`` is the text outside the ``<tool_call>`` blocks, stripped, or None when nothing
    is left; each call is ``{"id", "type": "function", "function": {"name", "arguments"}}``
    with ``arguments`` a JSON string, as the OpenAI API returns it. A reply whose blocks do
    not all hold a JSON object with a string ``name`` (a malformed call, or one cut off by
    ``max_tokens``) is returned whole as content with no calls: the caller sees what the
    model wrote rather than part of it.
    """
    blocks = _HERMES.findall(text)
    if not blocks:
        return text, []
    calls = []
    for block in blocks:
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        arguments = call.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": arguments
                    if isinstance(arguments, str)
                    else json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    content = _HERMES.sub("", text).strip()
    return content or None, calls


def arguments_as_objects(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``messages`` with each assistant tool call's ``arguments`` JSON string parsed.

    Clients send arguments back as the JSON string the API returned; chat templates (Qwen's,
    Hermes') write ``arguments | tojson``, which would quote a string a second time. Arguments
    that are not valid JSON stay strings. The input is not modified.
    """
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not calls:
            out.append(message)
            continue
        parsed = []
        for call in calls:
            function = dict(call.get("function") or {})
            if isinstance(function.get("arguments"), str):
                try:
                    function["arguments"] = json.loads(function["arguments"])
                except json.JSONDecodeError:
                    pass
            parsed.append({**call, "function": function})
        out.append({**message, "tool_calls": parsed})
    return out
