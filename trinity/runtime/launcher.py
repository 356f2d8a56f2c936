"""``trinity run``: validate every stage, start (or join) Ray, run the stages in order.

A stage is one wiring of the components for its ``mode``; each stage after the first starts
from the previous stage's final weights (its HF export).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from trinity.runtime.progress import ProgressPrinter, eval_summary


class RunFailed(RuntimeError):
    """A component of a stage failed; the message names it and where its log is."""


@dataclass
class StageResult:
    name: str
    job_dir: str
    final_hf: Optional[str]
    evals: Dict[str, tuple] = field(default_factory=dict)  # metric -> (first, last)


def planned_steps(config: Any) -> int:
    """Training steps of a stage: ``total_steps``, else epochs over the dataset that drives it."""
    from trinity.buffer import load_rows

    buf = config.buffer
    if buf.total_steps:
        return int(buf.total_steps)
    if config.mode == "train":
        from trinity.algorithm import ALGORITHM_TYPE
        from trinity.algorithm.algorithm import PairExperienceModel

        paired = ALGORITHM_TYPE.get(config.algorithm.algorithm_type).schema is PairExperienceModel
        rows = len(load_rows(buf.trainer_input.experience_buffer))
        per_step = buf.train_batch_size // 2 if paired else buf.train_batch_size  # DPO: pairs
    else:
        rows = sum(len(load_rows(ts)) for ts in buf.explorer_input.tasksets)
        per_step = buf.batch_size
    return max(1, math.ceil(rows * buf.total_epochs / per_step))


def init_ray(namespace: str) -> None:
    """Join ``RAY_ADDRESS`` if set, else start a local Ray (no ``ray start`` needed)."""
    import ray

    if ray.is_initialized():
        return
    ray.init(
        address=os.environ.get("RAY_ADDRESS") or None,
        namespace=namespace,
        include_dashboard=False,
        log_to_driver=False,  # actors log to <job_dir>/log/; the driver prints progress
        configure_logging=False,
    )


def run_stage(config: Any, plugin_dirs: List[str], printer: ProgressPrinter) -> StageResult:
    import ray

    from trinity.common.config import save_resolved_config
    from trinity.runtime.actors import QueueActor
    from trinity.runtime.roles import ExplorerActor, TrainerActor
    from trinity.runtime.synchronizer import Synchronizer
    from trinity.trainer.checkpoint import latest_step

    job_dir, mode = config.checkpoint_job_dir, config.mode
    os.makedirs(job_dir, exist_ok=True)
    save_resolved_config(config, os.path.join(job_dir, "config.yaml"))
    steps = planned_steps(config)
    resuming = config.continue_from_checkpoint and latest_step(job_dir) is not None
    sync_cfg = config.synchronizer
    sync = ray.remote(num_cpus=0)(Synchronizer).remote(
        sync_cfg.sync_method, job_dir, sync_cfg.sync_timeout, has_trainer=mode == "both"
    )
    queue = None
    if mode in ("both", "explore"):
        experience_buffer = config.buffer.trainer_input.experience_buffer
        # The user's backup path (sqlite:///x.db or a file) if given, else one in the job dir.
        path = (experience_buffer.path or "").removeprefix("sqlite:///")
        store = (
            os.path.abspath(path)
            if path
            else os.path.join(job_dir, "buffer", f"{experience_buffer.name}.db")
        )
        # On resume in `both` mode the explorer restarts right after the trainer's checkpoint,
        # so experiences explored past it would be trained on twice: drop them (logged).
        queue = QueueActor.remote(store, drop_unconsumed=resuming and mode == "both")
    actors = [a for a in (sync, queue) if a is not None]
    try:
        trainer = explorer = None
        start = 0
        if mode in ("both", "train"):
            trainer = TrainerActor.remote(config, plugin_dirs, queue, sync, steps)
            actors.append(trainer)
            start = ray.get(trainer.prepare.remote())
        if mode in ("both", "explore"):
            explorer = ExplorerActor.remote(config, plugin_dirs, queue, sync)
            actors.append(explorer)
            ray.get(explorer.prepare.remote(start))
        printer.begin_stage(config, steps, start)
        roles = {
            a.run.remote(): role for role, a in (("trainer", trainer), ("explorer", explorer)) if a
        }
        running = list(roles)
        while running:
            done, running = ray.wait(running, num_returns=1, timeout=1.0)
            printer.poll()
            for ref in done:
                _raise_failure(ray, ref, roles[ref], config)
        printer.poll()
        final_hf = ray.get(trainer.final_hf_dir.remote()) if trainer is not None else None
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
    return StageResult(config.name, job_dir, final_hf, eval_summary(job_dir))


def _raise_failure(ray: Any, ref: Any, role: str, config: Any) -> None:
    """Turn an actor failure into one readable message; nothing written so far is touched."""
    try:
        ray.get(ref)
    except ray.exceptions.RayError as exc:
        cause = getattr(exc, "cause", None) or exc
        name = config.trainer.name if role == "trainer" else config.explorer.name
        log = os.path.join(config.checkpoint_job_dir, "log", f"{name}.log")
        raise RunFailed(
            f"stage '{config.name}': the {role} failed: {type(cause).__name__}: {cause}\n"
            f"full log: {log}\noutputs written so far are kept in {config.checkpoint_job_dir}"
        ) from None


def run(config_path: str, overrides: List[str], plugin_dirs: List[str]) -> List[StageResult]:
    """Everything ``trinity run`` does; config errors surface before Ray starts."""
    from trinity.common.config import apply_run_name, load_config
    from trinity.common.config.preflight import check_before_start
    from trinity.utils.plugin_loader import load_plugins

    load_plugins(plugin_dirs)
    root = apply_run_name(load_config(config_path, overrides))
    # Every stage finalized and checked (models, data, names, arguments) in one pass: all
    # problems in one ConfigError before anything starts.
    stages = check_before_start(root)
    init_ray(stages[0].ray_namespace)
    printer = ProgressPrinter()
    results: List[StageResult] = []
    for stage in stages:
        if results and results[-1].final_hf:
            stage.model.model_path = results[-1].final_hf
        results.append(run_stage(stage, plugin_dirs, printer))
    printer.summary(results)
    return results
