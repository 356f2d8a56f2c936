"""What the roles share: process setup, torch threads, how long a wait slice is, the metrics
sinks.

The roles themselves: ``explorer_role.ExplorerActor``, ``trainer_role.TrainerRole`` (with
``queue_reader.QueueReader``, its view of the experience queue). A role is a Ray actor in its
own process, or, for a stage ``local_stage.py`` runs, a plain object in the launcher's.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, List, Optional

logger = logging.getLogger(__name__)

# Waits happen in slices this long, so a waiting role can say what it waits for.
WAIT_SLICE_S = 2.0


def role_monitor(config: Any, role: str, resumes_after: Optional[int]) -> Any:
    """The role's metrics sinks; records a killed run wrote after ``resumes_after`` go
    (None: every record stays)."""
    from trinity.monitor import Monitor

    mon, job_dir = config.monitor, config.checkpoint_job_dir
    return Monitor(
        job_dir,
        config.project,
        config.name,
        role,
        mon.monitor_type,
        mon.monitor_args,
        keep_until=resumes_after,
    )


def setup_process(
    plugin_dirs: List[str],
    job_dir: str,
    actor_name: str,
    level: str = "INFO",
    threads: int = 1,
    by_node: bool = False,
) -> None:
    """Plugins, logging to ``<job_dir>/log/<actor_name>.log`` (``log/<node ip>/`` with
    ``by_node``: ``log.group_by_node``), and ``threads`` torch threads.

    Compute actors split the cores between them: on a small machine, two processes each
    running all-core OpenMP loops spin against each other and slow down many times over.
    """
    from trinity.utils.plugin_loader import load_plugins

    load_plugins(plugin_dirs)
    log_dir = os.path.join(job_dir, "log")
    if by_node:
        import ray

        log_dir = os.path.join(log_dir, ray.util.get_node_ip_address())
    os.makedirs(log_dir, exist_ok=True)
    handler = logging.FileHandler(os.path.join(log_dir, f"{actor_name}.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    import torch

    threads = max(1, threads)
    torch.set_num_threads(threads)
    ray = sys.modules.get("ray")
    # Not an actor: a stage local_stage.py runs in the launcher's process (which may have
    # joined Ray for an earlier stage, or a test's session).
    if ray is None or not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        logger.info(
            "%s runs in the launcher's process with %d torch thread(s)", actor_name, threads
        )
        return
    node = ray.get_runtime_context().get_node_id()
    ip = ray.util.get_node_ip_address()
    logger.info("%s runs on node %s (%s) with %d torch thread(s)", actor_name, node, ip, threads)


def compute_threads(
    config: Any, role: str, node_cpus: Optional[int] = None, engines_here: int = 1
) -> int:
    """Torch threads for a compute actor of a stage: ``role`` is "engine" or "trainer".

    Actors that compute at the same time split the cores: two processes each running
    all-core OpenMP loops spin against each other and slow down many times over. With
    ``sync_offset: 0`` (and ``sync_style: fixed``) in a ``both`` run the engines and the
    trainer strictly alternate (the explorer waits for each update, the trainer for each
    batch), so each side gets every core while the other waits; otherwise they overlap and
    share.

    With ``cluster.node_num`` >= 2 the roles run on nodes of their own (``placement.py``):
    ``node_cpus`` is Ray's CPU count of the actor's node, split only with the other actors of
    its role there (``engines_here`` engines, or the trainer's ranks).
    """
    if node_cpus is not None:
        sharing = engines_here if role == "engine" else config.trainer.cpu_ranks
        return max(1, node_cpus // max(1, sharing))
    cores = os.cpu_count() or 1
    engines = config.explorer.rollout_model.engine_num if config.mode != "train" else 0
    # every rank of a sharded trainer (trainer.cpu_ranks) computes at the same time
    trainers = config.trainer.cpu_ranks if config.mode != "explore" else 0
    sync = config.synchronizer
    if config.mode == "both" and sync.sync_style == "fixed" and sync.sync_offset == 0:
        return max(1, cores // engines) if role == "engine" else max(1, cores // trainers)
    return max(1, cores // max(1, engines + trainers))
