"""What ``mode: bench`` needs before Ray starts: eval tasksets to run, and the checkpoints it
evaluates in the job dir of the run it benchmarks (``trinity/explorer/bench.py``)."""

from __future__ import annotations

from typing import List

from trinity.common.config.config import Config
from trinity.common.weights import WEIGHTS_FILE, complete_steps


def bench_problems(config: Config) -> List[str]:
    """Every reason a bench stage cannot run (none for other modes)."""
    if config.mode != "bench":
        return []
    explorer, job_dir, problems = config.explorer, config.checkpoint_job_dir, []
    if not config.buffer.explorer_input.eval_tasksets:
        problems.append(
            "buffer.explorer_input.eval_tasksets is required in mode bench: the tasksets each "
            "checkpoint is evaluated on"
        )
    if explorer.rollout_model.engine_type == "external":
        return problems  # an API's model is evaluated once, as it is: no checkpoints to find
    listed = explorer.bench_checkpoints
    if listed and explorer.bench_on_latest_checkpoint:
        problems.append(
            "explorer.bench_checkpoints and explorer.bench_on_latest_checkpoint = true both "
            "choose the checkpoints to evaluate; set one"
        )
    saved = complete_steps(job_dir)
    found = ", ".join(map(str, saved)) or "none"
    missing = [step for step in listed if step and step not in saved]
    if missing:
        problems.append(
            f"explorer.bench_checkpoints = {listed}: no complete checkpoint of step(s) "
            f"{', '.join(map(str, missing))} in {job_dir} (steps found: {found})"
        )
    elif not listed and not saved:
        problems.append(
            f"mode bench: no complete checkpoint (global_step_N/{WEIGHTS_FILE}) in {job_dir}, "
            f"the job dir of checkpoint_root_dir/project/name = {config.project}/"
            f"{config.name}: benchmark a run that saved checkpoints (trainer.save_interval), "
            "or set project and name to that run's"
        )
    return problems
