"""The buffer: data in (tasksets, SFT data) and experiences between explorer and trainer.

Plain classes, no Ray (the launcher wraps them in actors):

- ``TaskReader``: a ``file`` or ``sql`` taskset -> batches of ``Task`` (order from
  ``TASK_SELECTORS``).
- ``SFTReader`` / ``SFTFormatter``: SFT rows -> tokenized ``Experience`` batches.
- ``ExperienceQueue``: thread-safe FIFO of experiences, made durable by an
  ``ExperienceStore`` (``SQLExperienceStore``: a SQLite file or any SQLAlchemy database).

Extending:

- A new task order: subclass ``TaskSelector``, implement ``order(num_rows, epoch)``, and
  decorate it with ``@TASK_SELECTORS.register_module("name")`` (in a ``--plugin-dir`` file
  for a plugin); users select it with ``task_selector.selector_type: name``. Example:
  docs/extending.md.
- A new storage type for rows: write a reader returning ``FileRows`` (as ``sql_reader.py``
  does for ``sql``) and dispatch on ``storage.storage_type`` in ``load_checked``
  (``file_reader.py``); the row checks, ``TaskReader`` and ``SFTReader`` then work unchanged.
- A new durable backend for the queue: subclass ``ExperienceStore`` (``add``,
  ``mark_consumed``, ``unconsume_after``, ``unconsumed``, ``finished_steps``) and pass an
  instance as ``ExperienceQueue(store=...)``.
"""

from trinity.buffer.codec import decode_experience, encode_experience
from trinity.buffer.file_reader import load_rows
from trinity.buffer.queue import ExperienceQueue
from trinity.buffer.selector import TASK_SELECTORS, BatchCursor, TaskSelector, build_selector
from trinity.buffer.sft import PromptTooLongError, SFTFormatter, SFTReader
from trinity.buffer.store import ExperienceStore, SQLExperienceStore
from trinity.buffer.task_reader import MixedTaskReader, TaskReader

__all__ = [
    "TASK_SELECTORS",
    "BatchCursor",
    "ExperienceQueue",
    "ExperienceStore",
    "PromptTooLongError",
    "SFTFormatter",
    "SFTReader",
    "SQLExperienceStore",
    "TaskReader",
    "TaskSelector",
    "build_selector",
    "decode_experience",
    "encode_experience",
    "load_rows",
    "MixedTaskReader",
]
