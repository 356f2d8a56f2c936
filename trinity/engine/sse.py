"""``stream: true``: a finished reply sent as OpenAI's server-sent events.

The engine samples a request's choices in one call, so the server has the whole reply before
it sends a byte; a streaming client then gets it as OpenAI streams it, in ``chunk`` objects
(``chat.completion.chunk`` with a ``delta``, or ``text_completion`` with ``text``), one
content chunk and one closing chunk (its ``finish_reason``) per choice, the ``usage`` chunk
when ``stream_options.include_usage`` asks for it, then ``data: [DONE]``. Agent programs that
only speak streaming (verifiers' harnesses, most SDK-based agents) run unchanged against the
server; nothing arrives earlier than without streaming.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List

from fastapi.responses import StreamingResponse

CHUNK_KINDS = {"chat.completion": "chat.completion.chunk", "text_completion": "text_completion"}


def _event(payload: Any) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _chat_deltas(choice: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """The deltas of one chat choice: its role and text (with logprobs), its tool calls."""
    message = choice["message"]
    delta: Dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if "reasoning_content" in message:
        delta["reasoning_content"] = message["reasoning_content"]
    yield {"delta": delta, "logprobs": choice.get("logprobs")}
    calls = message.get("tool_calls") or []
    if calls:
        yield {"delta": {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}}


def _choice_chunks(kind: str, choice: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """One choice as its content chunk(s) and its closing chunk."""
    index = choice["index"]
    if kind == "chat.completion":
        for part in _chat_deltas(choice):
            yield {"index": index, "logprobs": None, "finish_reason": None, **part}
        yield {"index": index, "delta": {}, "logprobs": None, **_finish(choice)}
    else:
        text = {"text": choice["text"], "logprobs": choice.get("logprobs")}
        yield {"index": index, "finish_reason": None, **text}
        yield {"index": index, "text": "", "logprobs": None, **_finish(choice)}


def _finish(choice: Dict[str, Any]) -> Dict[str, Any]:
    return {"finish_reason": choice["finish_reason"], "stop_reason": choice.get("stop_reason")}


def sse_events(reply: Dict[str, Any], include_usage: bool) -> List[str]:
    """``reply`` (a finished chat or text completion, with ``usage``) as its stream's events."""
    kind = reply["object"]
    head = {key: reply[key] for key in ("id", "created", "model")}
    head["object"] = CHUNK_KINDS[kind]
    events = [
        _event({**head, "choices": [chunk]})
        for choice in reply["choices"]
        for chunk in _choice_chunks(kind, choice)
    ]
    if include_usage:
        events.append(_event({**head, "choices": [], "usage": reply["usage"]}))
    events.append("data: [DONE]\n\n")
    return events


def include_usage(body: Any) -> bool:
    """Whether the request's ``stream_options`` asks for the closing ``usage`` chunk."""
    return body.stream_options is not None and body.stream_options.include_usage is True


def streamed(reply: Dict[str, Any], body: Any) -> StreamingResponse:
    """The response for a ``stream: true`` request whose ``reply`` is complete."""
    events = sse_events(reply, include_usage(body))
    return StreamingResponse(iter(events), media_type="text/event-stream")
