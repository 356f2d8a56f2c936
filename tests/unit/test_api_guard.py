"""The guard of every OpenAI-compatible server (``engine/guard.py``), over real HTTP: the API
key on every route, the requests in flight, the body size, and clients that stall."""

import asyncio
import json
import logging
import socket
import threading
import time
from typing import Any, List

import openai
import pytest

from tests.unit.serve_endpoint import USER, serve_endpoint
from tests.unit.test_openai_server import ScriptedModel, served_by
from trinity.common.config.schema_explorer import APIServerConfig
from trinity.common.models.model import ModelWrapper

KEY = "test-key-7f3a91c2"


def test_every_route_requires_the_key_and_the_key_is_never_logged(micro_model, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with serve_endpoint(micro_model, tmp_path, key=KEY) as endpoint:
        app = endpoint.engine.server.server.config.app
        routes = [(m, r.path) for r in app.routes for m in getattr(r, "methods", None) or ()]
        routes += [("GET", "/no/such/route"), ("POST", "/v1/embeddings")]
        paths = {path for _, path in routes}
        assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/feedback"} <= paths
        assert {"/commit", "/metrics", "/health"} <= paths
        for method, path in routes:
            for sent in ("", "Bearer wrong", KEY, f"Basic {KEY}", f"Bearer {KEY}x"):
                reply = endpoint.request(method, path, {}, Authorization=sent)
                assert reply["http"] == 401, (method, path, sent)
                assert reply["headers"]["www-authenticate"] == "Bearer"
                if method == "HEAD":  # no body
                    continue
                assert reply["error"]["code"] == "invalid_api_key"
                assert "Authorization: Bearer <key>" in reply["error"]["message"]
                assert "TRINITY_API_KEY" in reply["error"]["message"]
                assert "wrong" not in reply["error"]["message"]
            if method == "GET" and path.startswith(("/v1", "/metrics", "/health")):
                assert endpoint.request(method, path)["http"] == 200, path
        # the project's own client sends the key it gets from the engine
        reply = (
            ModelWrapper(endpoint.engine)
            .get_openai_client()
            .chat.completions.create(model=endpoint.model(), messages=USER, max_tokens=2)
        )
        assert reply.choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key="EMPTY").models.list()
    assert "(API key required)" in caplog.text
    assert KEY not in caplog.text


class HeldModel(ScriptedModel):
    """Replies once released: requests stay in flight until the test lets them go."""

    def __init__(self) -> None:
        super().__init__("held")
        self.release = asyncio.Event()
        self.waiting = 0

    async def generate_ids(self, prompt_ids: List[int], params: Any) -> Any:
        self.waiting += 1
        await self.release.wait()
        return await super().generate_ids(prompt_ids, params)


def test_beyond_max_in_flight_a_request_gets_503_with_retry_after_never_a_queue():
    model = HeldModel()
    server = served_by(model, APIServerConfig(max_in_flight=2))
    try:
        client = plain_client(server)
        held = [threading.Thread(target=_chat, args=(client,)) for _ in range(2)]
        for thread in held:
            thread.start()
        _wait_until(lambda: model.waiting == 2)
        with pytest.raises(openai.APIStatusError) as caught:
            _chat(client)
        assert caught.value.status_code == 503
        assert caught.value.response.headers["retry-after"] == "1"
        assert caught.value.body["code"] == "server_overloaded"
        assert "explorer.api_server.max_in_flight" in caught.value.message
        server.loop.call_soon_threadsafe(model.release.set)
        for thread in held:
            thread.join(10)
        assert _chat(client).choices[0].message.content == "held"  # slots free again
    finally:
        server.close()


def plain_client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.server.url}/v1", api_key="EMPTY", max_retries=0)


def _chat(client: openai.OpenAI) -> Any:
    return client.chat.completions.create(model="scripted", messages=USER, max_tokens=2)


def _wait_until(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _head(path: str, length: Any = None, chunked: bool = False) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", "Content-Type: application/json"]
    lines += [f"Content-Length: {length}"] if length is not None else []
    lines += ["Transfer-Encoding: chunked"] if chunked else []
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(sock: socket.socket, timeout: float = 10) -> tuple:
    """(status, JSON body) of the one reply on ``sock``; (None, None) when it closes first."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None, None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split(b" ")[1]), json.loads(body)


def test_a_stalled_client_holds_no_one_up_and_is_cut_off_after_read_timeout():
    server = served_by(ScriptedModel("ok"), APIServerConfig(read_timeout=3.0))
    where = (server.server.host, server.server.port)
    try:
        second_head = socket.create_connection(where)  # one request, then half of another
        second_head.sendall(b"GET /v1/models HTTP/1.1\r\nHost: test\r\n\r\n")
        assert _answer(second_head)[0] == 200
        time.sleep(1.0)  # within the read_timeout of the connection's opening
        second_head.sendall(b"GET /v1/models HTTP/1.1\r\n")
        silent = socket.create_connection(where)  # connects, sends nothing
        half_head = socket.create_connection(where)
        half_head.sendall(_head("/v1/chat/completions")[:40])
        half_body = socket.create_connection(where)
        half_body.sendall(_head("/v1/chat/completions", 100) + b'{"model": "scr')
        started = time.monotonic()
        assert _chat(plain_client(server)).choices[0].message.content == "ok"
        assert time.monotonic() - started < 2.0  # answered while the others stall
        status, body = _answer(half_body)
        assert status == 408 and body["error"]["code"] == "request_timeout"
        assert "explorer.api_server.read_timeout" in body["error"]["message"]
        assert 2.5 < time.monotonic() - started < 9
        for stalled in (silent, half_head, second_head):  # closed without an answer
            assert _answer(stalled) == (None, None)
        assert _chat(plain_client(server)).choices  # and the server goes on
    finally:
        server.close()


def test_a_body_over_max_body_bytes_is_a_413_and_is_never_kept():
    server = served_by(ScriptedModel("ok"), APIServerConfig(max_body_bytes=64 * 1024))
    where = (server.server.host, server.server.port)
    big = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "x" * 10**7}]})
    try:
        with socket.create_connection(where) as sock:  # a declared length over the limit
            sock.sendall(_head("/v1/chat/completions", len(big)) + big.encode())
            status, body = _answer(sock)
        assert status == 413 and body["error"]["code"] == "request_too_large"
        assert f"has {len(big)} bytes" in body["error"]["message"]
        assert "at most 65536 (explorer.api_server.max_body_bytes)" in body["error"]["message"]
        with socket.create_connection(where) as sock:  # chunked: counted as it comes
            chunk = b"x" * 50_000
            frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
            sock.sendall(_head("/v1/chat/completions", chunked=True) + frame * 3 + b"0\r\n\r\n")
            assert _answer(sock)[0] == 413
        assert _chat(plain_client(server)).choices  # a request within the limit
    finally:
        server.close()
