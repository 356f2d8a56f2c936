"""``openai`` clients pointed at an engine's server, recording each reply's experiences.

A recording client sends ``TOKENS_HEADER`` with every request, so each reply carries the
exact prompt ids, sampled ids and logprobs (see ``reply_tokens``); a response hook of its
HTTP client turns them back into the engine's ``Experience``s and hands them to ``record``
before the ``openai`` package parses the reply. Every call made through the client is seen,
whatever part of the API made it (``chat.completions``, ``completions``, ``with_raw_response``).

Sync clients of one process share one HTTP client (connection pool): building an HTTP client
costs about 40-100 ms (its TLS context), and a workflow instance gets its clients when a task
starts, so per-client pools delayed each task's first request and split engine batches. The
shared client's hook finds the recorder of a reply by ``RECORDER_HEADER``.
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
import uuid
import weakref
from typing import Any, Callable, Dict, List, Optional

import openai

from trinity.common.experience import Experience
from trinity.common.models.reply_tokens import SESSION_HEADER, TOKENS_HEADER, experiences_from_reply

# What is sent to a server that checks no key: the openai package refuses to start without one.
API_KEY = "EMPTY"

Record = Callable[[List[Experience]], None]
# Names a sync client's recorder on its requests (only this process's hook reads it).
RECORDER_HEADER = "x-trinity-recorder"
# Recorder key -> a reference to the record function (weak for a bound method, so a client
# does not keep its ModelWrapper alive); removed when the client is collected.
_RECORDERS: Dict[str, Callable[[], Optional[Record]]] = {}
_RECORDERS_LOCK = threading.Lock()


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


def _record_reply(response: Any) -> None:
    """The shared HTTP client's hook: hand a recorded request's experiences to its recorder."""
    key = response.request.headers.get(RECORDER_HEADER)
    with _RECORDERS_LOCK:
        ref = _RECORDERS.get(key) if key else None
    record = ref() if ref is not None else None
    if record is None:
        return
    response.read()
    experiences = _experiences(response.status_code, response.content)
    if experiences:
        record(experiences)


class _ProcessHttpClient(openai.DefaultHttpxClient):
    """Shared by every sync client of the process, so no one client may close it (``with
    client:`` or ``client.close()`` in a workflow): it lives as long as the process."""

    def close(self) -> None:
        pass


@functools.cache
def _shared_http_client() -> Any:
    """This process's HTTP client for every sync client (thread-safe connection pool)."""
    return _ProcessHttpClient(event_hooks={"response": [_record_reply]})


def _register(record: Record) -> str:
    key = uuid.uuid4().hex
    ref = weakref.WeakMethod(record) if inspect.ismethod(record) else (lambda: record)
    with _RECORDERS_LOCK:
        _RECORDERS[key] = ref
    return key


def _unregister(key: str) -> None:
    with _RECORDERS_LOCK:
        _RECORDERS.pop(key, None)


def openai_client(
    url: str,
    model: str,
    record: Optional[Record] = None,
    session: Optional[str] = None,
    api_key: Optional[str] = None,
) -> openai.OpenAI:
    """An ``openai.OpenAI`` for the server at ``url``; ``client.model_path`` is the served
    model name. With ``record``, every reply's experiences are passed to it; with
    ``session``, chat requests continuing an earlier reply continue its exact tokens;
    ``api_key``: the server's (``explorer.api_server.api_key_env``), if it requires one."""
    headers = _headers(record, session)
    key = _register(record) if record is not None else None
    if key is not None:
        headers[RECORDER_HEADER] = key
    client = openai.OpenAI(
        base_url=f"{url}/v1",
        api_key=api_key or API_KEY,
        default_headers=headers,
        http_client=_shared_http_client(),
    )
    if key is not None:
        weakref.finalize(client, _unregister, key)
    client.model_path = model
    return client


def openai_async_client(
    url: str,
    model: str,
    record: Optional[Record] = None,
    session: Optional[str] = None,
    api_key: Optional[str] = None,
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
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key or API_KEY, **options)
    client.model_path = model
    return client


async def take_recorded(url: str, key: str, api_key: Optional[str] = None) -> List[Experience]:
    """The replies the server at ``url`` kept under record ``key`` (``RECORD_HEADER``), as the
    engine's ``Experience``s in the order the replies were made; the server forgets them."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=60) as http:
        answer = await http.post(f"{url}/trinity/records/take", json={"key": key}, headers=headers)
    answer.raise_for_status()
    return [exp for reply in answer.json()["replies"] for exp in experiences_from_reply(reply)]
