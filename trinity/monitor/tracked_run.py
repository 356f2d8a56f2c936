"""Which tracker run (wandb, MLflow) a role logs to, kept across restarts of the job.

A tracker holds what it was sent: a step cannot be taken back. A job killed after step L and
resumed from its checkpoint at step K <= L redoes steps K+1..L, so the role logs them again.
The JSON-lines file and TensorBoard drop the killed attempt's records of those steps; a
tracker run is continued instead (same run id), and the steps it already holds are not sent
again, so it shows each step once: the killed attempt's values for the redone steps.

State file: ``<job_dir>/monitor/<run_name>.<tracker>.json`` with ``run_id`` and ``last_step``.
"""

from __future__ import annotations

import json
import os
from typing import Optional


class TrackedRun:
    def __init__(self, job_dir: str, run_name: str, tracker: str, keep_until: Optional[int]):
        """``keep_until``: the step the role resumes after; ``None`` or 0 starts a new run
        (nothing was kept, so the tracker gets a new run under the same name)."""
        folder = os.path.join(job_dir, "monitor")
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"{run_name}.{tracker}.json")
        saved = self._read() if keep_until else {}
        self.run_id: Optional[str] = saved.get("run_id")
        # Steps up to here are in the tracker already; a fresh run has none.
        self.sent_before = int(saved.get("last_step", -1)) if self.run_id else -1
        self.last_step = self.sent_before

    @property
    def resumed(self) -> bool:
        return self.run_id is not None

    def _read(self) -> dict:
        try:
            with open(self.path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):  # no state (or a torn write): start a new run
            return {}

    def started(self, run_id: str) -> None:
        self.run_id = run_id
        self._write()

    def wants(self, step: int) -> bool:
        """Whether ``step`` is new to the tracker (steps of this attempt may repeat: the
        explorer logs a step's evaluation after its rollout metrics)."""
        return step > self.sent_before

    def sent(self, step: int) -> None:
        if step > self.last_step:
            self.last_step = step
            self._write()

    def _write(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"run_id": self.run_id, "last_step": self.last_step}, f)
        os.replace(tmp, self.path)
