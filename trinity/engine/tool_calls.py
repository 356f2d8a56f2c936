"""Tool calls in a reply's text, turned into OpenAI ``tool_calls``.

Chat models trained for tool use write a call as text in a format their chat template
teaches. Each format is a parser with one contract: text in; the content outside the calls
(stripped, None when nothing is left) and the calls out, each ``{"id", "type": "function",
"function": {"name", "arguments"}}`` with ``arguments`` a JSON string, as the OpenAI API
returns it. A reply whose calls do not all parse (a malformed call, or one cut off by
``max_tokens``) is returned whole as content with no calls: the caller sees what the model
wrote rather than part of it. ``TOOL_CALL_PARSERS`` names them
(``explorer.rollout_model.tool_call_parser``):

- ``hermes`` (Qwen2/2.5/3, Hermes and many others)::

    Let me compute that.
    <tool_call>
    {"name": "add", "arguments": {"a": 1, "b": 2}}
    </tool_call>

- ``llama3_json`` (Llama 3.1+): the reply is the call(s), JSON objects with ``name`` and
  ``parameters`` (or ``arguments``), after an optional ``<|python_tag|>``, several separated
  by ``;``.
- ``mistral``: ``text[TOOL_CALLS][{"name": "add", "arguments": {...}}, ...]``.
- ``qwen3_coder`` (XML-style)::

    <tool_call>
    <function=add>
    <parameter=a>
    1
    </parameter>
    </function>
    </tool_call>

  A parameter's value is read as JSON where it parses (numbers, lists), else as a string.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

Parsed = Tuple[Optional[str], List[Dict[str, Any]]]

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL = "[TOOL_CALLS]"


def _call(name: Any, arguments: Any) -> Optional[Dict[str, Any]]:
    """One OpenAI tool call, or None when ``name`` is not a string."""
    if not isinstance(name, str):
        return None
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


def _json_call(text: str, arguments_key: str = "arguments") -> Optional[Dict[str, Any]]:
    try:
        call = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict):
        return None
    arguments = call.get(arguments_key, call.get("arguments", {}))
    return _call(call.get("name"), arguments)


def _all_or_text(text: str, calls: List[Optional[Dict[str, Any]]], content: str) -> Parsed:
    if not calls or any(call is None for call in calls):
        return text, []
    return content.strip() or None, calls  # type: ignore[return-value]


def parse_hermes(text: str) -> Parsed:
    """``<tool_call>{json}</tool_call>`` blocks anywhere in the reply."""
    calls = [_json_call(block) for block in _HERMES.findall(text)]
    return _all_or_text(text, calls, _HERMES.sub("", text))


def parse_llama3_json(text: str) -> Parsed:
    """The whole reply as ``;``-separated JSON calls, after an optional ``<|python_tag|>``."""
    body = text.strip().removeprefix(_PYTHON_TAG).strip()
    if not body.startswith("{"):
        return text, []
    calls = [_json_call(part.strip(), "parameters") for part in body.split(";") if part.strip()]
    return _all_or_text(text, calls, "")


def parse_mistral(text: str) -> Parsed:
    """A JSON list of calls after ``[TOOL_CALLS]``; the text before it is the content."""
    content, tag, body = text.partition(_MISTRAL)
    if not tag:
        return text, []
    try:
        items = json.loads(body.strip())
    except json.JSONDecodeError:
        return text, []
    items = items if isinstance(items, list) else [items]
    calls = [
        _call(i.get("name"), i.get("arguments", {})) if isinstance(i, dict) else None for i in items
    ]
    return _all_or_text(text, calls, content)


def _xml_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_qwen3_coder(text: str) -> Parsed:
    """``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>``."""
    blocks = _HERMES.findall(text)
    calls = []
    for block in blocks:
        function = _FUNCTION.fullmatch(block.strip())
        if function is None:
            calls.append(None)
            continue
        parameters = {k: _xml_value(v) for k, v in _PARAMETER.findall(function.group(2))}
        calls.append(_call(function.group(1), parameters))
    return _all_or_text(text, calls, _HERMES.sub("", text))


TOOL_CALL_PARSERS: Dict[str, Callable[[str], Parsed]] = {
    "hermes": parse_hermes,
    "llama3_json": parse_llama3_json,
    "mistral": parse_mistral,
    "qwen3_coder": parse_qwen3_coder,
}


def parse_tool_calls(text: str, parser: str = "hermes") -> Parsed:
    """(content, tool_calls) of a reply written in the format ``parser`` names."""
    return TOOL_CALL_PARSERS[parser](text)


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
                except (ValueError, RecursionError):  # not JSON, or nested too deep
                    pass
            parsed.append({**call, "function": function})
        out.append({**message, "tool_calls": parsed})
    return out
