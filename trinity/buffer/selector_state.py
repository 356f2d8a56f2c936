"""What the training tasksets' selectors learned, after each explore step, in the job folder.

A resumed run restarts exploring after the last step in the experience queue: it reads that
many batches again to find its position (as it does for every selector), then loads what the
selectors had learned from the feedback of those steps, saved here when each step was written
(replaying the batches cannot rebuild it: the rewards are gone). The position is not saved:
with ``fully_async`` the reader is already steps ahead when a step is written.

The state is saved just before the step's experiences are written, so a run killed between
the two resumes from the step before; the file therefore keeps the last two steps.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional


def selector_state_path(job_dir: str) -> str:
    """Where a run in ``job_dir`` keeps its selectors' state."""
    return os.path.join(job_dir, "buffer", "selector_state.json")


class SelectorStateFile:
    """``{step: reader.learned_state()}`` for the newest two steps, in one JSON file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def save(self, step: int, state: Dict[str, Any]) -> None:
        """Record ``state`` as learned by the end of ``step``; older steps but the one before
        are dropped. The file is replaced whole, so a kill leaves the old or the new one."""
        kept = {k: v for k, v in self._read().items() if k == step - 1}
        kept[step] = state
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({str(k): v for k, v in sorted(kept.items())}, f)
        os.replace(tmp, self.path)

    def load(self, step: int) -> Optional[Dict[str, Any]]:
        """The state saved at ``step``, or None when there is none."""
        return self._read().get(step)

    def _read(self) -> Dict[int, Dict[str, Any]]:
        if not os.path.exists(self.path):
            return {}
        with open(self.path, encoding="utf-8") as f:
            return {int(k): v for k, v in json.load(f).items()}
