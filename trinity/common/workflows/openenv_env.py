"""OpenEnv environments for ``openenv_workflow``: the server, the client, and what passes
between the model and the environment.

An OpenEnv environment is an ``Environment`` served over HTTP/WebSocket by openenv-core's
``create_app``; a client (openenv's ``GenericEnvClient``, or the environment's own
``EnvClient`` subclass) holds one WebSocket session per episode: ``reset``, then ``step``
until the result says ``done``. The workflow either connects to a server that runs already
(a URL) or serves an app itself (``LocalServer``): once per process that runs workflows
(each runner actor; in a stage of one process, that process), on a free port of 127.0.0.1,
stopped when that process exits.

openenv-core is an optional dependency (the ``openenv`` extra), imported on first use (its
import takes seconds: it brings gradio); the checks before start refuse a taskset naming the
workflow where it is not installed.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Dict, Iterator, Optional, Tuple

from trinity.utils.suggest import did_you_mean

INSTALL = 'pip install -e ".[openenv]" (or: pip install openenv-core)'
# Observation fields the default rendering reads, the first one present.
TEXT_FIELDS = ("text", "message", "prompt", "content", "observation")

_IMPORT_LOCK = threading.Lock()  # two threads importing a package at once can both fail
_SERVERS_LOCK = threading.Lock()
_SERVERS: Dict[Tuple[str, str], Any] = {}  # (app, app_dir) -> LocalServer or the Exception


class EnvError(RuntimeError):
    """An OpenEnv environment or its server failed: the episode fails (and is counted)."""


def openenv_core() -> Any:
    """The ``openenv.core`` module; ``ImportError`` with the install command without it."""
    with _IMPORT_LOCK:
        try:
            import openenv.core as core
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] != "openenv":
                raise
            raise ImportError(f"openenv_workflow needs openenv-core: {INSTALL}") from None
    return core


def split_path(path: str) -> Tuple[str, str]:
    """(module, attribute) of ``package.module:name`` or ``package.module.name``."""
    module, sep, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module or not attr or not sep:
        raise ValueError(f"'{path}' is not a dotted path: write package.module:name")
    return module, attr


@contextlib.contextmanager
def _importing_from(folder: Optional[str]) -> Iterator[None]:
    """``folder`` first on the import path while the block runs (an app not installed)."""
    if not folder:
        yield
        return
    where = os.path.abspath(folder)
    sys.path.insert(0, where)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(where)


def load_object(path: str, folder: Optional[str] = None) -> Any:
    """The object ``path`` names; ``ValueError`` saying what did not import (the package to
    install) or which name the module lacks."""
    module_name, attr = split_path(path)
    try:
        with _IMPORT_LOCK, _importing_from(folder):
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        where = f" (nor in {folder})" if folder else ""
        raise ValueError(
            f"cannot import '{path}': no module named '{exc.name}'{where}; install the "
            "package that provides it"
        ) from None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(
            f"importing '{module_name}' raised {type(exc).__name__}: {first}"
        ) from None
    if not hasattr(module, attr):
        names = [name for name in vars(module) if not name.startswith("_")]
        raise ValueError(f"module '{module_name}' has no '{attr}'{did_you_mean(attr, names)}")
    return getattr(module, attr)


# ---- the server ----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


class LocalServer:
    """``app`` (a dotted path of an ASGI app, e.g. openenv's ``create_app``'s) served by
    uvicorn in a child process on 127.0.0.1 (``openenv_serve``), which exits with this one."""

    def __init__(self, app: str, app_dir: Optional[str], startup_timeout: float) -> None:
        module, attr = split_path(app)
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.label = f"workflow_args.app = {app}"
        # The child imports what this process imports (the app's package, this project).
        paths = ([os.path.abspath(app_dir)] if app_dir else []) + [p for p in sys.path if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        self.log = tempfile.NamedTemporaryFile(prefix="openenv-server-", suffix=".log")
        # Run as a script, not a module of this package: importing the package is slow.
        command = [sys.executable, os.path.join(os.path.dirname(__file__), "openenv_serve.py")]
        command += [f"{module}:{attr}", str(port), str(os.getpid())]
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        atexit.register(self.stop)
        self._wait(startup_timeout)

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not _answers(self.url):
            if self.process.poll() is not None:
                raise EnvError(
                    f"the server of {self.label} exited (code {self.process.returncode}) "
                    f"before it answered: {self._log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise EnvError(
                    f"the server of {self.label} did not answer {self.url}/health within "
                    f"{timeout:g} s (workflow_args.startup_timeout): {self._log_tail()}"
                )
            time.sleep(0.5)

    def _log_tail(self) -> str:
        with open(self.log.name, errors="replace") as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
        return " | ".join(lines[-3:]) or "no output"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def served_url(app: str, app_dir: Optional[str], startup_timeout: float) -> str:
    """The URL of this process's server of ``app``, started on first use. A server that could
    not start is not tried again in this process: each later task fails with the same error."""
    key = (app, app_dir or "")
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if isinstance(server, Exception):
            raise server
        if server is None or not server.alive():
            try:
                server = LocalServer(app, app_dir, startup_timeout)
            except EnvError as exc:
                _SERVERS[key] = exc
                raise
            _SERVERS[key] = server
    return server.url


# ---- the client ----------------------------------------------------------------------------
async def connect(
    client_cls: Any, url: str, tries: int, timeout: float, step_timeout: float
) -> Any:
    """A client of ``client_cls`` (an ``EnvClient`` subclass; None: openenv's
    ``GenericEnvClient``) connected to ``url``, tried ``tries`` times, a second more between
    tries each time; ``EnvError`` naming the URL when none answered."""
    if client_cls is None:
        client_cls = openenv_core().GenericEnvClient
    last: Optional[BaseException] = None
    for attempt in range(1, tries + 1):
        client = client_cls(base_url=url, connect_timeout_s=timeout, message_timeout_s=step_timeout)
        try:
            return await client.connect()
        except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
            last = exc
        if attempt < tries:
            await asyncio.sleep(attempt)
    raise EnvError(f"the OpenEnv server at {url} did not answer ({tries} tries): {last}")


def observation_fields(observation: Any) -> Dict[str, Any]:
    """An observation as a dict: ``GenericEnvClient``'s are dicts; a typed client's are
    openenv ``Observation`` models."""
    if isinstance(observation, dict):
        return observation
    if hasattr(observation, "model_dump"):
        return observation.model_dump()
    raise EnvError(
        f"the observation is a {type(observation).__name__}, neither a dict nor an openenv "
        "Observation; set workflow_args.observation_to_text"
    )


def observation_text(observation: Any, field: Optional[str]) -> str:
    """The user message of an observation: its field ``field``, or else the first of
    ``TEXT_FIELDS`` it has; a value that is not a string as JSON."""
    fields = observation_fields(observation)
    for name in [field] if field else TEXT_FIELDS:
        if fields.get(name) is not None:
            value = fields[name]
            return value if isinstance(value, str) else json.dumps(value)
    wanted = f"field '{field}'" if field else f"text field ({', '.join(TEXT_FIELDS)})"
    raise EnvError(
        f"the observation has no {wanted}; its fields: {', '.join(sorted(fields))}. Set "
        "workflow_args.observation_field or observation_to_text"
    )


def text_action(text: str, field: str, action_type: Any) -> Any:
    """The reply ``text`` as an action: ``action_type(field=text)``, or without a type the
    dict ``{field: text}`` (what ``GenericEnvClient`` sends; the server builds its type)."""
    return {field: text} if action_type is None else action_type(**{field: text})
