"""The buffer: data in (tasksets, SFT data) and experiences between explorer and trainer.

Plain classes, no Ray (the launcher wraps them in actors):

- ``TaskReader``: a taskset (``file``, ``sql`` or a plugin's ``storage_type``: ``STORAGES``)
  -> batches of ``Task`` (order from ``TASK_SELECTORS``).
- ``SFTReader`` / ``SFTFormatter``: SFT rows -> tokenized ``Experience`` batches.
- ``ExperienceQueue``: thread-safe FIFO of experiences, made durable by an
  ``ExperienceStore`` (``SQLExperienceStore``: a SQLite file or any SQLAlchemy database).

Extending:

- A new task order: subclass ``TaskSelector`` and implement ``order(num_rows, epoch)``
  (or ``BatchSelector`` and ``pick(num_rows, n, drawn)``, plus ``feedback`` and
  ``state_dict`` to learn from rewards), and decorate it with
  ``@TASK_SELECTORS.register_module("name")`` (in a ``--plugin-dir`` file for a plugin);
  users select it with ``task_selector.selector_type: name``. Example: docs/extending.md.
- A new storage type for rows: subclass ``Storage``, implement ``rows(storage)`` and
  decorate it with ``@STORAGES.register_module("name")``; users write ``storage_type: name``
  and the row checks, ``TaskReader`` and ``SFTReader`` work unchanged (``storages.py``,
  docs/extending.md). What each built-in kind means (``file``, ``sql``, ``queue``) is asked
  of ``STORAGES``, never of the name.
- A new durable backend for the queue: subclass ``ExperienceStore`` (``add``,
  ``mark_consumed``, ``unconsume_after``, ``unconsumed``, ``finished_steps``) and pass an
  instance as ``ExperienceQueue(store=...)``.
"""

from importlib import import_module
from typing import Any

# Each public name and the module that defines it. They load on first use (PEP 562), so a
# stage that only reads files never imports SQLAlchemy for the queue's store.
_PUBLIC = {
    "decode_experience": "codec",
    "encode_experience": "codec",
    "load_rows": "file_reader",
    "ExperienceQueue": "queue",
    "TASK_SELECTORS": "selector",
    "BatchCursor": "selector",
    "BatchSelector": "selector",
    "Selector": "selector",
    "TaskSelector": "selector",
    "build_selector": "selector",
    "PromptTooLongError": "sft",
    "SFTFormatter": "sft",
    "SFTReader": "sft",
    "ExperienceStore": "store",
    "SQLExperienceStore": "store",
    "STORAGES": "storages",
    "Storage": "storages",
    "MixedTaskReader": "task_reader",
    "TaskReader": "task_reader",
}


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'trinity.buffer' has no attribute {name!r}")
    return getattr(import_module(f"trinity.buffer.{_PUBLIC[name]}"), name)


__all__ = list(_PUBLIC)
