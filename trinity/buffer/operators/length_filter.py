"""``length_filter``: keeps tasks or responses whose length lies in ``[min, max]``."""

from __future__ import annotations

from typing import List, Optional, Tuple

from trinity.buffer.operators.base import (
    OPERATORS,
    Metrics,
    Operator,
    Row,
    TaskContext,
    check_bounds,
    select,
)
from trinity.common.experience import Experience

UNITS = ("tokens", "characters")


@OPERATORS.register_module("length_filter")
class LengthFilter(Operator):
    """Keeps what is at least ``min_length`` and at most ``max_length`` long (both inclusive).

    Tasks are measured on their text (``target_fields``, else the prompt): characters, or
    tokens of ``model.model_path``'s tokenizer, without the chat template unless
    ``chat_template`` (then as the prompt a chat model reads: a column of messages as they
    are, else the text as one user message; veRL's ``filter_overlong_prompts``). Experiences are
    measured on their response: its token count, or the characters of its text. With a group
    algorithm a group stays only if every response in it passes.

    Args:
        min_length: the shortest kept; unset: no lower bound.
        max_length: the longest kept; unset: no upper bound.
        unit: ``tokens`` or ``characters``.
        chat_template: tasks only, with ``unit: tokens``: count the chat-formatted prompt.
    """

    kinds = ("task", "experience")

    def __init__(
        self,
        min_length: Optional[int] = None,
        max_length: Optional[int] = None,
        unit: str = "tokens",
        chat_template: bool = False,
    ) -> None:
        if unit not in UNITS:
            raise ValueError(f"unit = {unit!r}: expected one of {', '.join(UNITS)}")
        if chat_template and unit != "tokens":
            raise ValueError("chat_template counts tokens: set unit: tokens")
        if min_length is None and max_length is None:
            raise ValueError("set min_length, max_length or both: without them nothing is filtered")
        for name, value in (("min_length", min_length), ("max_length", max_length)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} = {value!r}: expected an integer >= 0")
        check_bounds(min_length, max_length, "min_length, max_length")
        self.min_length, self.max_length, self.unit = min_length, max_length, unit
        self.chat_template = chat_template

    def _keeps(self, length: int) -> bool:
        if self.min_length is not None and length < self.min_length:
            return False
        return self.max_length is None or length <= self.max_length

    def process_tasks(self, rows: List[Row], context: TaskContext) -> Tuple[List[Row], Metrics]:
        if self.chat_template:
            return [row for row in rows if self._keeps(context.count_prompt_tokens(row))], {}
        measure = context.count_tokens if self.unit == "tokens" else len
        return [row for row in rows if self._keeps(measure(context.text(row)))], {}

    def process_experiences(
        self, exps: List[Experience], whole_groups: bool
    ) -> Tuple[List[Experience], Metrics]:
        keep = [self._keeps(self._response_length(e)) for e in exps]
        return select(exps, keep, whole_groups), {}

    def _response_length(self, exp: Experience) -> int:
        if self.unit == "tokens":
            return exp.response_length
        if exp.response_text is None:
            raise ValueError(
                "length_filter with unit characters needs Experience.response_text, which the "
                f"workflow left unset (experience of group {exp.group_id}); use unit: tokens"
            )
        return len(exp.response_text)
