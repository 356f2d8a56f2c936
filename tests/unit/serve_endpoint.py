"""Mode serve's endpoint in this process, as a stage hosts it: the engine's OpenAI-compatible
server with the serve routes, over a real queue host and synchronizer, and plain HTTP to it
(``http.client``: every status comes back as a value, nothing raises)."""

import http.client
import json
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional

import openai

from trinity.common.config.schema_explorer import APIServerConfig
from trinity.engine.local import LocalEngine
from trinity.runtime.queue_host import QueueHost
from trinity.runtime.serve_role import EndpointHooks
from trinity.runtime.synchronizer import Synchronizer
from trinity.utils.access import Secret
from trinity.utils.loop_host import LoopHost

USER = [{"role": "user", "content": "1+1="}]


@dataclass
class Endpoint:
    url: str
    client: openai.OpenAI
    queue: QueueHost
    sync: Any
    engine: LocalEngine
    key: Optional[str]

    def request(
        self, method: str, path: str, body: Any = None, raw: Optional[bytes] = None, **headers: str
    ) -> Dict[str, Any]:
        """The reply's JSON (``{}`` if none), with ``"http"``: its status and ``"headers"``.
        ``body`` is sent as JSON, ``raw`` as it is; the endpoint's key unless ``headers``
        name an ``Authorization`` (empty: none is sent)."""
        where = urllib.parse.urlsplit(self.url)
        sent = {"Content-Type": "application/json"}
        if self.key:
            sent["Authorization"] = f"Bearer {self.key}"
        sent = {k: v for k, v in {**sent, **headers}.items() if v}
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
        try:
            connection.request(method, path, body=data, headers=sent)
            reply = connection.getresponse()
            text = reply.read()
        finally:
            connection.close()
        found = json.loads(text) if text.strip() else {}
        return {**found, "http": reply.status, "headers": dict(reply.getheaders())}

    def post(self, path: str, body: Any = None, raw: Optional[bytes] = None) -> Dict[str, Any]:
        return self.request("POST", path, body, raw)

    def model(self) -> str:
        return self.engine.api_address()["model"]

    def chat(self, **kwargs: Any) -> Any:
        """A chat completion through the ``openai`` client."""
        return self.client.chat.completions.create(
            **{"model": self.model(), "messages": USER, "max_tokens": 6, **kwargs}
        )


@contextmanager
def serve_endpoint(
    micro_model: str, tmp_path: Any, key: Optional[str] = None, **limits: Any
) -> Iterator[Endpoint]:
    """A fresh endpoint over the micro model; ``key``: the API key it requires; ``limits``:
    ``explorer.api_server`` keys."""
    queue = QueueHost(f"sqlite:///{tmp_path / 'buffer.db'}", "buf", serving=True)
    sync = LoopHost(lambda: Synchronizer("memory", str(tmp_path), 10, True), "sync")
    hooks = EndpointHooks(queue, sync, 1.0, "log/trainer.log")
    where = {"host": "127.0.0.1", "port": 0, "serve": hooks, "limits": APIServerConfig(**limits)}
    engine = LocalEngine(
        "transformers",
        {**where, "api_key": Secret(key) if key else None},
        model_path=micro_model,
        max_model_len=256,
        max_prompt_tokens=None,
        max_response_tokens=6,
    )
    url = engine.api_address()["url"]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key or "EMPTY", max_retries=0)
    try:
        yield Endpoint(url, client, queue, sync, engine, key)
    finally:
        engine.close_server()
        engine.close()
        sync.close()
