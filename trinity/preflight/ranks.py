"""Checks of ``trainer.cpu_ranks``: several trainer processes on a machine without GPUs.

CPU ranks are an explicit opt-in rather than a count derived from the GPU keys: the GPU
arithmetic assigns devices and a CPU has none to count, and CPU ranks exist to run and test
the sharded (FSDP2) code path, so they must not be confused with ``cluster.gpu_per_node``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, List, Tuple

from trinity.algorithm.algorithm import PairExperienceModel
from trinity.common.config.config import Config
from trinity.preflight.support import algorithm_class, values_at

logger = logging.getLogger("trinity.config")


def _paired(algorithm: object) -> bool:
    """Whether the algorithm trains on (chosen, rejected) pairs, which ranks never split."""
    return getattr(algorithm, "schema", None) is PairExperienceModel


def rank_problems(config: Config) -> List[str]:
    """What a finalized config with ``trainer.cpu_ranks`` cannot run, one line each."""
    ranks = config.trainer.cpu_ranks
    if ranks < 1:
        return [f"trainer.cpu_ranks = {ranks} must be >= 1"]
    if ranks == 1 or config.mode == "explore":
        return []
    problems = []
    gpus = config.cluster.gpu_per_node or 0
    if gpus > 0:
        problems.append(
            f"trainer.cpu_ranks = {ranks} with cluster.gpu_per_node = {gpus}: CPU ranks are for "
            "machines without GPUs (with GPUs the trainer's ranks are its GPUs, not supported "
            "yet); set trainer.cpu_ranks: 1 or cluster.gpu_per_node: 0"
        )
    if config.model.lora_configs:
        problems.append(
            f"model.lora_configs with trainer.cpu_ranks = {ranks} is not supported yet "
            "(LoRA trains in one trainer process); set trainer.cpu_ranks: 1"
        )
    algorithm = algorithm_class(config)
    if getattr(algorithm, "use_critic", False):
        problems.append(
            f"algorithm.algorithm_type = {config.algorithm.algorithm_type} trains a critic, which "
            f"trainer.cpu_ranks = {ranks} does not shard yet (not supported yet); set "
            "trainer.cpu_ranks: 1"
        )
    rows = config.buffer.train_batch_size
    # Preference pairs are never split between ranks, so each rank takes whole pairs.
    unit = ranks * (2 if _paired(algorithm) else 1)
    if rows and rows % unit:
        problems.append(
            f"buffer.train_batch_size = {rows} is not a multiple of {unit} (trainer.cpu_ranks = "
            f"{ranks}{' pairs' if unit != ranks else ''}): each rank trains an equal share of a "
            "step's experiences"
        )
    return problems


def warn_ranks(config: Config) -> None:
    """Say when the trainer's ranks outnumber the machine's cores (allowed: they share)."""
    ranks, cores = config.trainer.cpu_ranks, os.cpu_count() or 1
    if config.mode != "explore" and ranks > cores:
        logger.warning(
            "trainer.cpu_ranks = %d exceeds this machine's %d CPU cores: the ranks share cores "
            "and each step runs slower than with fewer ranks",
            ranks,
            cores,
        )


# Where a config sets the sequence-parallel degree (its own key and veRL's sections).
SEQUENCE_PARALLEL_KEYS = (
    "trainer.ulysses_sequence_parallel_size",
    "trainer.trainer_config.actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "trainer.trainer_config.actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    "trainer.trainer_config.critic.ulysses_sequence_parallel_size",
)


def unsplit_sequences(config: Config) -> List[Tuple[str, Any, str]]:
    """(path, value, why) for each sequence-parallel degree above 1: a hardware-shaped
    setting (how a sequence's tokens are spread over GPUs, not what is computed), run as 1."""
    if config.mode == "explore":
        return []
    why = (
        "sequence parallelism spreads one sequence over several GPUs to save memory; this "
        "trainer keeps whole sequences in each process (the same update, no split)"
    )
    return [
        (path, value, why)
        for key in SEQUENCE_PARALLEL_KEYS
        for path, value in values_at(config, key)
        if isinstance(value, int) and value > 1
    ]
