"""``monitor_type: tensorboard``: event files in ``<job_dir>/monitor/tensorboard/<run_name>/``."""

from __future__ import annotations

import os
from typing import Dict, Optional

from trinity.monitor.monitor import MONITORS, MetricSink


@MONITORS.register_module("tensorboard")
class TensorboardSink(MetricSink):
    def __init__(
        self, job_dir: str, project: str, run_name: str, keep_until: Optional[int] = None
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step hides the events a killed run logged after the step it resumes from.
        purge = None if keep_until is None else keep_until + 1
        path = os.path.join(job_dir, "monitor", "tensorboard", run_name)
        self._writer = SummaryWriter(path, purge_step=purge)

    def log(self, metrics: Dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)):
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
