"""What the roles share: process setup, torch threads, how long a wait slice is, the metrics
sinks.

The roles themselves: ``explorer_role.ExplorerRole``, ``trainer_role.TrainerRole`` (with
``queue_reader.QueueReader``, its view of the experience queue). A role is a Ray actor in its
own process, or, for a stage ``local_stage.py`` runs, a plain object in the launcher's; roles
reach each other with ``call``, which works on both.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
from typing import Any, Dict, List, Optional

logger = logging.getLogger(__name__)

# Waits happen in slices this long, so a waiting role can say what it waits for.
WAIT_SLICE_S = 2.0
# The folder `trinity run` started in: a config's relative paths (a model folder, data, an
# operator's recipe) resolve against it in every actor on the launcher's machine. A Ray
# worker starts in the folder Ray was started from, another one with RAY_ADDRESS or for a
# second run of one process.
LAUNCH_DIR_ENV = "TRINITY_LAUNCH_DIR"


def launch_env() -> Dict[str, str]:
    """An actor's ``runtime_env`` variables: ``LAUNCH_DIR_ENV`` (the launcher's folder, passed
    on) and glibc's malloc settings (``utils/allocator.py``: read when the process starts)."""
    from trinity.utils import allocator

    return {**allocator.env(), LAUNCH_DIR_ENV: os.environ.get(LAUNCH_DIR_ENV) or os.getcwd()}


def is_actor(handle: Any) -> bool:
    """Whether ``handle`` is a Ray actor (else a local object: ``local_stage.py``)."""
    return hasattr(handle, "__ray_ready__")


def call(handle: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """``handle.method(*args, **kwargs)``'s result: through Ray for an actor, a direct call
    for a local object (a ``LoopHost`` runs coroutine methods on its loop)."""
    if is_actor(handle):
        import ray

        return ray.get(getattr(handle, method).remote(*args, **kwargs))
    return getattr(handle, method)(*args, **kwargs)


def call_all(handles: List[Any], method: str, *args: Any) -> List[Any]:
    """``call`` on each handle; actors run theirs at the same time."""
    if handles and all(is_actor(h) for h in handles):
        import ray

        return ray.get([getattr(h, method).remote(*args) for h in handles])
    return [call(h, method, *args) for h in handles]


PENDING = object()  # call_all_within: a call that had not finished in time


def call_all_within(handles: List[Any], method: str, args: tuple, timeout: float) -> List[Any]:
    """Start ``method(*args)`` on every handle at once (an actor, or a ``LoopHost`` in this
    process) and wait up to ``timeout`` seconds: each result, ``PENDING`` for a call still
    running. A call that raised raises."""
    return call_each_within(handles, method, [args] * len(handles), timeout)


def call_each_within(
    handles: List[Any], method: str, args: List[tuple], timeout: float
) -> List[Any]:
    """``call_all_within`` with arguments of each handle's own (``args[i]`` for
    ``handles[i]``)."""
    if handles and all(is_actor(h) for h in handles):
        import ray

        refs = [getattr(h, method).remote(*a) for h, a in zip(handles, args, strict=True)]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        results = dict(zip(ready, ray.get(ready), strict=True))
        return [results.get(ref, PENDING) for ref in refs]
    futures = [h.submit(method, *a) for h, a in zip(handles, args, strict=True)]
    done, _ = concurrent.futures.wait(futures, timeout=timeout)
    return [future.result() if future in done else PENDING for future in futures]


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
    In a stage ``local_stage.py`` runs, the roles share the launcher's process and the
    stage sets its torch threads once (``compute_threads``).
    """
    from trinity.utils.plugin_loader import load_plugins

    load_plugins(plugin_dirs)
    shared = log_to_file(job_dir, actor_name, by_node)
    logging.getLogger().setLevel(level)
    import torch

    if shared:
        logger.info(
            "%s runs in the launcher's process (%d torch threads)",
            actor_name,
            torch.get_num_threads(),
        )
        return
    launched_in = os.environ.get(LAUNCH_DIR_ENV)
    if launched_in and os.path.isdir(launched_in):  # not on another machine
        os.chdir(launched_in)
    threads = max(1, threads)
    torch.set_num_threads(threads)
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        logger.info("%s runs in this process with %d torch thread(s)", actor_name, threads)
        return
    node = ray.get_runtime_context().get_node_id()
    ip = ray.util.get_node_ip_address()
    # the GPUs Ray assigned this actor (gpu_bundles.py), which it sees as cuda:0, cuda:1...
    gpus = f", GPUs {os.environ.get('CUDA_VISIBLE_DEVICES')}" if ray.get_gpu_ids() else ""
    logger.info(
        "%s runs on node %s (%s) with %d torch thread(s)%s", actor_name, node, ip, threads, gpus
    )


class RoleLogs(logging.Handler):
    """Several roles in one process (``local_stage.py``): each record goes to the log file of
    the role whose thread emitted it, the role with the longest name the thread's name starts
    with (a role's threads carry its name: ``explorer_runner_0:<task id>``); records of other
    threads go to ``default``'s."""

    def __init__(self, default: str) -> None:
        super().__init__()
        self.default = default
        self.files: Dict[str, logging.Handler] = {}

    def emit(self, record: logging.LogRecord) -> None:
        names = [n for n in self.files if record.threadName.startswith(n)]
        name = max(names, key=len) if names else self.default
        if name in self.files:
            self.files[name].handle(record)

    def close(self) -> None:
        for handler in self.files.values():
            handler.close()
        super().close()


def log_to_file(job_dir: str, name: str, by_node: bool = False) -> bool:
    """Log to ``<job_dir>/log/<name>.log`` (``log/<node ip>/`` with ``by_node``): everything
    this process logs, or with ``RoleLogs`` on the root logger, what ``name``'s threads log
    (then True: the process is shared)."""
    log_dir = os.path.join(job_dir, "log")
    if by_node:
        import ray

        log_dir = os.path.join(log_dir, ray.util.get_node_ip_address())
    os.makedirs(log_dir, exist_ok=True)
    handler = logging.FileHandler(os.path.join(log_dir, f"{name}.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    shared = [h for h in root.handlers if isinstance(h, RoleLogs)]
    if shared:
        old = shared[0].files.pop(name, None)  # a runner made again logs on to its file
        if old is not None:
            old.close()
        shared[0].files[name] = handler
        return True
    root.handlers = [handler]
    return False


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
    if config.mode in ("both", "colocate") and sync.sync_style == "fixed" and sync.sync_offset == 0:
        return max(1, cores // engines) if role == "engine" else max(1, cores // trainers)
    return max(1, cores // max(1, engines + trainers))
