"""``openai`` clients pointed at an engine's server, recording each reply's experiences.

A recording client sends ``TOKENS_HEADER`` with every request, so each reply carries the
exact prompt ids, sampled ids and logprobs (see ``openai_protocol``); a response hook of its
HTTP client turns them back into the engine's ``Experience``s and hands them to ``record``
before the ``openai`` package parses the reply. Every call made through the client is seen,
whatever part of the API made it (``chat.completions``, ``completions``, ``with_raw_response``).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional

import openai

from trinity.common.experience import Experience
from trinity.engine.openai_protocol import SESSION_HEADER, TOKENS_HEADER, experiences_from_reply

# The server checks no key, but the openai package refuses to start without one.
API_KEY = "EMPTY"

Record = Callable[[List[Experience]], None]


def _experiences(status: int, content: bytes) -> List[Experience]:
    if status != 200:
        return []
    try:
        return experiences_from_reply(json.loads(content))
    except ValueError:  # not JSON: not a reply of this server
        return []


def _headers(record: Optional[Record], session: Optional[str]) -> Dict[str, str]:
    headers = {SESSION_HEADER: session} if session else {}
    return {**headers, TOKENS_HEADER: "1"} if record is not None else headers


def openai_client(
    url: str, model: str, record: Optional[Record] = None, session: Optional[str] = None
) -> openai.OpenAI:
    """An ``openai.OpenAI`` for the server at ``url``; ``client.model_path`` is the served
    model name. With ``record``, every reply's experiences are passed to it; with
    ``session``, chat requests continuing an earlier reply continue its exact tokens."""
    options: Dict[str, Any] = {"default_headers": _headers(record, session)}
    if record is not None:

        def hook(response: Any) -> None:
            response.read()
            experiences = _experiences(response.status_code, response.content)
            if experiences:
                record(experiences)

        options["http_client"] = openai.DefaultHttpxClient(event_hooks={"response": [hook]})
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, **options)
    client.model_path = model
    return client


def openai_async_client(
    url: str, model: str, record: Optional[Record] = None, session: Optional[str] = None
) -> openai.AsyncOpenAI:
    """``openai_client`` for asyncio code: an ``openai.AsyncOpenAI``."""
    options: Dict[str, Any] = {"default_headers": _headers(record, session)}
    if record is not None:

        async def hook(response: Any) -> None:
            await response.aread()
            experiences = _experiences(response.status_code, response.content)
            if experiences:
                record(experiences)

        options["http_client"] = openai.DefaultAsyncHttpxClient(event_hooks={"response": [hook]})
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, **options)
    client.model_path = model
    return client
