"""The one place components become Ray actors (docs/design-notes.md, "Principles").

Each actor sets up its process first (plugins, a log file under ``<job_dir>/log/``, torch
threads), then builds the plain component it hosts.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Dict, List, Optional

import ray

import trinity.engine
from trinity.common.workflows.workflow import Task
from trinity.explorer.runner import AsyncWorkflowRunner, WorkflowRunner
from trinity.runtime.explorer_role import (
    ExplorerRole,
    engine_kwargs,
    engine_type_of,
    hosted,
    openai_api,
)
from trinity.runtime.placement import pinned
from trinity.runtime.queue_host import QueueHost
from trinity.runtime.roles import launch_env, setup_process
from trinity.runtime.serve_role import ServeRole
from trinity.runtime.trainer_role import TrainerRole
from trinity.utils.status import RunStatus


@ray.remote(num_cpus=0)
class RunnerActor(WorkflowRunner):
    """A threaded actor: ``max_concurrency`` tasks at once, one per thread."""

    def __init__(
        self,
        plugin_dirs: List[str],
        job_dir: str,
        name: str,
        level: str,
        by_node: bool = False,
        **kwargs: Any,
    ) -> None:
        setup_process(plugin_dirs, job_dir, name, level, by_node=by_node)
        super().__init__(**kwargs)


@ray.remote(num_cpus=0)
class AsyncRunnerActor(AsyncWorkflowRunner):
    """An async actor (``concurrent_mode: asynchronous``): ``max_concurrency`` tasks at once,
    as coroutines on its one event loop."""

    def __init__(
        self,
        plugin_dirs: List[str],
        job_dir: str,
        name: str,
        level: str,
        by_node: bool = False,
        **kwargs: Any,
    ) -> None:
        setup_process(plugin_dirs, job_dir, name, level, by_node=by_node)
        super().__init__(**kwargs)


# A rollout engine that dies is restarted this many times (with its initial weights: the
# explorer reloads the current ones before the next step); calls in flight are retried.
ENGINE_RESTARTS = 3


@ray.remote(num_cpus=0, max_restarts=ENGINE_RESTARTS, max_task_retries=2)
class EngineActor:
    """Hosts the engine ``ENGINES`` registers as ``engine_type`` (async methods: requests are
    batched), and with ``openai_api`` (``explorer_role.openai_api``) its OpenAI-compatible
    server."""

    def __init__(
        self,
        engine_type: str,
        plugin_dirs: List[str],
        job_dir: str,
        name: str,
        level: str,
        threads: int,
        openai_api: Optional[Dict[str, Any]] = None,
        by_node: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        # Plugins first: a plugin's engine is registered by importing its file here too.
        setup_process(plugin_dirs, job_dir, name, level, threads=threads, by_node=by_node)
        # The registry through its module: Ray ships an actor's methods by value with the
        # globals they name, so a registry imported by name would be the driver's copy,
        # without what this process's plugins register.
        engine_cls = trinity.engine.ENGINES.get(engine_type)
        self.model = engine_cls(num_threads=threads, **engine_kwargs)
        self.api: Optional[Dict[str, Any]] = None
        if openai_api is not None:
            self.api = self._serve(openai_api, engine_kwargs)

    def _serve(self, where: Dict[str, Any], engine_kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """Start the server (``where``: ``explorer_role.openai_api``) as a task on
        this actor's event loop (an async actor's ``__init__`` runs on it), so HTTP requests
        reach the same batching as ``chat``. A restarted engine serves again, on a new port
        when ``port`` is 0."""
        from trinity.engine.server import serve_engine, served_at

        model_path = engine_kwargs["model_path"]
        self.server = serve_engine(self.model, model_path, where)
        url = self.server.url
        if self.server.host in ("0.0.0.0", "::"):  # every interface: clients use the node's IP
            url = f"http://{ray.util.get_node_ip_address()}:{self.server.port}"
        return served_at(model_path, url, where.get("api_key"))

    async def api_address(self) -> Optional[Dict[str, Any]]:
        """``{"url", "model", "api_key"}`` of the OpenAI-compatible server (``server.served_at``),
        or None when it is off."""
        if self.api is not None and self.server.task.done():  # uvicorn failed or stopped
            raise RuntimeError(
                f"the OpenAI-compatible server at {self.api['url']} has stopped; see this "
                "engine's log for why"
            )
        return self.api

    async def close_server(self) -> None:
        """Stop the OpenAI-compatible server after answering the requests in flight."""
        if self.api is not None:
            await self.server.close()

    async def chat(
        self, messages: List[Dict], params: Any, tools: Any = None, session: Any = None
    ) -> Any:
        return await self.model.chat(messages, params, tools, session)

    async def generate(self, prompt: str, params: Any) -> Any:
        return await self.model.generate(prompt, params)

    async def prompt_length(
        self, messages: List[Dict], tools: Any = None, session: Any = None
    ) -> int:
        return await self.model.prompt_length(messages, tools, session)

    async def generate_ids(self, prompt_ids: List[int], params: Any) -> Any:
        return await self.model.generate_ids(prompt_ids, params)

    async def load_weights(self, weights: Any, version: int) -> None:
        await self.model.load_weights(weights, version)

    async def sync_phase(self) -> str:
        return await self.model.sync_phase()

    async def model_version(self) -> int:
        return await self.model.model_version()


# The experience queue: explorer (put) and trainer (get) call it at once.
QueueActor = ray.remote(num_cpus=0, max_concurrency=8)(QueueHost)
StatusActor = ray.remote(num_cpus=0)(RunStatus)
# The trainer (rank 0) of a stage that runs on Ray; local_stage.py runs a TrainerRole in-process.
TrainerActor = ray.remote(num_cpus=0)(TrainerRole)


class RayRunner:
    """A runner actor as ``explorer.pool.RunnerPool`` drives one, started at its first task: a
    stage of ``engine_num x runner_per_model`` runners starts as many processes (each imports
    torch, seconds of CPU) as its steps keep busy."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make: Callable[[], Any] = make
        self._actor: Any = None
        self._ready = False

    def submit(self, task: Task) -> concurrent.futures.Future:
        self.ready()
        return self._actor.run_task.remote(task).future()

    def start(self) -> None:
        if self._actor is None:
            self._actor = self._make()

    def ready(self) -> None:
        if not self._ready:
            self.start()
            ray.get(self._actor.__ray_ready__.remote())
            self._ready = True

    def stop(self) -> None:
        """Kill the actor: the only way to stop a workflow that runs on."""
        if self._actor is not None:
            ray.kill(self._actor, no_restart=True)


class RayExplorerRole(ExplorerRole):
    """The explorer with its engines and runners as Ray actors (on the nodes its placement
    names), so a runner whose workflow hangs or dies is killed and replaced."""

    def _start_engines(self, prefix: str, served: Any, auxiliary: Any = None) -> List[Any]:
        if not hosted(served):  # an API's clients: nothing to host on Ray
            return super()._start_engines(prefix, served, auxiliary)
        cfg = self.config
        return [
            EngineActor.options(
                name=f"{prefix}_engine_{i}",
                runtime_env={"env_vars": launch_env()},
                **self.placement.engine_options(prefix, i),
            ).remote(
                engine_type_of(served),
                self.plugin_dirs,
                cfg.checkpoint_job_dir,
                f"{prefix}_engine_{i}",
                cfg.log.level,
                self.placement.engine_threads(cfg, i),
                openai_api=openai_api(cfg, auxiliary, None if auxiliary else self.serve_hooks),
                by_node=cfg.log.group_by_node,
                **engine_kwargs(cfg, auxiliary),
            )
            for i in range(served.engine_num)
        ]

    def _make_runner(self, index: int) -> RayRunner:
        cfg = self.config
        name = f"{cfg.explorer.name}_runner_{index}"
        is_async = cfg.explorer.concurrent_mode == "asynchronous"
        # An async runner runs its slots as coroutines; blocking workflows get a thread each.
        options = {"threads": self.slots} if is_async else {}
        actor = AsyncRunnerActor if is_async else RunnerActor
        env_vars = {**cfg.explorer.env_vars, **launch_env()}
        return RayRunner(
            lambda: actor.options(
                name=name,
                max_concurrency=self.slots,
                **pinned(self.placement.engine_node(index % len(self.engines))),
                runtime_env={"env_vars": env_vars},
            ).remote(
                self.plugin_dirs,
                cfg.checkpoint_job_dir,
                name,
                cfg.log.level,
                by_node=cfg.log.group_by_node,
                **self._runner_kwargs(index, name),
                **options,
            )
        )


ExplorerActor = ray.remote(num_cpus=0)(RayExplorerRole)


class RayServeRole(ServeRole, RayExplorerRole):
    """``ServeRole`` with its engine as a Ray actor (``RayExplorerRole._start_engines``)."""


ServeActor = ray.remote(num_cpus=0)(RayServeRole)
