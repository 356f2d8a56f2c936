"""TaskReader: rows of a taskset turned into ``Task`` objects, batch by batch, resumable."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from trinity.buffer.file_reader import load_checked
from trinity.buffer.row_checks import row_schema
from trinity.buffer.selector import BatchCursor, build_selector
from trinity.common.workflows.workflow import Task


class TaskReader:
    """Reads a taskset (``StorageConfig`` of any kind that reads rows) as ``Task`` batches.

    Order follows ``storage.task_selector``; ``state_dict()`` records the position (epoch,
    index in the epoch, steps read) so a resumed run continues where it stopped. Every row is
    checked at load; with ``skip_bad_rows`` malformed rows are left out and counted in
    ``num_skipped`` (the first few, with file and line, in ``skipped``). A ``pipeline``
    (``data_processor.task_pipeline``) then keeps or changes rows before any is read.
    """

    def __init__(
        self,
        storage: Any,
        total_epochs: int = 1,
        total_steps: Optional[int] = None,
        pipeline: Optional[Any] = None,
    ) -> None:
        self.storage = storage
        loaded = load_checked(storage, columns=row_schema(storage.format, "taskset"))
        self.rows, self.num_skipped, self.skipped = loaded.rows, loaded.num_skipped, loaded.skipped
        if pipeline is not None:
            self.rows = pipeline.apply(self.rows, storage)
        self.cursor = BatchCursor(
            len(self.rows), build_selector(storage.task_selector), total_epochs, total_steps
        )

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, batch_size: int) -> List[Task]:
        """The next ``batch_size`` tasks; raises ``StopIteration`` when reading is over."""
        return [self.task(i) for i in self.cursor.next_batch(batch_size)]

    def read_all(self) -> List[Task]:
        """Every task in file order, once (for eval sets); does not move the position."""
        return [self.task(i) for i in range(len(self.rows))]

    def num_steps(self, batch_size: int) -> int:
        """Number of batches ``read`` hands out over the whole run."""
        return self.cursor.num_steps(batch_size)

    def task(self, index: int) -> Task:
        """The ``Task`` for row ``index`` with this taskset's settings."""
        row = self.rows[index]
        s = self.storage
        return Task(
            workflow=s.default_workflow_type,
            reward_fn=s.default_reward_fn_type,
            raw_task=row,
            format_args=s.format,
            rollout_args=s.rollout_args,
            workflow_args=dict(s.workflow_args or {}),
            reward_fn_args=dict(s.reward_fn_args or {}),
            is_eval=bool(s.is_eval),
            taskset_name=s.name,
            index=index,
        )

    def state_dict(self) -> Dict[str, int]:
        return self.cursor.state_dict()

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.cursor.load_state_dict(state)


class MixedTaskReader:
    """Several training tasksets (``explorer_input.tasksets``) read as one.

    Each batch takes tasks from the tasksets in turn, one at a time (round robin), so all
    contribute evenly until one runs out, after which the others fill the batches. Every
    taskset keeps its own order, epochs and settings (workflow, reward, rollout args).
    """

    def __init__(self, readers: List[TaskReader]) -> None:
        self.readers = readers

    def __len__(self) -> int:
        return sum(len(r) for r in self.readers)

    def read(self, batch_size: int) -> List[Task]:
        """The next ``batch_size`` tasks; raises ``StopIteration`` when every taskset is read."""
        out: List[Task] = []
        live = list(self.readers)
        while len(out) < batch_size and live:
            for reader in list(live):
                index = reader.cursor.take(1)
                if not index:
                    live.remove(reader)
                    continue
                out.append(reader.task(index[0]))
                if len(out) == batch_size:
                    break
        if not out:
            raise StopIteration("every taskset has been read")
        return out
