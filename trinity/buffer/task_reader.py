"""TaskReader: rows of a taskset turned into ``Task`` objects, batch by batch, resumable."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from trinity.buffer.file_reader import load_checked
from trinity.buffer.row_checks import row_schema
from trinity.buffer.selector import build_cursor, feature_schema
from trinity.common.workflows.workflow import Task

# A taskset's feedback after an explore step: row indices, their mean rewards, rollouts each.
Feedback = Tuple[List[int], List[float], List[int]]


class TaskReader:
    """Reads a taskset (``StorageConfig`` of any kind that reads rows) as ``Task`` batches.

    Order follows ``storage.task_selector``; ``state_dict()`` records the position (epoch,
    index in the epoch, steps read) and what an adaptive selector learned from ``feedback``,
    so a resumed run continues where it stopped. Every row is
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
        schema = {**row_schema(storage.format, "taskset"), **feature_schema(storage.task_selector)}
        loaded = load_checked(storage, columns=schema)
        self.rows, self.num_skipped, self.skipped = loaded.rows, loaded.num_skipped, loaded.skipped
        if pipeline is not None:
            self.rows = pipeline.apply(self.rows, storage)
        self.cursor = build_cursor(storage.task_selector, self.rows, total_epochs, total_steps)

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

    @property
    def learns(self) -> bool:
        """Whether its selector learns from ``feedback`` (``Selector.learns``)."""
        return self.cursor.selector.learns

    def feedback(self, rewards: Dict[str, Feedback]) -> None:
        """Each taskset's ``(row indices, mean rewards, rollouts)`` of the tasks just explored,
        for its selector (``Selector.feedback``); other tasksets' entries are not its own."""
        if self.storage.name in rewards:
            self.cursor.feedback(*rewards[self.storage.name])

    def learned_state(self) -> Dict[str, Any]:
        """What the selector learned from ``feedback`` (``Selector.state_dict``)."""
        return self.cursor.selector.state_dict()

    def load_learned_state(self, state: Dict[str, Any]) -> None:
        self.cursor.selector.load_state_dict(state)

    def state_dict(self) -> Dict[str, Any]:
        """The position and what the selector learned (``BatchCursor.state_dict``)."""
        return self.cursor.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
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
        shares = self._shares(batch_size)
        # one take per taskset, so a selector that picks batches draws its share at once
        taken = [reader.cursor.take(n) for reader, n in zip(self.readers, shares, strict=True)]
        out = [
            reader.task(rows[turn])
            for turn in range(max(shares, default=0))
            for reader, rows in zip(self.readers, taken, strict=True)
            if turn < len(rows)
        ]
        if not out:
            raise StopIteration("every taskset has been read")
        return out

    def _shares(self, batch_size: int) -> List[int]:
        """Tasks each taskset gives: one per turn, in order, while it has rows left."""
        left = [reader.cursor.remaining() for reader in self.readers]
        shares = [0] * len(self.readers)
        while sum(shares) < batch_size:
            live = [i for i, n in enumerate(left) if n is None or n > shares[i]]
            if not live:
                break
            for i in live[: batch_size - sum(shares)]:
                shares[i] += 1
        return shares

    @property
    def learns(self) -> bool:
        return any(reader.learns for reader in self.readers)

    def feedback(self, rewards: Dict[str, Feedback]) -> None:
        """``TaskReader.feedback`` for every taskset."""
        for reader in self.readers:
            reader.feedback(rewards)

    def learned_state(self) -> Dict[str, Any]:
        """Each taskset's ``TaskReader.learned_state``, by taskset name."""
        return {reader.storage.name: reader.learned_state() for reader in self.readers}

    def load_learned_state(self, state: Dict[str, Any]) -> None:
        for reader in self.readers:
            reader.load_learned_state(state.get(reader.storage.name, {}))
