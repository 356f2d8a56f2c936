"""What every row of a dataset must hold, checked once at load for every row.

A *row schema* maps a column to the kind of value each row must have there (a string, a
message list, ...). ``row_schema`` derives it from a storage's ``format`` for the reader that
will consume the rows (taskset, SFT or DPO); ``row_problem`` says what is wrong with one row.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional

from trinity.buffer.file_parsers import MISSING, kind_name

Checker = Callable[[Any, str], Optional[str]]


def _is(value: Any) -> str:
    return "is missing" if value is MISSING else f"is {kind_name(value)}"


def _text(value: Any, column: str) -> Optional[str]:
    return None if isinstance(value, str) else f"'{column}' {_is(value)}, expected a string"


def _text_or_null(value: Any, column: str) -> Optional[str]:
    return None if value is None or value is MISSING else _text(value, column)


def _value(value: Any, column: str) -> Optional[str]:
    return f"'{column}' {_is(value)}" if value is None or value is MISSING else None


def _number(value: Any, column: str) -> Optional[str]:
    # a selector's feature column (task_selector.feature_keys): values rows are ordered by
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        shown = value if isinstance(value, float) else _is(value).removeprefix("is ")
        return f"'{column}' is {shown}, expected a finite number (task_selector.feature_keys)"
    return None


def _rate(value: Any, column: str) -> Optional[str]:
    problem = _number(value, column)
    if problem is None and not 0.0 <= value <= 1.0:
        return (
            f"'{column}' is {value}, expected a success rate in [0, 1] (task_selector.feature_keys)"
        )
    return problem


def _messages(value: Any, column: str) -> Optional[str]:
    if not isinstance(value, list) or not value:
        found = "is an empty list" if value == [] else _is(value)
        return f"'{column}' {found}, expected a list of {{role, content}} objects"
    for k, message in enumerate(value, 1):
        if not isinstance(message, dict):
            return (
                f"'{column}' item {k} is {kind_name(message)}, expected a {{role, content}} object"
            )
        if not isinstance(message.get("role"), str):
            return f"'{column}' item {k} has no 'role' string"
        if "content" not in message:
            return f"'{column}' item {k} has no 'content'"
    return None


def _conversation(all_turns: bool) -> Checker:
    """SFT messages: a prompt, then assistant turn(s) whose trained text is a string."""

    def check(value: Any, column: str) -> Optional[str]:
        problem = _messages(value, column)
        if problem:
            return problem
        assistant = [k for k, m in enumerate(value) if m["role"] == "assistant"]
        if not assistant:
            return f"'{column}' has no assistant turn to train on"
        if assistant[0] == 0:
            return f"'{column}' starts with an assistant turn: there is no prompt"
        for k in assistant if all_turns else assistant[-1:]:
            if not isinstance(value[k].get("content"), str):
                return f"'{column}' item {k + 1} (assistant) has no text content"
        return None

    return check


def response_text(value: Any, key: str, prompt_type: str) -> str:
    """The DPO response in column ``key``: a string, or (messages data) a message list whose
    last assistant turn is the response; other turns in that list are ignored."""
    if isinstance(value, str):
        return value
    if prompt_type == "messages" and isinstance(value, list):
        turns = [m for m in value if isinstance(m, dict) and m.get("role") == "assistant"]
        if turns and isinstance(turns[-1].get("content"), str):
            return turns[-1]["content"]
        raise ValueError(f"'{key}' is a message list without an assistant turn with text")
    expected = "a string or a list of messages" if prompt_type == "messages" else "a string"
    found = "missing" if value is MISSING else kind_name(value)
    raise ValueError(f"'{key}' must be {expected}, not {found}")


def _response(prompt_type: str) -> Checker:
    def check(value: Any, column: str) -> Optional[str]:
        try:
            response_text(value, column, prompt_type)
        except ValueError as exc:
            return str(exc)
        return None

    return check


CHECKS: Dict[str, Checker] = {
    "text": _text,
    "text_or_null": _text_or_null,
    "value": _value,
    "number": _number,
    "rate": _rate,
    "messages": _messages,
    "conversation": _conversation(all_turns=False),
    "conversation_all_turns": _conversation(all_turns=True),
    "response": _response("plaintext"),
    "response_or_messages": _response("messages"),
}

READERS = ("taskset", "sft", "dpo")


def row_schema(format_config: Any, reader: str) -> Dict[str, str]:
    """Column -> kind (a key of ``CHECKS``) that ``reader`` needs in every row.

    ``taskset`` counts only the keys the user set in the YAML (pydantic's ``model_fields_set``;
    custom workflows read ``raw_task`` themselves), its prompt must be a string and its
    response any non-null value (answers may be numbers). ``sft`` needs string prompt and
    response, or a conversation with an assistant turn to train on; ``dpo`` a prompt (or
    message list) plus ``chosen``/``rejected`` responses.
    """
    if reader not in READERS:
        raise ValueError(f"reader {reader!r} is not one of {', '.join(READERS)}")
    fmt = format_config
    if fmt is None:
        return {}
    explicit = getattr(fmt, "model_fields_set", None)

    def named(key: str) -> bool:
        return reader != "taskset" or explicit is None or key in explicit

    schema: Dict[str, str] = {}
    if getattr(fmt, "prompt_type", "plaintext") == "messages":
        if named("messages_key"):
            multi = getattr(fmt, "enable_concatenated_multi_turn", False)
            sft_kind = "conversation_all_turns" if multi else "conversation"
            schema[fmt.messages_key] = sft_kind if reader == "sft" else "messages"
    else:
        if named("prompt_key"):
            schema[fmt.prompt_key] = "text"
        if reader != "dpo" and named("response_key"):
            schema[fmt.response_key] = "value" if reader == "taskset" else "text"
        if getattr(fmt, "system_prompt_key", None):
            schema[fmt.system_prompt_key] = "text_or_null"
    if reader == "dpo":
        kind = "response_or_messages" if fmt.prompt_type == "messages" else "response"
        schema.update({fmt.chosen_key: kind, fmt.rejected_key: kind})
    return schema


def row_problems(columns: Dict[str, List[Any]], schema: Dict[str, str]) -> Dict[int, str]:
    """Index -> the first problem of every row that breaks ``schema``; ``columns`` holds each
    schema column's values row by row (``MISSING`` where a row lacks the key)."""
    problems: Dict[int, str] = {}
    for column, kind in schema.items():
        check = CHECKS[kind]
        for index, value in enumerate(columns[column]):
            if index not in problems:
                problem = check(value, column)
                if problem:
                    problems[index] = problem
    return problems
