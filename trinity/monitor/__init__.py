"""Metrics sinks. Every run writes JSON lines; ``monitor.monitor_type`` adds one more sink.

To add a sink: subclass ``MetricSink`` (``log(metrics, step)`` and ``close()``), register it in
``MONITORS`` under the ``monitor_type`` name users will write.
"""

from trinity.monitor.monitor import MONITORS, JsonlSink, MetricSink, Monitor, read_metrics

__all__ = ["MONITORS", "MetricSink", "JsonlSink", "Monitor", "read_metrics"]
