"""Explorer and trainer actors: build the plain components and connect them to Ray peers."""

from __future__ import annotations

import logging
import math
import os
import time
import traceback
from typing import Any, Dict, List, Optional

import ray

from trinity.runtime.actors import (
    AsyncRunnerActor,
    EngineActor,
    RayRunnerPool,
    RunnerActor,
    compute_threads,
    setup_process,
)
from trinity.runtime.placement import Placement, own_node_cpus, pinned
from trinity.runtime.status import Reporter
from trinity.runtime.synchronizer import SyncTimeoutError, last_readable_step, pack_state

logger = logging.getLogger(__name__)

# Waits happen in slices this long, so a waiting role can say what it waits for.
WAIT_SLICE_S = 2.0


def _chat_template(model_cfg: Any) -> Optional[str]:
    if model_cfg.chat_template_path:
        with open(model_cfg.chat_template_path, encoding="utf-8") as f:
            return f.read()
    return model_cfg.custom_chat_template


def engine_kwargs(config: Any, auxiliary: Any = None) -> Dict[str, Any]:
    """The engine arguments of the rollout model, or of one of ``explorer.auxiliary_models``
    (its own folder, limits and template; the sampling rules of ``model`` apply to both)."""
    m, rollout = config.model, config.explorer.rollout_model
    own = auxiliary or m
    return dict(
        dtype=(auxiliary or rollout).dtype,
        seed=(auxiliary or rollout).seed,
        model_path=own.model_path,
        # A LoRA run starting from a pretrained adapter samples base + adapter from step 1.
        adapter_path=None if auxiliary or not m.lora_configs else m.lora_configs[0].path,
        max_model_len=own.max_model_len,
        max_prompt_tokens=own.max_prompt_tokens,
        max_response_tokens=own.max_response_tokens,
        min_response_tokens=m.min_response_tokens,
        enable_prompt_truncation=m.enable_prompt_truncation,
        chat_template=auxiliary.chat_template if auxiliary else _chat_template(m),
        repetition_penalty=m.repetition_penalty,
    )


def _openai_api(config: Any, auxiliary: Any = None) -> Optional[Dict[str, Any]]:
    """Where an engine serves its OpenAI-compatible API, or None when it is off. Auxiliary
    models are always served: workflows reach them only through it."""
    served = auxiliary or config.explorer.rollout_model
    if auxiliary is None and not served.enable_openai_api:
        return None
    return {"host": served.openai_api_host, "port": served.openai_api_port}


def external_engine(config: Any, auxiliary: Any = None) -> Any:
    """An ``ExternalModel`` for the rollout model's API (``model.external_model``) or for an
    auxiliary model's, read from this process's environment. The rollout model makes
    experiences with the tokenizer at ``model.model_path``."""
    from trinity.engine.external import ExternalModel

    if auxiliary is None:
        rollout = config.explorer.rollout_model
        return ExternalModel.from_config(
            config.model.external_model,
            "model.external_model",
            rollout.model_path,
            tokenizer_path=config.model.model_path,
            chat_template=_chat_template(config.model),
        )
    index = next(i for i, a in enumerate(config.explorer.auxiliary_models) if a is auxiliary)
    key = f"explorer.auxiliary_models[{index}].external_model"
    return ExternalModel.from_config(auxiliary.external_model, key, auxiliary.model_path)


def runner_slots(config: Any, runners: int) -> int:
    """Samples (and so tasks) one runner has in flight: a whole step's batch spread over the
    runners in ``multi-threading`` and ``asynchronous`` modes, one task at a time when
    ``sequential``."""
    if config.explorer.concurrent_mode == "sequential":
        return 1
    rows = config.buffer.batch_size * config.algorithm.repeat_times
    return max(1, math.ceil(rows / max(1, runners)))


def _monitor(config: Any, role: str, resumes_after: int) -> Any:
    """The role's metrics sinks; records a killed run wrote after ``resumes_after`` go."""
    from trinity.monitor import Monitor

    mon, job_dir = config.monitor, config.checkpoint_job_dir
    return Monitor(
        job_dir, config.name, role, mon.monitor_type, mon.monitor_args, keep_until=resumes_after
    )


@ray.remote(num_cpus=0)
class ExplorerActor:
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

    def prepare(self, start_step: int) -> int:
        """Build engines, runners and readers; returns the step exploring resumes after.

        With a queue that already holds explored steps (a resumed run), exploring continues
        after the last step written: what was explored is trained on, not explored again.
        """
        from trinity.buffer import MixedTaskReader, TaskReader
        from trinity.explorer.explorer import Explorer

        cfg = self.config
        self.engines = self._start_engines(cfg.explorer.name, cfg.explorer.rollout_model)
        # engines of explorer.auxiliary_models[i]: not trained, served over the OpenAI API
        self.auxiliary = [
            self._start_engines(f"{cfg.explorer.name}_auxiliary_{i}", aux, aux)
            for i, aux in enumerate(cfg.explorer.auxiliary_models)
        ]
        runners = cfg.explorer.runner_per_model * len(self.engines)
        self.slots = runner_slots(cfg, runners)
        pool = RayRunnerPool(
            self._make_runner,
            runners,
            cfg.explorer.max_timeout,
            self.slots,
            max_retry_times=cfg.explorer.max_retry_times,
            report=self.report,
        )
        if self.queue is not None:
            start_step = max(start_step, ray.get(self.queue.last_step.remote()))
        buf = cfg.buffer
        readers = [
            TaskReader(ts, buf.total_epochs, buf.total_steps) for ts in buf.explorer_input.tasksets
        ]
        reader = readers[0] if len(readers) == 1 else MixedTaskReader(readers)
        for _ in range(start_step):  # resume: skip the batches already explored and trained on
            reader.read(cfg.buffer.batch_size)
        evals = {ts.name: TaskReader(ts) for ts in cfg.buffer.explorer_input.eval_tasksets}
        self.monitor = _monitor(cfg, "explorer", start_step)
        write = (
            (lambda exps, step: ray.get(self.queue.put.remote(exps, step))) if self.queue else None
        )
        self.explorer = Explorer(
            cfg, pool, reader, evals, self._sync, write, self.monitor.log, start_step, self.report
        )
        return start_step

    def _start_engines(self, prefix: str, served: Any, auxiliary: Any = None) -> List[Any]:
        """``served.engine_num`` engine actors named ``<prefix>_engine_<i>``; for an external
        model, as many references to its API (no engine starts, runners call it directly)."""
        cfg = self.config
        if served.engine_type == "external":
            return [external_engine(cfg, auxiliary)] * served.engine_num
        return [
            EngineActor.options(
                name=f"{prefix}_engine_{i}", **pinned(self.placement.engine_node(i))
            ).remote(
                cfg.checkpoint_job_dir,
                f"{prefix}_engine_{i}",
                cfg.log.level,
                self.placement.engine_threads(cfg, i),
                openai_api=_openai_api(cfg, auxiliary),
                by_node=cfg.log.group_by_node,
                **engine_kwargs(cfg, auxiliary),
            )
            for i in range(served.engine_num)
        ]

    def _make_runner(self, index: int) -> Any:
        cfg = self.config
        name = f"{cfg.explorer.name}_runner_{index}"
        is_async = cfg.explorer.concurrent_mode == "asynchronous"
        # An async runner runs its slots as coroutines; blocking workflows get a thread each.
        options = {"threads": self.slots} if is_async else {}
        actor = AsyncRunnerActor if is_async else RunnerActor
        return actor.options(
            name=name,
            max_concurrency=self.slots,
            **pinned(self.placement.engine_node(index % len(self.engines))),
            runtime_env={"env_vars": dict(cfg.explorer.env_vars)}
            if cfg.explorer.env_vars
            else None,
        ).remote(
            self.plugin_dirs,
            cfg.checkpoint_job_dir,
            name,
            cfg.log.level,
            by_node=cfg.log.group_by_node,
            engine=self.engines[index % len(self.engines)],
            auxiliary_engines=[engines[index % len(engines)] for engines in self.auxiliary],
            default_params={
                "max_tokens": cfg.model.max_response_tokens,
                "min_tokens": cfg.model.min_response_tokens,
            },
            max_retry_times=cfg.explorer.max_retry_times,
            enable_history=cfg.explorer.rollout_model.enable_history,
            **options,
        )

    def _sync(self, version: int) -> int:
        """Make every engine hold weights >= ``version`` (``explore`` mode: the newest on disk).

        Also reloads an engine that came back from a restart with its initial weights.
        """
        if self.config.explorer.rollout_model.engine_type == "external":
            return self.loaded_version  # an API takes no weights (validated: explore mode)
        if self.config.mode == "explore":
            found = ray.get(self.sync_actor.wait_for.remote(self.loaded_version + 1, 0.0))
        else:
            found = self._wait_for_trainer(version)
        versions = ray.get([e.model_version.remote() for e in self.engines])
        stale = [e for e, v in zip(self.engines, versions, strict=True) if v < self.loaded_version]
        if found is not None and found[0] > self.loaded_version and found[1]:
            stale, self.loaded_version = self.engines, found[0]
        if stale:
            found = found or ray.get(self.sync_actor.wait_for.remote(self.loaded_version, 0.0))
            if found is not None and found[1]:
                ray.get([e.load_weights.remote(found[1][0], found[0]) for e in stale])
        return self.loaded_version

    def _wait_for_trainer(self, version: int) -> Any:
        """(version, weights) from the synchronizer, waiting in slices and saying so."""
        timeout = self.config.synchronizer.sync_timeout
        start, since = time.monotonic(), time.time()
        while (left := timeout - (time.monotonic() - start)) > 0:
            found = ray.get(self.sync_actor.wait_for.remote(version, min(WAIT_SLICE_S, left)))
            if found is not None:
                self.report.done()
                return found
            self.report.wait(
                f"the trainer to publish model version {version} "
                f"(synchronizer.sync_timeout={timeout:g}s)",
                since=since,
            )
        latest = ray.get(self.sync_actor.published.remote())
        raise SyncTimeoutError(
            f"the trainer did not publish model version {version} within "
            f"synchronizer.sync_timeout={timeout:g}s (latest published: {latest}); "
            "it is slow or stuck: see its log"
        )

    def run(self) -> int:
        try:
            return self.explorer.run()
        except BaseException:
            logger.exception("the explorer failed")
            raise
        finally:
            if self.queue is not None:
                ray.get(self.queue.close.remote())
            self.monitor.close()


@ray.remote(num_cpus=0)
class TrainerActor:
    def __init__(
        self,
        config: Any,
        plugin_dirs: List[str],
        queue: Any,
        sync: Any,
        planned_steps: int,
        status: Any = None,
    ):
        setup_process(
            plugin_dirs,
            config.checkpoint_job_dir,
            config.trainer.name,
            config.log.level,
            threads=compute_threads(config, "trainer", own_node_cpus(config)),
            by_node=config.log.group_by_node,
        )
        self.config, self.queue, self.sync_actor = config, queue, sync
        self.planned_steps = planned_steps
        self.report = Reporter(status, "trainer")

    def rendezvous(self) -> Any:
        """(node id, port) where this actor, rank 0 of several trainer ranks, will listen."""
        from trinity.runtime.trainer_ranks import rendezvous

        where = rendezvous()
        self.group_port = where[1]
        return where

    def prepare(self) -> int:
        from trinity.runtime.trainer_ranks import sharded_trainer
        from trinity.trainer.checkpoint import latest_step
        from trinity.trainer.trainer import Trainer

        resumes_after = latest_step(self.config.checkpoint_job_dir) or 0
        self.monitor = _monitor(self.config, "trainer", resumes_after)
        # Only a `both` run has an explorer waiting for weights in this job.
        publish = self._publish if self.config.mode == "both" else None
        kwargs = dict(
            planned_steps=self.planned_steps,
            log=self.monitor.log,
            publish=publish,
            report=self.report.event,
        )
        if self.config.trainer.cpu_ranks > 1:  # rank 0 of several (trainer_ranks.py)
            self.trainer = sharded_trainer(self.config, 0, self.group_port, **kwargs)
        else:
            self.trainer = Trainer(self.config, **kwargs)
        step = self.trainer.prepare_model()
        self.trainer.attach_reader(self._reader(), self._auxiliary_readers())
        if step and self.config.mode == "both":
            self._publish(step, self.trainer.model)
        return step

    def _reader(self) -> Any:
        """The experience buffer: the queue in ``both`` mode, else a file dataset whose rows
        become experiences per the algorithm's schema (SFT rows, or DPO pairs)."""
        cfg = self.config
        storage = cfg.buffer.trainer_input.experience_buffer
        if self.queue is not None:
            sync = cfg.synchronizer
            return QueueReader(
                self.queue,
                storage.max_read_timeout,
                lambda t: last_readable_step(t, sync.sync_interval, sync.sync_offset),
                whole_groups=self.trainer.needs_groups,
                report=self.report,
            )
        return self._file_reader(storage, cfg.buffer.total_epochs, cfg.buffer.total_steps)

    def _file_reader(self, storage: Any, total_epochs: int, total_steps: Optional[int]) -> Any:
        from trinity.algorithm.algorithm import PairExperienceModel
        from trinity.buffer import SFTReader
        from trinity.buffer.dpo import DPOReader

        cfg = self.config
        paired = self.trainer.algorithm.schema is PairExperienceModel
        # DPO reads train_batch_size experiences = half as many (chosen, rejected) pairs.
        size = cfg.buffer.train_batch_size // 2 if paired else cfg.buffer.train_batch_size
        reader_cls = DPOReader if paired else SFTReader
        return reader_cls(
            storage,
            self.trainer.tokenizer,
            size,
            total_epochs,
            total_steps,
            cfg.model.max_model_len,
        )

    def _auxiliary_readers(self) -> Dict[str, Any]:
        """``buffer.trainer_input.auxiliary_buffers``: SFT data, cycled while training runs."""
        from trinity.buffer import SFTReader

        cfg = self.config
        return {
            name: SFTReader(
                storage,
                self.trainer.tokenizer,
                cfg.buffer.train_batch_size,
                total_epochs=10**9,  # an auxiliary dataset repeats; the main buffer ends the run
                max_model_len=cfg.model.max_model_len,
            )
            for name, storage in cfg.buffer.trainer_input.auxiliary_buffers.items()
        }

    def _publish(self, version: int, model: Any) -> None:
        if self.config.synchronizer.sync_method == "memory":
            from trinity.trainer.lora import sync_state_dict  # LoRA: merged adapted layers

            sharded = self.config.trainer.cpu_ranks > 1  # gathered from every rank
            state = self.trainer.full_state_dict() if sharded else sync_state_dict(model)
            weights = [ray.put(pack_state(state))]
        else:
            self.trainer.save(final=False)
            from trinity.trainer.checkpoint import weights_path

            weights = [weights_path(self.config.checkpoint_job_dir, version)]
        ray.get(self.sync_actor.publish.remote(version, weights))

    def run(self) -> int:
        try:
            step = self.trainer.run()
            ray.get(self.sync_actor.trainer_finished.remote())
            return step
        except BaseException:
            logger.exception("the trainer failed")
            ray.get(self.sync_actor.trainer_finished.remote(traceback.format_exc(limit=3)))
            raise
        finally:
            self.monitor.close()

    def final_hf_dir(self) -> Optional[str]:
        from trinity.trainer.checkpoint import step_dir

        path = os.path.join(step_dir(self.config.checkpoint_job_dir, self.trainer.step), "hf")
        merged = os.path.join(path, "merged")  # a LoRA stage's whole model (hf/: the adapter)
        if os.path.isdir(merged):
            return merged
        return path if os.path.isdir(path) else None


class ReadTimeoutError(TimeoutError):
    """No experience of a step the trainer waits for arrived within ``max_read_timeout``."""


class QueueReader:
    """The trainer's view of the queue: ``begin_step(t)``, then ``read(n)`` for step ``t``.

    A read takes experiences of the explore steps train step ``t`` may wait for
    (``max_step_of(t)``) and waits only while one of them is still being explored. When
    ``max_read_timeout`` passes, what arrived is trained on (the configuration guide's
    "incomplete batch"), said on the console; if nothing arrived, the trainer fails naming
    the step it waited for. A strategy's own shorter ``timeout`` just gets what is there.
    """

    def __init__(
        self,
        queue: Any,
        max_read_timeout: float,
        max_step_of: Any,
        whole_groups: bool = False,
        report: Optional[Reporter] = None,
    ) -> None:
        self.queue, self.max_read_timeout = queue, max_read_timeout
        self.max_step_of, self.whole_groups = max_step_of, whole_groups
        self.report = report or Reporter(None, "trainer")
        self.step = 1

    def begin_step(self, step: int) -> None:
        self.step = step

    def read(self, batch_size: int, timeout: Optional[float] = None) -> List[Any]:
        limit = self.max_read_timeout if timeout is None else timeout
        start, since, max_step = time.monotonic(), time.time(), self.max_step_of(self.step)
        while True:
            left = max(0.0, limit - (time.monotonic() - start))
            final = left <= WAIT_SLICE_S
            result = ray.get(
                self.queue.get.remote(
                    batch_size,
                    max_step=max_step,
                    timeout=min(WAIT_SLICE_S, left),
                    whole_groups=self.whole_groups,
                    consumer=self.step,
                    take_partial=final,
                )
            )
            if result.state != "timeout" or final:
                break
            self.report.wait(
                f"the explorer to finish step {result.waiting_for} "
                f"(buffer.trainer_input.experience_buffer.max_read_timeout={limit:g}s)",
                since=since,
            )
        self.report.done()
        exps = result.experiences
        if result.state == "ended" and not exps:
            raise StopIteration("the explorer has finished and the queue is drained")
        if result.state == "timeout" and timeout is None:
            self._timed_out(exps, batch_size, result.waiting_for)
        return exps

    def _timed_out(self, exps: List[Any], batch_size: int, waiting_for: int) -> None:
        where = (
            f"explore step {waiting_for} did not finish within "
            f"buffer.trainer_input.experience_buffer.max_read_timeout={self.max_read_timeout:g}s"
        )
        if not exps:
            raise ReadTimeoutError(f"{where}: no experience to train on; see the explorer's log")
        self.report.event(
            f"train step {self.step}: {where}; training on the {len(exps)} of {batch_size} "
            "experiences that arrived"
        )
