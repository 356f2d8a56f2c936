"""``deduplicator``: drops repeated tasks, or repeated responses within a group."""

from __future__ import annotations

import hashlib
import re
from typing import List, Tuple

from trinity.buffer.operators.base import OPERATORS, Metrics, Operator, Row, TaskContext
from trinity.common.experience import Experience


@OPERATORS.register_module("deduplicator")
class Deduplicator(Operator):
    """Keeps the first of each repeat.

    Tasks: a row whose text (``target_fields``, else the prompt) equals an earlier row's of the
    same taskset is dropped. Experiences: within each group (the rollouts of one task, one
    explore step), a response whose token ids equal an earlier member's is dropped, so a
    group keeps its distinct responses; a group is never dropped whole.

    Args:
        normalize_text: compare task texts with case folded and runs of whitespace made one
            space (experiences always compare exact token ids).
    """

    kinds = ("task", "experience")

    def __init__(self, normalize_text: bool = False) -> None:
        self.normalize_text = normalize_text

    def _key(self, text: str) -> str:
        if self.normalize_text:
            text = re.sub(r"\s+", " ", text.casefold()).strip()
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def process_tasks(self, rows: List[Row], context: TaskContext) -> Tuple[List[Row], Metrics]:
        seen, kept = set(), []
        for row in rows:
            key = self._key(context.text(row))
            if key not in seen:
                seen.add(key)
                kept.append(row)
        return kept, {}

    def process_experiences(
        self, exps: List[Experience], whole_groups: bool
    ) -> Tuple[List[Experience], Metrics]:
        seen, kept = set(), []
        for exp in exps:
            response = exp.tokens[exp.prompt_length :].tolist()
            key = (exp.group_id, tuple(response))
            if key not in seen:
                seen.add(key)
                kept.append(exp)
        return kept, {}
