"""Metrics sinks. Every run writes JSON lines; ``monitor.monitor_type`` adds one more sink.

Built in: ``tensorboard`` (tensorboard.py), ``wandb`` (wandb.py) and ``mlflow`` (mlflow.py);
the last two import their library only when built, so it stays an optional extra.

Adding a sink: one file here with a ``MetricSink`` subclass (``log(metrics, step)``,
``close()``; the constructor's parameters after the four every sink gets are the
``monitor_args`` it takes), registered in ``MONITORS`` under its ``monitor_type`` name and
imported below; then widen the ``monitor.monitor_type`` row of ``SUPPORTED``
(trinity/preflight/support.py), and name its package in
``trinity/preflight/monitor_checks.py: EXTRAS`` if it is an optional extra.
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
