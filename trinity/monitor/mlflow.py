"""``monitor_type: mlflow``: one MLflow run per role, in the experiment named ``project``.

``monitor_args``: ``uri`` (the tracking server; default ``http://localhost:5000``), and
``username``/``password``, which override ``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``.
A resumed job continues the role's run (tracked_run.py).
"""

from __future__ import annotations

import os
import re
import time
from typing import Dict, Optional

from trinity.monitor.monitor import MONITORS, MetricSink
from trinity.monitor.tracked_run import TrackedRun

DEFAULT_URI = "http://localhost:5000"
# What MLflow accepts in a metric name; a taskset's name may hold more (e.g. "gsm8k@test").
NOT_IN_NAMES = re.compile(r"[^/\w.\- :]")


@MONITORS.register_module("mlflow")
class MlflowSink(MetricSink):
    ENV_PREFIX = "MLFLOW_"

    def __init__(
        self,
        job_dir: str,
        project: str,
        run_name: str,
        keep_until: Optional[int] = None,
        uri: str = DEFAULT_URI,
        username: Optional[str] = None,
        password: Optional[str] = None,
    ) -> None:
        from mlflow.tracking import MlflowClient

        # MLflow reads credentials from the environment only; this actor's own copy.
        for name, value in (("USERNAME", username), ("PASSWORD", password)):
            if value:
                os.environ[f"MLFLOW_TRACKING_{name}"] = str(value)
        self._client = MlflowClient(tracking_uri=uri)
        self._tracked = TrackedRun(job_dir, run_name, "mlflow", keep_until)
        if self._tracked.resumed:
            self._run_id = self._tracked.run_id
            self._client.update_run(self._run_id, status="RUNNING")
        else:
            experiment = _experiment_id(self._client, project)
            self._run_id = self._client.create_run(experiment, run_name=run_name).info.run_id
            self._tracked.started(self._run_id)

    def log(self, metrics: Dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        if not self._tracked.wants(step):
            return
        now = int(time.time() * 1000)
        batch = [
            Metric(metric_name(key), float(value), now, step)
            for key, value in metrics.items()
            if isinstance(value, (int, float))
        ]
        self._client.log_batch(self._run_id, metrics=batch)
        self._tracked.sent(step)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def metric_name(key: str) -> str:
    """``key`` with each character MLflow refuses (the whole batch would fail) as ``_``."""
    return NOT_IN_NAMES.sub("_", key)


def _experiment_id(client, name: str) -> str:
    """The experiment ``name``, made if missing (the other role may make it meanwhile)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:  # already made by the other role
        return client.get_experiment_by_name(name).experiment_id
