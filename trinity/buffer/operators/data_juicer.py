"""``data_juicer``: runs Data-Juicer operators on tasks or experiences."""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Dict, List, Optional, Tuple

import yaml

from trinity.buffer.operators.base import (
    OPERATORS,
    Metrics,
    Operator,
    Row,
    TaskContext,
    select,
)
from trinity.buffer.operators.dj_service import (
    DEFAULT_PORT,
    DataJuicerClient,
    load_process,
    run_ops,
)
from trinity.common.experience import Experience

INSTALL = "pip install 'trinity-rft[data_juicer]' (or: pip install py-data-juicer)"
INDEX = "__trinity_index__"  # row position, carried through Data-Juicer to map rows back
STATS = "__dj__stats__"  # where Data-Juicer's filters leave their scores


def data_juicer_missing() -> Optional[str]:
    """Why Data-Juicer cannot be used here (not installed), or None. Found, not imported:
    importing it takes seconds, and a process that only talks to the service never needs it."""
    if importlib.util.find_spec("data_juicer") is None:
        return f"Data-Juicer is not installed; install it with: {INSTALL}"
    return None


def service_url(service: Any) -> str:
    """Where ``service.data_juicer`` is reached: its auto-started port, else ``server_url``."""
    if service.auto_start:
        return f"http://127.0.0.1:{service.port or DEFAULT_PORT}"
    return service.server_url


@OPERATORS.register_module("data_juicer")
class DataJuicerOperator(Operator):
    """Data-Juicer's operators (filters, mappers, deduplicators), given as a recipe file
    (``config_path``: a Data-Juicer YAML whose ``process`` lists the operators) or inline
    (``operators``: the same list, e.g. ``[{text_length_filter: {min_len: 10}}]``).

    They run in this process, or in the Data-Juicer service when ``service.data_juicer`` is
    set (``service`` is passed from there, not from ``args``). Tasks: Data-Juicer sees each
    row's fields plus ``text``, the task's text; kept rows come back, with a mapper's new
    text written to the target field when there is one. Experiences: Data-Juicer sees
    ``text`` and ``response`` (the response) and ``query`` (the prompt); its scores
    (``__dj__stats__``, e.g. ``llm_quality_score``) are added to each kept experience's
    ``info`` for ``reward_shaping_mapper``. With a group algorithm a group stays only if
    Data-Juicer keeps every member.

    Args:
        config_path: a Data-Juicer recipe (YAML with ``process:``).
        operators: the operator list, when there is no recipe file.
        np: processes each Data-Juicer operator uses (the recipe's ``np`` if unset, else 1).
    """

    kinds = ("task", "experience")

    def __init__(
        self,
        config_path: Optional[str] = None,
        operators: Optional[List[Dict[str, Any]]] = None,
        np: Optional[int] = None,
        service: Any = None,
    ) -> None:
        if (config_path is None) == (operators is None):
            raise ValueError("set exactly one of config_path (a recipe file) and operators")
        recipe: Dict[str, Any] = {"process": operators}
        if config_path is not None:
            recipe = _read_recipe(config_path)
        self.process = _checked_process(recipe.get("process"), config_path)
        self.np = int(np or recipe.get("np") or 1)
        if service is not None and not hasattr(service, "auto_start"):
            raise ValueError("service comes from service.data_juicer; remove it from args")
        self.service, self.client, self.ops = service, None, None
        if service is None or service.auto_start:  # Data-Juicer runs on this machine
            missing = data_juicer_missing()
            if missing:
                raise ValueError(missing)
        if service is None:
            from data_juicer.ops import OPERATORS as DJ_OPERATORS

            unknown = [name for name, _ in self.process if name not in DJ_OPERATORS.modules]
            if unknown:
                raise ValueError(f"Data-Juicer has no operator '{unknown[0]}'")

    def _run(self, rows: List[Row]) -> List[Row]:
        if self.service is None:
            if self.ops is None:  # first use: preflight constructs operators without running
                self.ops = load_process(self.process, self.np)
            return run_ops(self.ops, rows)
        if self.client is None:
            self.client = DataJuicerClient(service_url(self.service))
            if self.service.auto_start:
                self.client.start(self.service.port or DEFAULT_PORT)
        return self.client.process(self.process, self.np, rows)

    def close(self) -> None:
        if self.client is not None:
            self.client.stop()
            self.client = None

    def process_tasks(self, rows: List[Row], context: TaskContext) -> Tuple[List[Row], Metrics]:
        inputs = [{**row, "text": context.text(row), INDEX: i} for i, row in enumerate(rows)]
        single = context.fields[0] if len(context.fields) == 1 else None
        out = []
        for result in self._run(inputs):
            row = dict(rows[result[INDEX]])
            if single is not None:
                row[single] = result["text"]  # a mapper may have rewritten it
            out.append(row)
        return out, {}

    def process_experiences(
        self, exps: List[Experience], whole_groups: bool
    ) -> Tuple[List[Experience], Metrics]:
        inputs = [
            {
                "text": e.response_text or "",
                "response": e.response_text or "",
                "query": e.prompt_text or "",
                INDEX: i,
            }
            for i, e in enumerate(exps)
        ]
        keep = [False] * len(exps)
        for result in self._run(inputs):
            exp = exps[result[INDEX]]
            exp.info.update(result.get(STATS) or {})
            keep[result[INDEX]] = True
        return select(exps, keep, whole_groups), {}


def _read_recipe(path: str) -> Dict[str, Any]:
    if not os.path.isfile(path):
        raise ValueError(f"config_path = {path}: no such file")
    with open(path, encoding="utf-8") as f:
        try:
            recipe = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise ValueError(f"config_path = {path}: not valid YAML: {exc}") from None
    if not isinstance(recipe, dict):
        raise ValueError(f"config_path = {path}: expected a mapping with a process list")
    return recipe


def _checked_process(process: Any, source: Optional[str]) -> List[Tuple[str, Dict[str, Any]]]:
    """``[(operator name, args)]`` of a Data-Juicer process list, or a ValueError naming it."""
    where = f"{source}: process" if source else "operators"
    if not isinstance(process, list) or not process:
        raise ValueError(f"{where}: expected a non-empty list like [{{text_length_filter: {{}}}}]")
    out = []
    for index, item in enumerate(process):
        if not (isinstance(item, dict) and len(item) == 1):
            raise ValueError(f"{where}[{index}] = {item!r}: expected {{operator_name: {{args}}}}")
        name, args = next(iter(item.items()))
        if args is not None and not isinstance(args, dict):
            raise ValueError(f"{where}[{index}].{name} = {args!r}: expected a mapping of args")
        out.append((str(name), dict(args or {})))
    return out
