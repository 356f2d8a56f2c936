"""Data operators: what ``data_processor.task_pipeline`` and ``experience_pipeline`` run.

One registry, ``OPERATORS``; the config names an operator and gives its constructor's
arguments (``operators: [{name: reward_filter, args: {min_reward: 0.5}}]``). Built-ins:

- ``deduplicator`` (tasks, experiences): repeated task texts; repeated responses in a group.
- ``length_filter`` (tasks, experiences): text or response length in tokens or characters.
- ``reward_filter`` (experiences): reward (a group's mean reward for group algorithms).
- ``reward_shaping_mapper`` (experiences): reward combined with statistics in ``info``.
- ``data_juicer`` (tasks, experiences): Data-Juicer operators (its extra must be installed).

Adding one: subclass ``Operator`` in a file of its own (built-in: here; plugin: a
``--plugin-dir`` module), set ``kinds`` to the pipelines it runs in (``"task"``,
``"experience"``), implement ``process_tasks(rows, context)`` and/or
``process_experiences(exps, whole_groups)`` returning ``(kept, metrics)``, and decorate the
class with ``@OPERATORS.register_module("my_op")``. Check arguments in ``__init__`` and raise
``ValueError``: built-in operators are constructed once before Ray starts, so a bad argument
is a config error naming ``data_processor.<pipeline>.operators[i].args``.
"""

from trinity.buffer.operators.base import (
    OPERATORS,
    Operator,
    TaskContext,
    select,
)
from trinity.buffer.operators.data_juicer import DataJuicerOperator
from trinity.buffer.operators.deduplicator import Deduplicator
from trinity.buffer.operators.length_filter import LengthFilter
from trinity.buffer.operators.reward_filter import RewardFilter
from trinity.buffer.operators.reward_shaping_mapper import RewardShapingMapper

__all__ = [
    "OPERATORS",
    "DataJuicerOperator",
    "Deduplicator",
    "LengthFilter",
    "Operator",
    "RewardFilter",
    "RewardShapingMapper",
    "TaskContext",
    "select",
]
