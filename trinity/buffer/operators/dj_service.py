"""The Data-Juicer service (``service.data_juicer``): Data-Juicer in a server process.

``python -m trinity.buffer.operators.dj_service --port 5005`` serves ``POST /process``
(``{"process": [...], "np": n, "rows": [...]}`` -> ``{"rows": [...]}``: the rows Data-Juicer
keeps, with its columns) and ``GET /health`` on 127.0.0.1. The ``data_juicer`` operator
sends its rows there instead of running Data-Juicer itself: to a running server
(``server_url``), or to one it starts on ``port`` (``auto_start``) and stops when done.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

START_TIMEOUT_S = 120.0  # importing Data-Juicer takes seconds on a busy machine
DEFAULT_PORT = 5005  # the configuration guide's example
OWNER_POLL_S = 2.0  # how often an auto-started server checks that its owner is alive


def load_process(process: List[Tuple[str, Dict[str, Any]]], np: int) -> List[Any]:
    """Data-Juicer operator objects for ``process`` (``[(name, args)]``), ``np`` processes each."""
    from data_juicer.ops import load_ops

    try:
        return load_ops([{name: {"num_proc": np, **args}} for name, args in process])
    except KeyError as exc:
        raise ValueError(f"Data-Juicer has no operator {exc}") from None


def run_ops(ops: List[Any], rows: List[Dict]) -> List[Dict]:
    """The rows Data-Juicer's ``ops`` keep (with their columns), run in order."""
    from data_juicer.core.data import NestedDataset

    if not rows:
        return []
    dataset = NestedDataset.from_list(rows)
    for op in ops:
        dataset = op.run(dataset)
    return dataset.to_list()


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (Data-Juicer's statistics) as JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def create_app() -> Any:
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    loaded: Dict[str, List[Any]] = {}  # a recipe's operators, loaded once (models included)

    def run(process: List, np: int, rows: List[Dict]) -> List[Dict]:
        key = json.dumps([process, np], sort_keys=True)
        if key not in loaded:
            loaded[key] = load_process([(str(n), dict(a)) for n, a in process], np)
        return run_ops(loaded[key], rows)

    async def process(request: Request) -> Response:
        body = await request.json()
        try:
            np, rows = int(body.get("np", 1)), list(body["rows"])
            rows = await run_in_threadpool(run, body["process"], np, rows)
        except (KeyError, TypeError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        text = json.dumps({"rows": rows}, default=_plain)
        return Response(text, media_type="application/json")

    return Starlette(
        routes=[Route("/health", health), Route("/process", process, methods=["POST"])]
    )


class DataJuicerClient:
    """Sends rows to a Data-Juicer service at ``url``; ``start`` runs one on its port first."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.server: Optional[subprocess.Popen] = None
        self._log: Optional[str] = None

    def process(self, process: List[Tuple[str, Dict[str, Any]]], np: int, rows: List) -> List:
        body = json.dumps({"process": process, "np": np, "rows": rows}, default=_plain)
        request = urllib.request.Request(
            f"{self.url}/process", body.encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request) as reply:
                return json.loads(reply.read())["rows"]
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise RuntimeError(f"Data-Juicer service at {self.url}: {detail}") from None
        except urllib.error.URLError as exc:
            raise RuntimeError(
                f"Data-Juicer service at {self.url} cannot be reached ({exc.reason}): start it "
                "(python -m trinity.buffer.operators.dj_service --port PORT) or set "
                "service.data_juicer.auto_start: true"
            ) from None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def start(self, port: int) -> None:
        """Start a server on 127.0.0.1:``port`` and wait until it answers."""
        if _port_taken(port):
            raise RuntimeError(
                f"service.data_juicer.port = {port} is taken: auto_start needs a free port"
            )
        fd, self._log = tempfile.mkstemp(prefix="dj_service_", suffix=".log")
        owner = str(os.getpid())  # the server exits when this process is gone (killed actor)
        command = [sys.executable, "-m", __name__, "--port", str(port), "--owner-pid", owner]
        self.server = subprocess.Popen(command, stdout=fd, stderr=subprocess.STDOUT)
        os.close(fd)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.healthy():
            if self.server.poll() is not None or time.monotonic() > deadline:
                tail = self._tail()
                self.stop()
                raise RuntimeError(f"the Data-Juicer service on port {port} did not start:\n{tail}")
            time.sleep(0.5)

    def _tail(self, lines: int = 20) -> str:
        with open(self._log or os.devnull, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def stop(self) -> None:
        if self.server is not None:
            self.server.terminate()
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
            self.server = None
        if self._log:
            os.unlink(self._log)
            self._log = None


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _exit_with(owner: int) -> None:
    """End this server once process ``owner`` is gone (it cannot stop us any more)."""
    while True:
        time.sleep(OWNER_POLL_S)
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            os._exit(0)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--owner-pid", type=int, help="exit when this process ends")
    args = parser.parse_args()
    if args.owner_pid:
        threading.Thread(target=_exit_with, args=(args.owner_pid,), daemon=True).start()
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
