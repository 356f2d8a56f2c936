"""Metrics sinks. Every run writes JSON lines; ``monitor.monitor_type`` adds one more sink.

A sink subclasses ``MetricSink`` (``log(metrics, step)`` and ``close()``) and is registered in
``MONITORS`` under its ``monitor_type`` name. In this version ``monitor.monitor_type`` accepts
only ``tensorboard``, so a plugin's sink cannot be selected yet (docs/extending.md).
"""

from trinity.monitor.monitor import MONITORS, JsonlSink, MetricSink, Monitor, read_metrics

__all__ = ["MONITORS", "MetricSink", "JsonlSink", "Monitor", "read_metrics"]
