"""Monitor: one per role (explorer, trainer), logging to JSON lines plus the chosen sink.

Files: ``<job_dir>/monitor/<role>.jsonl`` (one object per line: ``step``, ``run`` and the
metrics by name), and what the chosen sink writes (tensorboard.py, wandb.py, mlflow.py).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Dict, List, Optional

from trinity.common.registry import Registry

MONITORS: Registry = Registry("monitors", base=lambda: MetricSink)


class MetricSink:
    """A destination of metrics. Registered sinks are built as
    ``Sink(job_dir, project, run_name, keep_until, **monitor_args)``; preflight holds
    ``monitor_args`` to the constructor's other parameters."""

    # The tracker's environment variables (e.g. ``WANDB_``): the launcher passes the
    # driver's values on to the role actors, which may run on other nodes.
    ENV_PREFIX = ""

    def log(self, metrics: Dict[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class JsonlSink(MetricSink):
    def __init__(self, path: str, run_name: str, keep_until: Optional[int] = None) -> None:
        """``keep_until``: a resumed run drops the records of later steps, which it redoes."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.run_name = run_name
        if keep_until is not None and os.path.exists(path):
            _drop_after(path, keep_until)
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


class Monitor:
    """Fans metrics out to the JSON-lines file and the configured sink."""

    def __init__(
        self,
        job_dir: str,
        project: str,
        name: str,
        role: str,
        monitor_type: str,
        monitor_args: Dict,
        keep_until: Optional[int] = None,
    ) -> None:
        """``keep_until``: the step a resumed role continues after; later records are dropped,
        so the metrics hold each step once."""
        run_name = f"{name}_{role}"
        self.path = os.path.join(job_dir, "monitor", f"{role}.jsonl")
        self.sinks: List[MetricSink] = [
            JsonlSink(self.path, run_name, keep_until),
            MONITORS.get(monitor_type)(
                job_dir, project, run_name, keep_until, **(monitor_args or {})
            ),
        ]

    def log(self, metrics: Dict[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def has_logged(self, step: int) -> bool:
        """Whether the metrics file holds a record of ``step``."""
        return any(r.get("step") == step for r in read_metrics(self.path))

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def monitor_env(monitor_type: str) -> Dict[str, str]:
    """The driver's environment variables that configure the chosen tracker."""
    prefix = MONITORS.get(monitor_type).ENV_PREFIX
    return {k: v for k, v in os.environ.items() if prefix and k.startswith(prefix)}


def _drop_after(path: str, step: int) -> None:
    """Rewrite a metrics file without the records of steps after ``step`` (atomically)."""
    kept = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, path)


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
