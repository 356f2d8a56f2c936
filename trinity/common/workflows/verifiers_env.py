"""verifiers environments for ``verifiers_workflow``: loaded once per process, tasks from rows.

Only what touches verifiers' own API (``verifiers.v1``, 0.4) lives here: building an
environment from ``workflow_args`` through verifiers' loader (``resolve_env_config``,
``load_environment``), the config check's probe, and turning a taskset row into one of the
environment's tasks. verifiers is imported when first needed (seconds), never at import.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import logging
import os
import shutil
import sys
import threading
import weakref
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence

logger = logging.getLogger(__name__)

# Where verifiers runs an agent's program when the config names no runtime: on this host.
# verifiers' own default is Prime's hosted sandboxes, which need an account and the network.
LOCAL_RUNTIME = {"type": "subprocess"}


class EnvError(RuntimeError):
    """An episode failed in the environment (its harness, tools, scoring or the episode's
    own hooks); the runner counts the task as failed and goes on."""


def vf() -> Any:
    """``verifiers.v1`` (imported on first use)."""
    import verifiers.v1 as module

    return module


def env_config(env_id: str, env_args: Dict[str, Any], config: Dict[str, Any]) -> Any:
    """verifiers' ``EnvConfig`` for ``env_id`` (its taskset, ``env_args`` its config), the
    rest of ``config`` as verifiers reads ``--env.*``; every agent seat whose runtime is not
    given runs on this host (``LOCAL_RUNTIME``). Raises verifiers' own errors."""
    from verifiers.v1.configs.agent import agent_config_fields

    taskset = {**config.get("taskset", {}), "id": loader_id(env_id), **env_args}
    raw = {**config, "taskset": taskset}
    resolved = vf().resolve_env_config(raw)
    seats = agent_config_fields(resolved)
    unset = [name for name in seats if "runtime" not in (config.get(name) or {})]
    if not unset:
        return resolved
    for name in unset:
        raw[name] = {**(config.get(name) or {}), "runtime": dict(LOCAL_RUNTIME)}
    return vf().resolve_env_config(raw)


def loader_id(env_id: str) -> str:
    """The id verifiers' loader is given for ``env_id``. The loader imports top-level module
    names only, so a dotted module path (``my_pkg.envs.sums``) is imported here and handed
    to it under a top-level alias (``my_pkg__envs__sums``); ids and hub ids pass as they are."""
    if "." not in env_id or "/" in env_id or "@" in env_id:
        return env_id
    module = importlib.import_module(env_id)
    alias = env_id.replace(".", "__").lower()
    sys.modules.setdefault(alias, module)
    return alias


_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def _load(key: str, thread: int) -> Any:
    env_id, env_args, config = json.loads(key)
    return vf().load_environment(env_config(env_id, env_args, config))


def env_key(env_id: str, env_args: Dict[str, Any], config: Dict[str, Any]) -> str:
    """The arguments an environment is built from, as one string."""
    return json.dumps([env_id, env_args, config], sort_keys=True)


def load_env(env_id: str, env_args: Dict[str, Any], config: Dict[str, Any]) -> Any:
    """The environment of these arguments, built once per thread (its taskset is loaded on
    first use of its tasks). Per thread: an environment keeps its serving resources on
    itself, bound to the event loop that entered them, so threads do not share one."""
    with _LOCK:
        return _load(env_key(env_id, env_args, config), threading.get_ident())


_PREPARED: set = set()  # env keys one of whose tasks has run to the end in this process
_PREPARING: Dict[str, threading.Lock] = {}


@contextlib.asynccontextmanager
async def prepared_once(key: str) -> AsyncIterator[None]:
    """The body alone in the process, across threads and event loops, until one run of it
    has ended for ``key``. verifiers' subprocess runtime prepares a harness's uv script
    under an asyncio lock that every event loop of the process shares (a class attribute):
    two loops preparing at once raise or wait forever. Once a task has prepared it, the
    script is cached process-wide and that lock is never taken again."""
    if key in _PREPARED:
        yield
        return
    with _LOCK:
        gate = _PREPARING.setdefault(key, threading.Lock())
    while not gate.acquire(blocking=False):  # polled: a blocking wait would stall the loop
        await asyncio.sleep(0.05)
    try:
        yield
        _PREPARED.add(key)
    finally:
        gate.release()


class _Serving:
    """One ``env.serving()`` for the episodes of one event loop that overlap: entered by the
    first, left after the last, inside a task of its own. verifiers keeps a serving's
    interception pool on the environment itself, so two overlapping ``serving()`` of one
    environment tear down each other's (episodes then wait forever); and what it enters
    must be left by the task that entered it."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.users = 0
        self.lock = asyncio.Lock()
        self.idle = asyncio.Event()
        self.holder: Optional[asyncio.Task] = None

    async def enter(self) -> None:
        async with self.lock:
            if self.users == 0:
                ready = asyncio.Event()
                self.idle = asyncio.Event()
                self.holder = asyncio.create_task(self._hold(ready))
                waiter = asyncio.ensure_future(ready.wait())
                await asyncio.wait({self.holder, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if not ready.is_set():  # serving() raised on the way in
                    holder, self.holder = self.holder, None
                    holder.result()
            self.users += 1

    async def leave(self) -> None:
        async with self.lock:
            self.users -= 1
            if self.users == 0 and self.holder is not None:
                self.idle.set()
                holder, self.holder = self.holder, None
                try:
                    await holder
                except Exception as exc:  # the episodes are done: their results stand
                    logger.warning("verifiers environment teardown failed: %s", exc)

    async def _hold(self, ready: asyncio.Event) -> None:
        async with self.env.serving():
            ready.set()
            await self.idle.wait()


_SERVINGS: weakref.WeakKeyDictionary[Any, Dict[int, _Serving]] = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def serving(env: Any) -> AsyncIterator[None]:
    """``env``'s serving resources for the episodes run inside, shared with the episodes
    that overlap them on this event loop (see ``_Serving``)."""
    per_env = _SERVINGS.setdefault(asyncio.get_running_loop(), {})
    shared = per_env.setdefault(id(env), _Serving(env))
    await shared.enter()
    try:
        yield
    finally:
        await shared.leave()


def declares_tools(env: Any) -> bool:
    """Whether ``env``'s taskset or its tasks declare toolsets (tools offered to the model)."""
    taskset = env.taskset
    task_config = getattr(taskset.config, "task", None)
    task_tools = task_config is not None and taskset.task_type().toolsets(task_config)
    return bool(taskset.toolsets(taskset.config) or task_tools)


def why_it_does_not_load(env_id: str, env_args: Dict[str, Any], config: Dict[str, Any]) -> str:
    """Why verifiers' loader refuses these arguments (one line naming the key), or ''."""
    from pydantic import ValidationError

    try:
        load_env(env_id, env_args, config)
    except ModuleNotFoundError as exc:
        return (
            f"env_id: verifiers environment '{env_id}' is not installed: install its package, "
            f"or set env_dir to the folder holding its module ({exc.msg.splitlines()[0]})"
        )
    except ValidationError as exc:
        return "; ".join(_key_problem(error) for error in exc.errors())
    except Exception as exc:  # the environment's own constructor refused them
        if _written_for_v03(env_id, exc):
            return (
                f"env_id: verifiers environment '{env_id}' is written for verifiers 0.3 "
                "(load_environment() returning SingleTurnEnv/MultiTurnEnv/ToolEnv); verifiers "
                f"{_version()} is installed, whose API is verifiers.v1 (a Taskset exported in "
                "__all__): 0.3 environments are not supported yet"
            )
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"env_id: verifiers could not build environment '{env_id}': {first}"
    return ""


def _written_for_v03(env_id: str, exc: Exception) -> bool:
    """Whether the environment is a verifiers 0.3 package: a ``load_environment`` function
    (0.3's entry point) and no Taskset, or a 0.3 name missing from ``verifiers``."""
    module = sys.modules.get(env_id.replace("-", "_").lower())
    if module is not None and callable(getattr(module, "load_environment", None)):
        return True
    return isinstance(exc, (AttributeError, ImportError)) and "'verifiers'" in str(exc)


def _version() -> str:
    from importlib.metadata import version

    return version("verifiers")


def _key_problem(error: Dict[str, Any]) -> str:
    """A verifiers validation error as the ``workflow_args`` key the user wrote."""
    loc = [str(part) for part in error.get("loc", ())]
    if loc[:1] == ["taskset"]:
        where = ".".join(["env_args", *loc[1:]])
    else:
        where = ".".join(["env_config", *loc])
    return f"{where}: {error.get('msg')}"


def env_tasks(env: Any) -> List[Any]:
    """The environment's own tasks, in its taskset's order (loaded once per environment)."""
    with _LOCK:
        tasks = env.__dict__.get("_trinity_tasks")
        if tasks is None:
            tasks = env._trinity_tasks = list(env.taskset)
    return tasks


# Columns of a row that are the project's, never a verifiers task's data.
_OWN_COLUMNS = ("task_index", "workflow_args", "reward_fn_args")


def row_task(env: Any, row: Dict[str, Any], where: str) -> Any:
    """The verifiers task a taskset row names: ``task_index`` picks one of the environment's
    own tasks; otherwise the row's columns are the task's data (its ``TaskData`` fields)."""
    from pydantic import ValidationError

    if "task_index" in row:
        index, tasks = row["task_index"], env_tasks(env)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tasks):
            raise ValueError(
                f"{where}: column 'task_index' must be an integer in [0, {len(tasks)}) "
                f"(the environment has {len(tasks)} tasks), got {index!r}"
            )
        return tasks[index]
    task_cls = type(env.taskset).task_type()
    data = {k: v for k, v in row.items() if k not in _OWN_COLUMNS}
    try:
        task_data = task_cls.data_type().model_validate(data)
    except ValidationError as exc:
        # One problem a column (a union's members each report one: the first says enough).
        first = {str(e["loc"][0]): e["msg"] for e in reversed(exc.errors()) if e["loc"]}
        problems = "; ".join(f"column '{column}': {msg}" for column, msg in first.items())
        raise ValueError(f"{where}: not a task of this environment: {problems}") from None
    return task_cls(task_data, env.taskset.config.task)


def use_env_dir(env_dir: Optional[str]) -> None:
    """Make the modules of ``env_dir`` importable here and in the programs verifiers starts
    (tool servers run as ``python -m <module>``): first on ``sys.path`` and ``PYTHONPATH``."""
    if not env_dir:
        return
    folder = os.path.abspath(env_dir)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *paths])


def uv_on_path() -> None:
    """Put the directory of this interpreter's ``uv`` on ``PATH`` when ``uv`` is not there:
    verifiers prepares its harness programs with ``uv`` found by name, and an environment
    run without activating its virtualenv has the venv's ``uv`` installed but not on PATH."""
    here = os.path.dirname(sys.executable)
    if shutil.which("uv") is None and shutil.which("uv", path=here):
        os.environ["PATH"] = os.pathsep.join([here, os.environ.get("PATH", "")])
        logger.debug("uv from %s put on PATH for verifiers' harness programs", here)


def episode_failure(episode: Any, made_calls: bool) -> str:
    """Why the episode failed (its first recorded error, or a failed model call where the
    episode made none that was answered), or '' when it did not."""
    traces = episode.traces
    errors: Sequence[Any] = [*episode.errors, *(e for t in traces for e in t.errors)]
    if not made_calls:  # a harness may end quietly after its model call failed
        errors = [*errors, *(c.error for t in traces for c in t.calls if c.error is not None)]
    if episode.ok and made_calls and not errors:
        return ""
    first = errors[0] if errors else None
    if first is None:
        return "the episode made no model call" if episode.ok else "it did not complete"
    return f"{first.type}: {(first.message.strip().splitlines() or [''])[0]}"
