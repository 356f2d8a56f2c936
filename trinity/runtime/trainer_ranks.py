"""The trainer's ranks after rank 0 (``trainer.cpu_ranks`` > 1), as Ray actors.

Rank 0 is the ``TrainerActor`` (it reads the buffer, logs, publishes); ranks 1..N-1 are
``TrainerRankActor``s that run the same ``ShardedTrainer`` loop and join each collective:
they receive every batch from rank 0, and take part in gathering the weights whenever rank 0
publishes or saves (rank 0 alone sends them to the engines). Rank 0 picks a free loopback
port for the gloo group, so every rank runs on rank 0's node. The launcher watches every
rank: one that dies fails the run.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Tuple

import ray

from trinity.runtime.placement import own_node_cpus
from trinity.runtime.roles import compute_threads, launch_env, setup_process

logger = logging.getLogger(__name__)


def group_timeout(config: Any) -> float:
    """Seconds one collective may wait: between steps rank 0 may wait for the explorer up
    to ``max_read_timeout`` and for a weight sync up to ``sync_timeout``; a rank silent for
    longer is stuck, and the others fail rather than hang."""
    storage = config.buffer.trainer_input.experience_buffer
    read = storage.max_read_timeout if storage is not None else 0.0
    return float(config.synchronizer.sync_timeout + read)


def rank_name(config: Any, rank: int) -> str:
    """The actor (and log file) name of trainer rank ``rank`` > 0."""
    return f"{config.trainer.name}_rank_{rank}"


def rendezvous() -> Tuple[str, int]:
    """(this node's Ray id, a free port on it): where rank 0 of the group listens."""
    from trinity.trainer.distributed import free_port

    return ray.get_runtime_context().get_node_id(), free_port()


def start_ranks(config: Any, plugin_dirs: List[str], planned_steps: int, where: Tuple) -> List:
    """Actors for ranks 1..N-1 on rank 0's node (``where``: ``rendezvous()`` of rank 0)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node, port = where
    on_node = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
    return [
        TrainerRankActor.options(
            name=rank_name(config, rank),
            scheduling_strategy=on_node,
            runtime_env={"env_vars": launch_env()},
        ).remote(config, plugin_dirs, planned_steps, rank, port)
        for rank in range(1, config.trainer.cpu_ranks)
    ]


def sharded_trainer(config: Any, rank: int, port: int, **kwargs: Any) -> Any:
    """Join the trainer's process group as ``rank`` and build its ``ShardedTrainer``."""
    from trinity.trainer.distributed import init_group
    from trinity.trainer.sharded import ShardedTrainer

    ranks = init_group(rank, config.trainer.cpu_ranks, port, group_timeout(config))
    return ShardedTrainer(config, ranks=ranks, **kwargs)


@ray.remote(num_cpus=0)
class TrainerRankActor:
    """Trainer rank ``rank`` >= 1: follows rank 0 step by step."""

    def __init__(
        self, config: Any, plugin_dirs: List[str], planned_steps: int, rank: int, port: int
    ) -> None:
        name = rank_name(config, rank)
        threads = compute_threads(config, "trainer", own_node_cpus(config))
        job_dir, by_node = config.checkpoint_job_dir, config.log.group_by_node
        setup_process(plugin_dirs, job_dir, name, config.log.level, threads, by_node=by_node)
        self.config, self.planned_steps, self.rank, self.port = config, planned_steps, rank, port
        self.followed: Optional[int] = None  # the last version rank 0 published (nccl)

    def prepare(self) -> int:
        """Join the group, load and shard the models, resume with the others."""
        follow = self._follow if self.config.mode in ("both", "colocate") else None
        self.trainer = sharded_trainer(
            self.config,
            self.rank,
            self.port,
            planned_steps=self.planned_steps,
            log=lambda metrics, step: None,  # rank 0 logs the (global) metrics
            publish=follow,
        )
        step = self.trainer.prepare_model()
        if step and follow is not None:  # rank 0 publishes the resumed weights
            follow(step, self.trainer.model)
        return step

    def _follow(self, version: int, model: Any) -> None:
        """This rank's part of rank 0's publish: the collective gather (or save). With nccl
        rank 0 publishes a version once (``TrainerRole._publish_collective``): so do the
        ranks."""
        method = self.config.synchronizer.sync_method
        if method == "checkpoint":
            self.trainer.save(final=False)
        elif method == "memory" or version != self.followed:
            self.followed = version
            self.trainer.full_state_dict()

    def run(self) -> int:
        try:
            return self.trainer.run()
        except BaseException:
            logger.exception("trainer rank %d failed", self.rank)
            raise
