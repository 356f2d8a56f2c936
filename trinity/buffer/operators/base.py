"""The ``Operator`` interface and the ``OPERATORS`` registry of data pipelines.

An operator runs in the task pipeline (rows of a training taskset, before exploring), in the
experience pipeline (one explore step's experiences, before they are written to the buffer),
or in both; ``kinds`` says which. Each ``process_*`` method returns what is kept (possibly
changed) and a few numbers about what it did, which the pipeline logs under the operator's
name next to the counts in and out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple

from trinity.common.experience import Experience
from trinity.common.registry import Registry

OPERATORS: Registry = Registry("operators", base=lambda: Operator)

Row = Dict[str, Any]
Metrics = Dict[str, float]


@dataclass
class TaskContext:
    """What a task operator reads besides the rows.

    ``fields``: the row fields that make a task's text (``task_pipeline.target_fields``, else
    the taskset's prompt column); ``tokenizer_path``: the model whose tokenizer counts tokens.
    """

    fields: Sequence[str]
    tokenizer_path: Optional[str] = None
    taskset: str = ""
    _tokenizer: Any = field(default=None, repr=False)

    def text(self, row: Row) -> str:
        """The task's text: its ``fields`` joined by newlines (non-strings as ``str``)."""
        parts = []
        for name in self.fields:
            if name not in row:
                raise KeyError(
                    f"data_processor.task_pipeline.target_fields: taskset '{self.taskset}' "
                    f"has no field '{name}' (fields: {', '.join(row)})"
                )
            value = row[name]
            parts.append(value if isinstance(value, str) else str(value))
        return "\n".join(parts)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the model's tokenizer (no chat template)."""
        return len(self.tokenizer()(text, add_special_tokens=False)["input_ids"])

    def count_prompt_tokens(self, row: Row) -> int:
        """Tokens of the task as a chat prompt: the chat template (with the generation prompt)
        over the row's messages when its one field holds a list of them (veRL's ``prompt``
        column), else over its text as one user message."""
        value = row.get(self.fields[0]) if len(self.fields) == 1 else None
        is_chat = isinstance(value, list) and all(isinstance(m, dict) for m in value)
        messages = value if is_chat else [{"role": "user", "content": self.text(row)}]
        template = self.tokenizer().apply_chat_template
        return len(template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))

    def tokenizer(self) -> Any:
        """``model.model_path``'s tokenizer, loaded once."""
        if self._tokenizer is None:
            if not self.tokenizer_path:
                raise ValueError("counting task tokens needs model.model_path")
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        return self._tokenizer


class Operator:
    """A data operator. Subclass it, set ``kinds``, implement the matching method(s), and
    register it with ``@OPERATORS.register_module("name")``. Constructor arguments are the
    operator's ``args`` in the config, checked against the signature before Ray starts."""

    kinds: ClassVar[Tuple[str, ...]] = ()  # "task", "experience"

    def process_tasks(self, rows: List[Row], context: TaskContext) -> Tuple[List[Row], Metrics]:
        """The rows kept (changed or not) and metrics about them."""
        raise NotImplementedError(f"{type(self).__name__} does not process tasks")

    def process_experiences(
        self, exps: List[Experience], whole_groups: bool
    ) -> Tuple[List[Experience], Metrics]:
        """The experiences kept (changed or not) and metrics about them.

        ``whole_groups``: the algorithm compares the rollouts of a task (GRPO...), so a filter
        keeps or drops each group whole rather than leaving part of one.
        """
        raise NotImplementedError(f"{type(self).__name__} does not process experiences")

    def close(self) -> None:
        """Release what the operator holds (a server, a pool); nothing by default."""


def select(exps: List[Experience], keep: Sequence[bool], whole_groups: bool) -> List[Experience]:
    """``exps`` where ``keep`` is true; with ``whole_groups`` a group stays only if every
    member is kept (dropping some members would change the baseline the others get)."""
    if whole_groups:
        failed = {e.group_id for e, k in zip(exps, keep, strict=True) if not k}
        return [e for e in exps if e.group_id not in failed]
    return [e for e, k in zip(exps, keep, strict=True) if k]


def check_bounds(low: Optional[float], high: Optional[float], names: str) -> None:
    """Raise ``ValueError`` when ``low > high`` (both set)."""
    if low is not None and high is not None and low > high:
        raise ValueError(f"{names}: the minimum {low} is above the maximum {high}")
