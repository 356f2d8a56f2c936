"""The explorer role: starts the engines and runners, feeds the plain ``Explorer`` its tasks
and weights, and writes what it makes to the experience queue.

``ExplorerRole`` starts its engines and runners in its own process (``LocalEngine``, runner
threads: a stage ``local_stage.py`` runs); ``actors.RayExplorerRole`` starts them as Ray actors.
"""

from __future__ import annotations

import logging
import math
from operator import attrgetter
from typing import Any, Callable, Dict, List, Optional

from trinity.buffer.selector_state import SelectorStateFile, selector_state_path
from trinity.common.config.config import rollouts_per_step
from trinity.common.sync_schedule import Wanted
from trinity.common.weights import weights_path
from trinity.engine import DEFAULT_ENGINE, ENGINES
from trinity.engine.local import LocalEngine
from trinity.explorer.bench import run_bench
from trinity.explorer.pool import LoopRunner, Runner, RunnerPool, ThreadRunner
from trinity.explorer.pool_rules import DynamicTimeout
from trinity.runtime.engine_weights import EngineWeights
from trinity.runtime.placement import Placement
from trinity.runtime.roles import call, call_all, log_to_file, role_monitor, setup_process
from trinity.utils.access import read_secret
from trinity.utils.loop_host import LoopHost
from trinity.utils.status import Reporter

logger = logging.getLogger(__name__)


def engine_kwargs(config: Any, auxiliary: Any = None) -> Dict[str, Any]:
    """The engine arguments of the rollout model, or of one of ``explorer.auxiliary_models``
    (its own folder, limits and template; the sampling rules of ``model`` apply to both)."""
    m, rollout = config.model, config.explorer.rollout_model
    own, served = auxiliary or m, auxiliary or rollout
    # keys of the served model's section that only some engines read (vllm's memory keys...)
    # and values elsewhere in the config (the tinker engine's base model)
    engine_cls = ENGINES.get(engine_type_of(served))
    engine_keys = getattr(engine_cls, "config_keys", ())
    paths = getattr(engine_cls, "config_paths", {})
    return dict(
        {key: getattr(served, key) for key in engine_keys},
        **{key: attrgetter(path)(config) for key, path in paths.items()},
        dtype=(auxiliary or rollout).dtype,
        seed=(auxiliary or rollout).seed,
        enable_thinking=(auxiliary or rollout).enable_thinking,
        reasoning_parser=(auxiliary or rollout).reasoning_parser,
        tool_call_parser=(auxiliary or rollout).tool_call_parser,
        enable_auto_tool_choice=(auxiliary or rollout).enable_auto_tool_choice,
        model_path=own.model_path,
        # A LoRA run starting from a pretrained adapter samples base + adapter from step 1.
        adapter_path=None if auxiliary or not m.lora_configs else m.lora_configs[0].path,
        max_model_len=own.max_model_len,
        max_prompt_tokens=own.max_prompt_tokens,
        max_response_tokens=own.max_response_tokens,
        min_response_tokens=m.min_response_tokens,
        enable_prompt_truncation=m.enable_prompt_truncation,
        # derive read model.chat_template_path (a file, or a tokenizer's) into the template
        chat_template=auxiliary.chat_template if auxiliary else m.custom_chat_template,
        repetition_penalty=m.repetition_penalty,
        # the host's first visible GPU: the one Ray gave its actor, or the stage's only one
        device="cuda" if config.cluster.gpu_per_node else "cpu",
    )


def openai_api(config: Any, auxiliary: Any = None, serve: Any = None) -> Optional[Dict[str, Any]]:
    """Where and how an engine serves its OpenAI-compatible API, or None when it is off:
    host, port, the request ``limits`` and ``api_key`` of ``explorer.api_server`` (the key
    read from this process's environment, where the launcher put it). Auxiliary models are
    always served: workflows reach them only through it. ``serve``: the rollout engine of
    mode serve, at ``explorer.listen_address:proxy_port`` with these hooks."""
    explorer = config.explorer
    guard = {"limits": explorer.api_server, "api_key": read_secret(explorer.api_server.api_key_env)}
    if serve is not None:
        return {
            "host": explorer.listen_address,
            "port": explorer.proxy_port,
            "serve": serve,
            **guard,
        }
    served = auxiliary or explorer.rollout_model
    if auxiliary is None and not served.enable_openai_api:
        return None
    return {"host": served.openai_api_host, "port": served.openai_api_port, **guard}


def engine_type_of(served: Any) -> str:
    """The engine of ``served`` (the rollout model's or an auxiliary model's section); an
    auxiliary model's is not derived when unset, and unset is the default engine."""
    return served.engine_type or DEFAULT_ENGINE


def hosted(served: Any) -> bool:
    """Whether the engine of ``served`` runs a model here, in a host of its own
    (``InferenceModel.hosted``)."""
    return ENGINES.get(engine_type_of(served)).hosted


def external_engine(config: Any, auxiliary: Any = None) -> Any:
    """The client engine (``hosted = False``: ``ExternalModel``) of the rollout model's API
    (``model.external_model``) or of an auxiliary model's, read from this process's
    environment. The rollout model makes experiences with the tokenizer at
    ``model.model_path``."""
    served = auxiliary or config.explorer.rollout_model
    engine_cls = ENGINES.get(engine_type_of(served))
    if auxiliary is None:
        return engine_cls.from_config(
            config.model.external_model,
            "model.external_model",
            served.model_path,
            tokenizer_path=config.model.model_path,
            chat_template=config.model.custom_chat_template,
        )
    index = next(i for i, a in enumerate(config.explorer.auxiliary_models) if a is auxiliary)
    key = f"explorer.auxiliary_models[{index}].external_model"
    return engine_cls.from_config(auxiliary.external_model, key, auxiliary.model_path)


def local_engine(
    config: Any, name: str, auxiliary: Any = None, threads: int = 0, serve: Any = None
) -> Any:
    """The rollout model's engine (or ``auxiliary``'s) in this process: a ``LocalEngine``
    named ``name`` with ``threads`` torch threads (0: torch's default), or for an external
    model a client of its API (no engine starts, runners call it directly). ``serve``: see
    ``openai_api``."""
    served = auxiliary or config.explorer.rollout_model
    if not hosted(served):
        return external_engine(config, auxiliary)
    kwargs = engine_kwargs(config, auxiliary)
    if threads:
        kwargs["num_threads"] = threads
    api = openai_api(config, auxiliary, serve)
    return LocalEngine(engine_type_of(served), api, name=name, **kwargs)


def task_timeout(explorer: Any) -> DynamicTimeout:
    """Each task's time limit: ``explorer.max_timeout``, or with ``explorer.dynamic_timeout``
    the mean successful task time x its ``ratio`` (capped by ``max_timeout``)."""
    dynamic = explorer.dynamic_timeout
    return DynamicTimeout(explorer.max_timeout, dynamic.ratio if dynamic.enable else None)


# Samples of an evaluation an engine takes at once: its batch (TransformersEngine's
# max_num_seqs). Evaluations are not bound by the training batch: a held-out set of 200
# questions is one engine batch, not 25 of 8.
EVAL_ROWS_PER_ENGINE = 256


def runner_slots(config: Any, runners: int) -> int:
    """Samples (and so tasks) one runner has in flight: a whole step's batch, or an engine
    batch of evaluation tasks per engine, spread over the runners in ``multi-threading`` and
    ``asynchronous`` modes; one task at a time when ``sequential``."""
    if config.explorer.concurrent_mode == "sequential":
        return 1
    rows = rollouts_per_step(config)
    if config.buffer.explorer_input.eval_tasksets:
        rows = max(rows, EVAL_ROWS_PER_ENGINE * config.explorer.rollout_model.engine_num)
    return max(1, math.ceil(rows / max(1, runners)))


def resume_reader(reader: Any, states: SelectorStateFile, step: int, batch_size: int) -> None:
    """Put a training taskset reader where it was after explore step ``step``: its position
    by reading the ``step`` batches again, then what its selectors had learned by then."""
    if step == 0:
        return
    for _ in range(step):  # the batches already explored and trained on
        reader.read(batch_size)
    learned = states.load(step)
    if learned is not None:
        reader.load_learned_state(learned)
    elif reader.learns:
        logger.warning(
            "%s holds no selector state for explore step %d: the selector restarts without "
            "the feedback it had learned from",
            states.path,
            step,
        )


class ExplorerRole(EngineWeights):
    # mode serve (serve_role.py): the hooks of the rollout engine's serve routes
    serve_hooks: Any = None

    def __init__(
        self,
        config: Any,
        plugin_dirs: List[str],
        queue: Any,
        sync: Any,
        status: Any = None,
        placement: Optional[Placement] = None,
    ) -> None:
        setup_process(
            plugin_dirs,
            config.checkpoint_job_dir,
            config.explorer.name,
            config.log.level,
            by_node=config.log.group_by_node,
        )
        self.config, self.plugin_dirs, self.queue, self.sync_actor = (
            config,
            plugin_dirs,
            queue,
            sync,
        )
        self.placement = placement or Placement()  # the engines' (and runners') nodes
        self.report = Reporter(status, "explorer")
        self.loaded_version = 0

    def start_engines(self) -> None:
        """Start the engines and the runners, and wait until the runners are up. The
        launcher calls it while the trainer prepares, so their processes start together."""
        cfg = self.config
        self.engines = self._start_engines(cfg.explorer.name, cfg.explorer.rollout_model)
        # engines of explorer.auxiliary_models[i]: not trained, served over the OpenAI API
        self.auxiliary = [
            self._start_engines(f"{cfg.explorer.name}_auxiliary_{i}", aux, aux)
            for i, aux in enumerate(cfg.explorer.auxiliary_models)
        ]
        runners = cfg.explorer.runner_per_model * len(self.engines)
        self.slots = runner_slots(cfg, runners)
        self.pool = RunnerPool(
            self._make_runner,
            runners,
            cfg.explorer.max_timeout,
            self.slots,
            max_retry_times=cfg.explorer.max_retry_times,
            report=self.report,
            timeout=task_timeout(cfg.explorer),
        )

    def prepare(self, start_step: int) -> int:
        """Build the readers and the ``Explorer`` (after ``start_engines``); returns the step
        exploring resumes after.

        With a queue that already holds explored steps (a resumed run), exploring continues
        after the last step written: what was explored is trained on, not explored again.
        """
        from trinity.buffer import MixedTaskReader, TaskReader
        from trinity.buffer.pipelines import build_task_pipeline
        from trinity.explorer.explorer import Explorer

        cfg, pool = self.config, self.pool
        if cfg.mode == "bench":  # evaluates saved checkpoints: no taskset, no queue
            return self._prepare_bench(pool)
        if self.queue is not None:
            start_step = max(start_step, call(self.queue, "last_step"))
            if cfg.mode == "explore":  # a decoupled trainer stops at the end mark: not yet
                call(self.queue, "set_explorer_finished", False)
        buf, pipeline = cfg.buffer, build_task_pipeline(cfg)
        readers = [
            TaskReader(ts, buf.total_epochs, buf.total_steps, pipeline)
            for ts in buf.explorer_input.tasksets
        ]
        if pipeline is not None:
            pipeline.close()
        reader = readers[0] if len(readers) == 1 else MixedTaskReader(readers)
        states = SelectorStateFile(selector_state_path(cfg.checkpoint_job_dir))
        resume_reader(reader, states, start_step, cfg.buffer.batch_size)
        evals = {ts.name: TaskReader(ts) for ts in cfg.buffer.explorer_input.eval_tasksets}
        self.monitor = role_monitor(cfg, "explorer", start_step)
        write = self._writer(reader, states) if self.queue is not None else None
        self.explorer = Explorer(
            cfg, pool, reader, evals, self._sync, write, self.monitor.log, start_step, self.report
        )
        return start_step

    def _writer(self, reader: Any, states: SelectorStateFile) -> Callable[[List[Any], int], None]:
        """``write(experiences, step)`` for the ``Explorer``: what the selectors learned up to
        the step is saved first (``selector_state.py`` says why), then the step is queued."""

        def write(exps: List[Any], step: int) -> None:
            states.save(step, reader.learned_state())
            call(self.queue, "put", exps, step)

        return write

    def _prepare_bench(self, pool: RunnerPool) -> int:
        from trinity.buffer import TaskReader
        from trinity.explorer.bench import bench_steps
        from trinity.explorer.explorer import Explorer

        cfg = self.config
        evals = {ts.name: TaskReader(ts) for ts in cfg.buffer.explorer_input.eval_tasksets}
        self.bench_steps = bench_steps(cfg)
        # A monitor of its own: the run's explorer records and tracker runs stay untouched.
        self.monitor = role_monitor(cfg, "bench", None)
        self.explorer = Explorer(
            cfg, pool, None, evals, self._sync, None, self.monitor.log, 0, self.report
        )
        return 0

    def _load_checkpoint(self, step: int) -> int:
        """Bench mode: every engine loads checkpoint ``step`` from disk (step 0: the base
        weights they started with); returns the oldest version an engine holds."""
        if not hosted(self.config.explorer.rollout_model):
            return 0  # an API's model, evaluated as it is (bench_steps: step 0 only)
        if step > 0:
            path = weights_path(self.config.checkpoint_job_dir, step)
            call_all(self.engines, "load_weights", path, step)
        return min(call_all(self.engines, "model_version"))

    def _start_engines(self, prefix: str, served: Any, auxiliary: Any = None) -> List[Any]:
        """``served.engine_num`` engines named ``<prefix>_engine_<i>``, in this process."""
        cfg, engines = self.config, []
        for i in range(served.engine_num):
            name = f"{prefix}_engine_{i}"
            if hosted(served):  # an API's client logs nothing of its own
                log_to_file(cfg.checkpoint_job_dir, name, cfg.log.group_by_node)
            threads = self.placement.engine_threads(cfg, i)
            serve = None if auxiliary else self.serve_hooks
            engines.append(local_engine(cfg, name, auxiliary, threads, serve))
        return engines

    def _runner_kwargs(self, index: int, name: str) -> Dict[str, Any]:
        """What runner ``index`` (named ``name``) is built with, wherever it runs."""
        cfg = self.config
        return dict(
            engine=self.engines[index % len(self.engines)],
            auxiliary_engines=[engines[index % len(engines)] for engines in self.auxiliary],
            default_params={
                "max_tokens": cfg.model.max_response_tokens,
                "min_tokens": cfg.model.min_response_tokens,
            },
            max_retry_times=cfg.explorer.max_retry_times,
            enable_history=cfg.explorer.rollout_model.enable_history,
            report=Reporter(self.report.board, name),
            report_interval=cfg.explorer.runner_state_report_interval,
        )

    def _make_runner(self, index: int) -> Runner:
        """Runner ``index`` in this process: an async runner on a loop of its own
        (``concurrent_mode: asynchronous``), else a thread per task."""
        from trinity.explorer.runner import AsyncWorkflowRunner, WorkflowRunner

        cfg = self.config
        name = f"{cfg.explorer.name}_runner_{index}"
        log_to_file(cfg.checkpoint_job_dir, name, cfg.log.group_by_node)
        kwargs = self._runner_kwargs(index, name)
        if cfg.explorer.concurrent_mode == "asynchronous":
            return LoopRunner(lambda: AsyncWorkflowRunner(threads=self.slots, **kwargs), name)
        return ThreadRunner(WorkflowRunner(**kwargs), name)

    def _sync(self, want: Wanted) -> int:
        """Make every engine hold the weights ``want`` says (``explore`` mode: the newest on
        disk). Also reloads an engine that came back from a restart with its initial weights.
        """
        if not hosted(self.config.explorer.rollout_model):
            return self.loaded_version  # an API takes no weights (validated: explore mode)
        if want.ask:
            call(self.sync_actor, "ask")
        if want.version and self.config.synchronizer.sync_style == "explorer_driven":
            call(self.sync_actor, "need", want.version)  # max_staleness's floor
        if self.config.mode == "explore":
            found = call(self.sync_actor, "wait_for", self.loaded_version + 1, 0.0)
        elif want.final:
            # The trainer ends after reading what is left in the queue: nothing more comes.
            if self.queue is not None:
                call(self.queue, "close")
            found = self._wait_for_trainer(None)
        elif want.version is None:
            found = None
        else:
            if self._releases(want.version):  # the trainer steps on the device meanwhile
                freed = sum(call_all(self.engines, "release"))
                logger.info("engines released %.1f MB of weights", freed / 1e6)
            found = self._wait_for_trainer(want.version)
        versions = call_all(self.engines, "model_version")
        stale = [e for e, v in zip(self.engines, versions, strict=True) if v < self.loaded_version]
        if found is not None and found[0] > self.loaded_version and found[1]:
            stale, self.loaded_version = self.engines, found[0]
        elif stale and self._collective():
            raise RuntimeError(self._lost(stale))
        if stale:
            found = found or call(self.sync_actor, "wait_for", self.loaded_version, 0.0)
            if found is not None and found[1]:
                self._load_into(stale, found[1][0], found[0])
        return self.loaded_version

    def close(self) -> None:
        """Stop the engines and runners this process hosts (their servers, their loops)."""
        for engine in [*self.engines, *(e for engines in self.auxiliary for e in engines)]:
            if isinstance(engine, LoopHost):
                engine.close()
        for runner in self.pool.runners:
            runner.stop()

    def run(self) -> Any:
        """Explore to the end (returns the last step), or in bench mode evaluate each
        checkpoint (returns their metrics records)."""
        try:
            if self.config.mode == "bench":
                return run_bench(self.explorer, self.bench_steps, self._load_checkpoint)
            step = self.explorer.run()
            if self._collective():  # nccl: the trainer waits in each broadcast until its end
                self._sync(Wanted(None, final=True))
            if self.queue is not None and self.config.mode == "explore":
                call(self.queue, "set_explorer_finished", True)  # every step written
            return step
        except BaseException:
            logger.exception("the explorer failed")
            raise
        finally:
            if self.queue is not None:
                call(self.queue, "close")
            self.monitor.close()
            if self.explorer.pipeline is not None:
                self.explorer.pipeline.close()  # e.g. stops an auto-started Data-Juicer service
