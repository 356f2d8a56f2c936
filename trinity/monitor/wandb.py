"""``monitor_type: wandb``: one Weights & Biases run per role, in project ``project``.

``monitor_args``: ``base_url`` and ``api_key`` override ``WANDB_BASE_URL`` and
``WANDB_API_KEY``; ``entity``, ``group``, ``tags``, ``notes`` and ``job_type`` are
``wandb.init``'s own (unset: wandb's defaults, ``WANDB_ENTITY`` ... included).
``WANDB_MODE=offline`` keeps the run in ``<job_dir>/monitor/wandb/`` for a later
``wandb sync``. A resumed job continues the role's run (tracked_run.py).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from trinity.monitor.monitor import MONITORS, MetricSink
from trinity.monitor.tracked_run import TrackedRun


@MONITORS.register_module("wandb")
class WandbSink(MetricSink):
    ENV_PREFIX = "WANDB_"
    _open = 0  # sinks of this process whose run is not finished

    def __init__(
        self,
        job_dir: str,
        project: str,
        run_name: str,
        keep_until: Optional[int] = None,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        entity: Optional[str] = None,
        group: Optional[str] = None,
        tags: Optional[List[str]] = None,
        notes: Optional[str] = None,
        job_type: Optional[str] = None,
    ) -> None:
        import wandb

        self._tracked = TrackedRun(job_dir, run_name, "wandb", keep_until)
        overrides = {"base_url": base_url, "api_key": api_key}
        # console="off": Ray already sends the actor's output to its log file.
        settings = wandb.Settings(console="off", **{k: v for k, v in overrides.items() if v})
        chosen: Dict[str, Any] = dict(
            entity=entity, group=group, tags=tags, notes=notes, job_type=job_type
        )
        self._run = wandb.init(
            **{k: v for k, v in chosen.items() if v is not None},  # unset: wandb's defaults
            project=project,
            name=run_name,
            id=self._tracked.run_id,  # None: wandb makes a new one
            resume="allow" if self._tracked.resumed else "never",
            dir=os.path.join(job_dir, "monitor"),
            reinit="create_new",  # several sinks may share a process (the tests do)
            settings=settings,
        )
        self._tracked.started(self._run.id)
        WandbSink._open += 1

    def log(self, metrics: Dict[str, float], step: int) -> None:
        if not self._tracked.wants(step):
            return
        self._run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)
        self._tracked.sent(step)

    def close(self) -> None:
        import wandb

        self._run.finish()
        WandbSink._open -= 1
        if WandbSink._open == 0:
            # finish() can return before wandb's service has written the run file (and
            # uploaded it); the role's process may be killed right after, so wait for it.
            wandb.teardown()
