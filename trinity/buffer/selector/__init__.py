"""Task selectors: the order in which a dataset's rows are read (``task_selector``).

- ``base.py``: the two kinds (``TaskSelector``: one permutation per epoch; ``BatchSelector``:
  each batch picked afresh), the ``TASK_SELECTORS`` registry and ``build_selector``.
- ``orders.py``: ``sequential``, ``shuffle``, ``random``, ``offline_easy2hard``.
- ``difficulty.py``: ``diff_based`` (alias ``difficulty_based``), which learns from the
  explorer's feedback.
- ``cursor.py``: ``BatchCursor``, the resumable position a reader keeps.
"""

from trinity.buffer.selector import difficulty, orders  # noqa: F401  (they register)
from trinity.buffer.selector.base import (
    TASK_SELECTORS,
    BatchSelector,
    Selector,
    TaskSelector,
    build_selector,
    feature_schema,
)
from trinity.buffer.selector.cursor import BatchCursor, build_cursor

__all__ = [
    "TASK_SELECTORS",
    "BatchCursor",
    "BatchSelector",
    "Selector",
    "TaskSelector",
    "build_cursor",
    "build_selector",
    "feature_schema",
]
