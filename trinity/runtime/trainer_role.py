"""The trainer role (rank 0): builds the plain ``Trainer``, attaches its experience reader
(the queue, or a file dataset in ``train`` mode) and publishes weights to the synchronizer.

On Ray it is ``actors.TrainerActor``; a stage ``local_stage.py`` runs holds it as a plain
object in the launcher's process.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from trinity.common.sync_schedule import readable_bound
from trinity.common.weights import (
    collective_backend,
    latest_step,
    pack_state,
    weights_path,
)
from trinity.runtime.placement import node_address, own_node_cpus
from trinity.runtime.roles import call, compute_threads, is_actor, role_monitor, setup_process
from trinity.utils.status import Reporter

logger = logging.getLogger(__name__)


def weight_sender(config: Any) -> Any:
    """The trainer's end of the ``nccl`` sync (``common/weight_transfer.py``): its store on
    this node's address, sending to the rollout engines in their dtype."""
    import torch

    from trinity.common.weight_transfer import WeightSender

    rollout = config.explorer.rollout_model
    return WeightSender(
        node_address(),
        rollout.engine_num,
        collective_backend(config.cluster.gpu_per_node > 0),
        config.synchronizer.sync_timeout,
        dtype=getattr(torch, rollout.dtype),
    )


class TrainerRole:
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
        # sync_method nccl: the trainer's end of the engines' group, the last version
        # published, and one published but not sent yet (the resumed weights, sent once the
        # explorer runs: see ``run``)
        self.sender: Any = None
        self.published: Optional[int] = None
        self.unsent: Optional[Tuple[int, Dict[str, Any]]] = None
        self.running = False

    def rendezvous(self) -> Any:
        """(node id, port) where this actor, rank 0 of several trainer ranks, will listen."""
        from trinity.runtime.trainer_ranks import rendezvous

        where = rendezvous()
        self.group_port = where[1]
        return where

    def prepare(self) -> int:
        from trinity.trainer.trainer import Trainer

        resumes_after = latest_step(self.config.checkpoint_job_dir) or 0
        self.monitor = role_monitor(self.config, "trainer", resumes_after)
        # A `both` run's explorer waits for weights; a separate explore run polls the job
        # dir for checkpoints, saved at each sync (a train run reading its store).
        publish = (
            self._publish
            if self.config.mode in ("both", "colocate") or self.queue is not None
            else None
        )
        kwargs = dict(
            planned_steps=self.planned_steps,
            log=self.monitor.log,
            publish=publish,
            report=self.report.event,
        )
        if self.config.synchronizer.sync_style == "explorer_driven":  # publish when asked
            kwargs["publish_due"] = lambda step: call(self.sync_actor, "take_ask", step)
        if self.config.trainer.cpu_ranks > 1:  # rank 0 of several (trainer_ranks.py)
            from trinity.runtime.trainer_ranks import sharded_trainer

            self.trainer = sharded_trainer(self.config, 0, self.group_port, **kwargs)
        elif self.config.model.tinker.enable:  # the policy lives in a Tinker service
            from trinity.trainer.tinker_client import TinkerTrainer

            self.trainer = TinkerTrainer(self.config, **kwargs)
        else:
            self.trainer = Trainer(self.config, **kwargs)
        step = self.trainer.prepare_model()
        if self.config.synchronizer.sync_method == "nccl":  # mode both (validate.py)
            self.sender = weight_sender(self.config)
        if self.trainer.unlogged is not None and not self.monitor.has_logged(step):
            self.monitor.log(self.trainer.unlogged, step)  # killed after its checkpoint
        self.trainer.unlogged = None
        self.trainer.attach_reader(self._reader(), self._auxiliary_readers())
        if step and self.config.mode in ("both", "colocate", "serve"):
            self._publish(step, self.trainer.model)
        return step

    def _reader(self) -> Any:
        """The experience buffer: the queue in ``both`` mode, else a file dataset whose rows
        become experiences per the algorithm's schema (SFT rows, or DPO pairs)."""
        cfg = self.config
        storage = cfg.buffer.trainer_input.experience_buffer
        if self.queue is not None:
            from trinity.runtime.queue_reader import QueueReader, StaleFilter

            sync, serving = cfg.synchronizer, cfg.mode == "serve"
            reader = QueueReader(
                self.queue,
                # mode serve: clients commit when they will, each commit any number of rows
                math.inf if serving else storage.max_read_timeout,
                (lambda step: None)
                if serving
                else readable_bound(sync.sync_style, sync.sync_interval, sync.sync_offset),
                whole_groups=self.trainer.needs_groups,
                report=self.report,
                writer=self._writer(storage),
            )
            if sync.max_staleness is None:
                return reader
            return StaleFilter(reader, sync.max_staleness)
        return self._file_reader(storage, cfg.buffer.total_epochs, cfg.buffer.total_steps)

    def _writer(self, storage: Any) -> str:
        """Who writes the experience buffer, as the trainer's waits name it."""
        if self.config.mode in ("both", "colocate"):
            return "the explorer"
        if self.config.mode == "serve":
            return "clients to commit episodes (POST /commit)"
        from trinity.buffer.store import buffer_database
        from trinity.utils.database import masked_url

        where = masked_url(buffer_database(storage, self.config.checkpoint_job_dir))
        return f"the explorer (a separate `mode: explore` run writing {where})"

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
                # unset: an auxiliary dataset repeats; the main buffer ends the run
                total_epochs=storage.total_epochs or 10**9,
                max_model_len=cfg.model.max_model_len,
            )
            for name, storage in cfg.buffer.trainer_input.auxiliary_buffers.items()
        }

    def _publish(self, version: int, model: Any) -> None:
        if self.sender is not None:
            self._publish_collective(version, model)
            return
        if self.config.model.tinker.enable:  # weights move through the service: its path
            weights = [self.trainer.sampler_path(version)]
        elif self.config.synchronizer.sync_method == "memory":
            state = self._sync_state(model)
            if is_actor(self.sync_actor):
                import ray

                weights = [ray.put(pack_state(state))]
            else:  # in one process: a copy, as the object store keeps one (training goes on)
                weights = [{name: tensor.detach().clone() for name, tensor in state.items()}]
        else:
            self.trainer.save(final=False)
            weights = [weights_path(self.config.checkpoint_job_dir, version)]
        call(self.sync_actor, "publish", version, weights)

    def _sync_state(self, model: Any) -> Dict[str, Any]:
        """What a sync sends: the whole weights gathered from every rank, or this process's
        (LoRA: the merged adapted layers)."""
        from trinity.trainer.lora import sync_state_dict

        if self.config.trainer.cpu_ranks > 1:
            return self.trainer.full_state_dict()
        return sync_state_dict(model)

    def _publish_collective(self, version: int, model: Any) -> None:
        """nccl: publish the offer, then broadcast ``version`` to the engines as they join
        (once the explorer runs: a resumed run publishes its weights while preparing). The
        end of a run publishes its last step again: sent once (ranks skip it alike)."""
        if version == self.published:
            return
        self.published = version
        self.unsent = (version, self._sync_state(model))
        call(self.sync_actor, "publish", version, [self.sender.offer])
        if self.running:
            self._send()

    def _send(self) -> None:
        version, state = self.unsent
        timeout = self.config.synchronizer.sync_timeout
        self.report.wait(
            f"the rollout engines to take model version {version} "
            f"(sync_method nccl, synchronizer.sync_timeout={timeout:g}s)",
            since=time.time(),
        )
        try:
            self.sender.send(version, state)
        finally:
            self.report.done()
        self.unsent = None

    def run(self) -> int:
        self.running = True
        try:
            if self.unsent is not None:  # the resumed weights (see _publish_collective)
                self._send()
            step = self.trainer.run()
            self._finished()
            return step
        except BaseException:
            logger.exception("the trainer failed")
            self._finished(traceback.format_exc(limit=3))
            raise
        finally:
            self.monitor.close()

    def _finished(self, error: Optional[str] = None) -> None:
        """Tell the synchronizer (an explorer waiting for weights) that training ended."""
        if self.sync_actor is not None:
            call(self.sync_actor, "trainer_finished", error)

    def final_hf_dir(self) -> Optional[str]:
        from trinity.runtime.stage_folder import handover_dir

        return handover_dir(self.config.checkpoint_job_dir, self.trainer.step)
