"""What stands between the network and an HTTP app (``server.build_app``, and the Tinker
service of ``trinity/tinker``): the API key, the size of a request, the time a client may
take, and how many requests run at once (``explorer.api_server``).

``Guard`` is a pure ASGI middleware. For each HTTP request, in this order:

1. the API key, when one is set: ``Authorization: Bearer <key>`` (or the header its
   ``Dialect`` names: the Tinker service reads ``X-API-Key``), compared in constant time
   (``hmac.compare_digest``); anything else is a 401, on every route;
2. the body: a ``Content-Length`` over ``max_body_bytes`` is a 413 (so is a chunked body once
   it grows past it); the body must arrive within ``read_timeout`` seconds, else a 408;
3. the in-flight limit: with ``max_in_flight`` requests being handled, one more is a 503
   with ``Retry-After``; it is not queued.

The app then gets the body from memory. The slot of step 3 is taken only once the body is
in, so a slow client holds a connection, never one of the slots that generation uses.
A refused body is still read (and dropped, up to the same size and time limits) before the
answer goes out: a server that answers and closes while the client is still sending makes
the client's kernel see a reset, and the client never reads why.

``head_deadline_protocol``: uvicorn's h11 protocol, closing a connection whose request head
has not arrived ``read_timeout`` seconds after it opened or after its first bytes. No ASGI
app sees a head that never completes, and uvicorn times out only idle keep-alive
connections, after a first response.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from uvicorn.protocols.http.h11_impl import H11Protocol

from trinity.common.config.schema_explorer import APIServerConfig
from trinity.engine.openai_protocol import APIError
from trinity.utils.access import Secret

Message = Dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = List[Tuple[bytes, bytes]]

# What a 503 asks a client to wait before retrying (the openai package honours it): a batch
# of the engine takes about this long, after which slots are free again.
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Dialect:
    """How a server's clients send the key and read a refusal, and where its limits are set
    (named in every refusal). The default is the OpenAI API's."""

    key_header: bytes = b"authorization"
    bearer: bool = True  # the header's value is ``Bearer <key>``, not the key alone
    send_key: str = "`Authorization: Bearer <key>`"  # how a client sends it, for messages
    render: Callable[[APIError], Dict[str, Any]] = APIError.body  # an error's JSON body
    settings: str = "explorer.api_server.{}"  # a limit's name -> where it is set

    def setting(self, name: str) -> str:
        return self.settings.format(name)


OPENAI = Dialect()


class _Disconnected(Exception):
    """The client went away before its request was read."""


class _Refused(Exception):
    """A request answered with ``error`` before the app saw it; ``close`` when its body was
    not read to the end (the connection cannot carry another request)."""

    def __init__(self, error: APIError, close: bool, headers: Headers = ()) -> None:
        super().__init__(error.message)
        self.error, self.close, self.headers = error, close, list(headers)


def _header(scope: Dict[str, Any], name: bytes) -> bytes:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return b""


class Guard:
    """See the module docstring; ``app`` is the app it guards (an OpenAI-compatible one,
    or the Tinker service with its own ``Dialect``)."""

    def __init__(
        self,
        app: Any,
        limits: APIServerConfig,
        api_key: Optional[Secret],
        dialect: Dialect = OPENAI,
    ) -> None:
        self.app, self.limits, self.dialect = app, limits, dialect
        self.key = api_key.reveal().encode() if api_key is not None else None
        self.in_flight = 0  # one event loop: no lock needed

    async def __call__(self, scope: Dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self._admit(scope, receive)
        except _Disconnected:
            return
        except _Refused as refused:
            await respond(send, refused.error, refused.headers, refused.close, self.dialect)
            return
        if self.in_flight >= self.limits.max_in_flight:
            retry = [(b"retry-after", str(RETRY_AFTER_S).encode())]
            await respond(send, self._overloaded(), retry, dialect=self.dialect)
            return
        self.in_flight += 1
        try:
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.in_flight -= 1

    async def _admit(self, scope: Dict[str, Any], receive: Receive) -> bytes:
        """The body of a request the app may see; ``_Refused`` says why not (the key first,
        then the body's size, then its time)."""
        authorized = self._authorized(scope)
        body, size, complete = await self._receive_body(scope, receive, keep=authorized)
        if not authorized:
            challenge = [(b"www-authenticate", b"Bearer")] if self.dialect.bearer else []
            raise _Refused(self._unauthorized(), not complete, challenge)
        if size > self.limits.max_body_bytes:
            raise _Refused(self._too_large(size), not complete)
        if not complete:
            raise _Refused(self._too_slow(), True)
        return body

    def _authorized(self, scope: Dict[str, Any]) -> bool:
        if self.key is None:
            return True
        value = _header(scope, self.dialect.key_header)
        if self.dialect.bearer:
            scheme, _, value = value.partition(b" ")
            if scheme.lower() != b"bearer":
                return False
        # compare_digest: the time taken does not tell how much of a guess was right
        return hmac.compare_digest(value.strip(), self.key)

    def _unauthorized(self) -> APIError:
        return APIError(
            401,
            f"missing or incorrect API key: send the header {self.dialect.send_key} with "
            f"the key this server reads from {self.limits.api_key_env} "
            f"({self.dialect.setting('api_key_env')})",
            code="invalid_api_key",
        )

    def _overloaded(self) -> APIError:
        return APIError(
            503,
            f"the server is handling {self.in_flight} requests, its limit "
            f"({self.dialect.setting('max_in_flight')}); retry after {RETRY_AFTER_S} s",
            code="server_overloaded",
            kind="server_error",
        )

    async def _receive_body(
        self, scope: Dict[str, Any], receive: Receive, keep: bool
    ) -> Tuple[bytes, int, bool]:
        """(body, its size, whether it all arrived within ``read_timeout``). Bytes past
        ``max_body_bytes`` (or all of them, unless ``keep``) are read only to be dropped."""
        limit = self.limits.max_body_bytes
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.read_timeout
        declared = _header(scope, b"content-length")
        size = int(declared) if declared.isdigit() else 0
        chunks: List[bytes] = []
        received, more = 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                return b"", max(size, received), False
            if message["type"] == "http.disconnect":
                raise _Disconnected()
            chunk, more = message.get("body", b""), message.get("more_body", False)
            received += len(chunk)
            if keep and max(size, received) <= limit:
                chunks.append(chunk)
        return b"".join(chunks), max(size, received), True

    def _too_large(self, size: int) -> APIError:
        return APIError(
            413,
            f"the request body has {size} bytes; this server takes at most "
            f"{self.limits.max_body_bytes} ({self.dialect.setting('max_body_bytes')})",
            code="request_too_large",
        )

    def _too_slow(self) -> APIError:
        return APIError(
            408,
            f"the request body did not arrive within {self.limits.read_timeout:g} s "
            f"({self.dialect.setting('read_timeout')})",
            code="request_timeout",
        )


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` first, then whatever the connection says next (a
    disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def respond(
    send: Send,
    error: APIError,
    headers: Headers = (),
    close: bool = False,
    dialect: Dialect = OPENAI,
) -> None:
    """Send ``error`` as the dialect's error body (OpenAI's by default) with its status (and
    ``headers``); ``close``: the connection ends with it."""
    body = json.dumps(dialect.render(error)).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    head += list(headers) + ([(b"connection", b"close")] if close else [])
    await send({"type": "http.response.start", "status": error.status, "headers": head})
    await send({"type": "http.response.body", "body": body})


def head_deadline_protocol(timeout: float) -> type:
    """uvicorn's h11 protocol class, closing a connection whose next request head has not
    arrived ``timeout`` seconds after the connection opened, or after the first bytes of
    that head (see the module docstring)."""

    class HeadDeadline(H11Protocol):
        _head_timer: Optional[asyncio.TimerHandle] = None
        _armed_for: Any = None  # the request cycle current when the timer was armed

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            between = self.cycle is None or self.cycle.response_complete
            # the first bytes of a new request (not of one whose timer already runs)
            if between and (self._head_timer is None or self._armed_for is not self.cycle):
                self._arm()
            super().data_received(data)

        def connection_lost(self, exc: Optional[Exception]) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._armed_for = self.cycle
            self._head_timer = self.loop.call_later(timeout, self._overdue)

        def _overdue(self) -> None:
            self._head_timer = None
            # the same cycle as when armed: no new request head has arrived since
            if self.cycle is self._armed_for and not self.transport.is_closing():
                self.transport.close()

    return HeadDeadline
