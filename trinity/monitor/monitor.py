"""Monitor: one per role (explorer, trainer), logging to JSON lines plus the chosen sink.

Files: ``<job_dir>/monitor/<role>.jsonl`` (one object per line: ``step``, ``run`` and the
metrics by name) and, for tensorboard, ``<job_dir>/monitor/tensorboard/<name>_<role>/``.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Dict, List

from trinity.common.registry import Registry

MONITORS: Registry = Registry("monitors", base=lambda: MetricSink)


class MetricSink:
    def log(self, metrics: Dict[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class JsonlSink(MetricSink):
    def __init__(self, path: str, run_name: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.run_name = run_name
        self._file = open(path, "a", encoding="utf-8")

    def log(self, metrics: Dict[str, float], step: int) -> None:
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in metrics.items()
        }
        record = {"step": step, "run": self.run_name, "time": time.time(), **clean}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()  # a killed run keeps every step it logged

    def close(self) -> None:
        self._file.close()


@MONITORS.register_module("tensorboard")
class TensorboardSink(MetricSink):
    def __init__(self, job_dir: str, run_name: str, **monitor_args: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(os.path.join(job_dir, "monitor", "tensorboard", run_name))

    def log(self, metrics: Dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)):
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class Monitor:
    """Fans metrics out to the JSON-lines file and the configured sink."""

    def __init__(
        self, job_dir: str, name: str, role: str, monitor_type: str, monitor_args: Dict
    ) -> None:
        run_name = f"{name}_{role}"
        self.sinks: List[MetricSink] = [
            JsonlSink(os.path.join(job_dir, "monitor", f"{role}.jsonl"), run_name),
            MONITORS.get(monitor_type)(job_dir, run_name, **(monitor_args or {})),
        ]

    def log(self, metrics: Dict[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def read_metrics(path: str) -> List[Dict[str, Any]]:
    """All records of a JSON-lines metrics file (a partly written last line is skipped)."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
