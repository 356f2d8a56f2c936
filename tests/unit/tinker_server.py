"""The Tinker service in this process, on 127.0.0.1, for tests that drive it with the
official SDK (``tinker.ServiceClient``) or with plain HTTP."""

import http.client
import json
import os
import urllib.parse
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from safetensors.torch import load_file

from trinity.tinker import ServeOptions, TinkerServer
from trinity.tinker.checkpoints import parse

KEY = "tml-test-key"  # the SDK sends only tml- keys


@contextmanager
def tinker_server(model: str, state_dir: str, **options: Any) -> Iterator[TinkerServer]:
    server = TinkerServer(ServeOptions(base_model=model, port=0, state_dir=state_dir, **options))
    try:
        yield server
    finally:
        server.close()


def request(
    url: str,
    method: str,
    path: str,
    body: Any = None,
    raw: Optional[bytes] = None,
    headers: Optional[Dict[str, str]] = None,
) -> Tuple[int, Any]:
    """(status, the reply's JSON) of one plain HTTP request; ``body`` goes as JSON."""
    where = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    sent = {"X-API-Key": KEY, "Content-Type": "application/json", **(headers or {})}
    try:
        conn.request(method, path, data, sent)
        reply = conn.getresponse()
        text = reply.read()
    finally:
        conn.close()
    return reply.status, json.loads(text) if text else None


def checkpoint_tensors(server: TinkerServer, path: str) -> Dict[str, torch.Tensor]:
    """The adapter tensors of a checkpoint the server wrote (``tinker://`` path)."""
    folder = server.service.store.folder(parse(path, "path"))
    return load_file(os.path.join(folder, "adapter_model.safetensors"))


def checkpoint_folder(server: TinkerServer, path: str) -> str:
    return server.service.store.folder(parse(path, "path"))
