"""What the explorer and trainer actors share: how long a wait slice is, the metrics sinks.

The actors themselves: ``explorer_role.ExplorerActor``, ``trainer_role.TrainerActor`` (with
``queue_reader.QueueReader``, its view of the experience queue).
"""

from __future__ import annotations

from typing import Any, Optional

# Waits happen in slices this long, so a waiting role can say what it waits for.
WAIT_SLICE_S = 2.0


def role_monitor(config: Any, role: str, resumes_after: Optional[int]) -> Any:
    """The role's metrics sinks; records a killed run wrote after ``resumes_after`` go
    (None: every record stays)."""
    from trinity.monitor import Monitor

    mon, job_dir = config.monitor, config.checkpoint_job_dir
    return Monitor(
        job_dir,
        config.project,
        config.name,
        role,
        mon.monitor_type,
        mon.monitor_args,
        keep_until=resumes_after,
    )
