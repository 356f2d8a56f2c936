"""Metrics sinks. Every run writes JSON lines; ``monitor.monitor_type`` adds one more sink.

Built in: ``tensorboard`` (tensorboard.py), ``wandb`` (wandb.py) and ``mlflow`` (mlflow.py);
the last two import their library only when built, so it stays an optional extra.

Adding a sink: a ``MetricSink`` subclass (``log(metrics, step)``, ``close()``; the
constructor's parameters after the four every sink gets are the ``monitor_args`` it takes),
registered in ``MONITORS`` under its ``monitor_type`` name, from a plugin module
(``--plugin-dir``) or from one file here imported below. ``monitor.monitor_type`` accepts
every registered name. A built-in whose library is an optional extra names its package in
``trinity/preflight/monitor_checks.py: EXTRAS``, so a missing install is a line before start.
"""

from trinity.monitor import mlflow, tensorboard, wandb  # noqa: F401  (they register)
from trinity.monitor.monitor import (
    MONITORS,
    JsonlSink,
    MetricSink,
    Monitor,
    monitor_env,
    read_metrics,
)

__all__ = ["MONITORS", "MetricSink", "JsonlSink", "Monitor", "monitor_env", "read_metrics"]
