"""``monitor`` checks before Ray starts: the sink's package is installed, its arguments are
ones it takes, and an MLflow tracking server answers at ``monitor_args.uri``."""

from __future__ import annotations

import importlib.util
import urllib.error
import urllib.request
from typing import Any, List

from trinity.monitor import MONITORS
from trinity.monitor.mlflow import DEFAULT_URI
from trinity.preflight.components import bind_problems

# monitor_type -> (the package it imports, the extra that installs it)
EXTRAS = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}
# What the Monitor passes every sink (monitor.py: MetricSink).
SINK_PARAMETERS = ("job_dir", "project", "run_name", "keep_until")
# How long preflight waits for the MLflow server's /health answer.
HEALTH_TIMEOUT_S = 5.0


def monitor_problems(config: Any) -> List[str]:
    monitor = config.monitor
    kind, args = monitor.monitor_type, monitor.monitor_args or {}
    if kind in EXTRAS and importlib.util.find_spec(EXTRAS[kind][0]) is None:
        package, extra = EXTRAS[kind]
        return [
            f"monitor.monitor_type = {kind}: the {package} package is not installed; "
            f"pip install 'trinity-rft[{extra}]'"
        ]
    problems = bind_problems(
        MONITORS.get(kind), args, "monitor.monitor_args", f"monitor '{kind}'", SINK_PARAMETERS
    )
    if kind == "mlflow" and not problems:
        problems += _mlflow_server_problems(str(args.get("uri", DEFAULT_URI)))
    return problems


def _mlflow_server_problems(uri: str) -> List[str]:
    """An http(s) tracking URI must answer; other URIs (file:, sqlite:, databricks) are
    stores MLflow opens itself."""
    if not uri.startswith(("http://", "https://")):
        return []
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return []  # something answers (a proxy asking for credentials, say): MLflow decides
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return [
            f"monitor.monitor_args.uri = {uri}: no MLflow tracking server answers ({reason}); "
            "start one (mlflow server --host 127.0.0.1 --port 5000) or set the uri"
        ]
    return []
