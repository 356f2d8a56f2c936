"""Checks of a request's content that its field types (``openai_protocol``) do not express:
the shape of messages and tools as OpenAI defines them, token ids within the vocabulary,
and the limits of ``explorer.api_server``. Each failure is a 400 whose ``param`` names the
field (``messages[2].role``, ``tools[0].function.parameters``).

Messages keep their extra keys and stay dicts: chat templates read whatever a client sends.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from trinity.common.config.schema_explorer import APIServerConfig
from trinity.engine.openai_protocol import APIError, field_path, most_specific

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# Stop strings per request: each is looked for in every sample's text at every step, so a
# long list slows every request batched with it (OpenAI takes 4).
MAX_STOP = 16
_LIMITS = "explorer.api_server"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class _Part(_Strict):
    type: str
    text: Optional[str] = None


class _Function(_Strict):
    name: str
    arguments: Union[str, Dict[str, Any]]


class _ToolCall(_Strict):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: _Function


class _Message(_Strict):
    role: Literal[ROLES]  # type: ignore[valid-type]
    content: Optional[Union[str, List[_Part]]] = None
    name: Optional[str] = None
    tool_calls: Optional[List[_ToolCall]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None


class _FunctionSpec(_Strict):
    name: str
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = None  # a JSON schema: an object
    strict: Optional[bool] = None


class _Tool(_Strict):
    type: Literal["function"]
    function: _FunctionSpec


_MESSAGE = TypeAdapter(_Message)
_TOOL = TypeAdapter(_Tool)


def _check_each(adapter: TypeAdapter, items: Sequence[Any], name: str) -> None:
    for i, item in enumerate(items):
        try:
            adapter.validate_python(item)
        except ValidationError as exc:
            first = most_specific(exc.errors())
            where = field_path([name, i, *first.get("loc", ())])
            raise APIError(400, f"{where}: {first.get('msg')}", where) from None


def check_chat(body: Any, limits: APIServerConfig, vocab_size: int) -> None:
    """A chat request's messages, tools and sampling fields, against ``limits``."""
    if not body.messages:
        raise APIError(400, "messages: at least one message is required", "messages")
    if len(body.messages) > limits.max_messages:
        raise APIError(
            400,
            f"messages: {len(body.messages)} messages; this server takes at most "
            f"{limits.max_messages} per request ({_LIMITS}.max_messages)",
            "messages",
        )
    _check_each(_MESSAGE, body.messages, "messages")
    _check_each(_TOOL, body.tools or [], "tools")
    check_sampling(body, limits, vocab_size, prompts=1)


def check_sampling(body: Any, limits: APIServerConfig, vocab_size: int, prompts: int) -> None:
    """``n`` (times ``prompts``), ``stop`` and ``stop_token_ids`` of a chat or completion
    request; the other sampling fields are checked by ``SamplingParams``."""
    n = body.n if body.n is not None else 1
    if n * prompts > limits.max_n:
        asked = f"{prompts} prompts x n {n} = {n * prompts} samples" if prompts > 1 else f"{n}"
        raise APIError(
            400,
            f"n: {asked}; this server samples at most {limits.max_n} per request ({_LIMITS}.max_n)",
            "n",
        )
    stops = [body.stop] if isinstance(body.stop, str) else body.stop or []
    if len(stops) > MAX_STOP:
        raise APIError(400, f"stop: {len(stops)} strings; at most {MAX_STOP}", "stop")
    bad = [t for t in body.stop_token_ids or [] if not 0 <= t < vocab_size]
    if bad:
        raise APIError(
            400,
            f"stop_token_ids: {bad[:5]} outside the vocabulary [0, {vocab_size})",
            "stop_token_ids",
        )
