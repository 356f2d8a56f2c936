"""The task and experience pipelines: ``data_processor``'s operators applied in order.

The task pipeline runs where a training taskset's rows are loaded (``TaskReader``), once per
process, so the explorer explores only the rows it keeps; eval tasksets are left as they
are. The experience pipeline runs on each explore step's experiences before the explorer
writes them to the buffer; a step it empties is still written (empty), which keeps the
trainer's step accounting. Both report rows in and out per operator.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

from trinity.buffer.operators import OPERATORS, Operator, TaskContext
from trinity.buffer.rows import Rows
from trinity.common.experience import Experience

logger = logging.getLogger("trinity.buffer")

Named = List[Tuple[str, Operator]]


def shared_args(config: Any, key: str) -> Dict[str, Any]:
    """What a pipeline gives the constructor parameters of these names that an operator's
    ``args`` leave out: ``np`` (``task_pipeline.num_process``), ``service``
    (``service.data_juicer``)."""
    shared = {"service": config.service.data_juicer}
    if key == "task_pipeline":
        shared["np"] = config.data_processor.task_pipeline.num_process
    return shared


def operator_kwargs(cls: Any, args: Dict[str, Any], shared: Dict[str, Any]) -> Dict[str, Any]:
    """``args`` plus the ``shared`` values ``cls``'s constructor takes (``args`` win)."""
    takes = inspect.signature(cls).parameters
    given = {k: v for k, v in shared.items() if k in takes and v is not None}
    return {**given, **args}


def resolved(cfg: Any) -> Tuple[str, Dict[str, Any]]:
    """The operator an ``OperatorConfig`` names, and its args. A plain name that no operator
    here has is a Data-Juicer operator (the guide's pipelines list them by their own names,
    e.g. ``llm_difficulty_score_filter``), run by ``data_juicer`` with that one operator."""
    if cfg.name in OPERATORS or "." in cfg.name:
        return cfg.name, dict(cfg.args)
    return "data_juicer", {"operators": [{cfg.name: dict(cfg.args)}]}


def build_operators(configs: Sequence[Any], shared: Optional[Dict[str, Any]] = None) -> Named:
    """``(label, operator)`` per ``OperatorConfig``; a name used twice is labelled by index."""
    names = [c.name for c in configs]
    out = []
    for index, cfg in enumerate(configs):
        label = cfg.name if names.count(cfg.name) == 1 else f"{cfg.name}_{index}"
        name, args = resolved(cfg)
        cls = OPERATORS.get(name)
        out.append((label, cls(**operator_kwargs(cls, args, shared or {}))))
    return out


def task_fields(pipeline_cfg: Any, storage: Any) -> List[str]:
    """The fields that make a task's text: ``target_fields``, else the taskset's prompt."""
    if pipeline_cfg.target_fields:
        return list(pipeline_cfg.target_fields)
    fmt = storage.format
    return [fmt.messages_key if fmt.prompt_type == "messages" else fmt.prompt_key]


class TaskPipeline:
    """Applies operators to the rows of training tasksets."""

    def __init__(self, operators: Named, config: Any) -> None:
        self.operators = operators
        self.pipeline_cfg = config.data_processor.task_pipeline
        self.tokenizer_path = config.model.model_path

    def apply(self, data: Any, storage: Any) -> Rows:
        """The rows of ``storage`` (loaded as ``data``) that every operator keeps."""
        fields = task_fields(self.pipeline_cfg, storage)
        context = TaskContext(fields, self.tokenizer_path, taskset=storage.name)
        rows, counts = data.to_list(), []
        for label, op in self.operators:
            before = len(rows)
            rows, _ = op.process_tasks(rows, context)
            counts.append(f"{label} {before} -> {len(rows)}")
        logger.info("task pipeline on taskset '%s': %s", storage.name, ", ".join(counts))
        if not rows:
            raise ValueError(
                f"data_processor.task_pipeline kept no row of taskset '{storage.name}' "
                f"({', '.join(counts)}): loosen its operators"
            )
        return Rows.from_list(rows, like=data)

    def close(self) -> None:
        for _, op in self.operators:
            op.close()


class ExperiencePipeline:
    """Applies operators to each explore step's experiences."""

    def __init__(self, operators: Named, whole_groups: bool) -> None:
        self.operators = operators
        self.whole_groups = whole_groups

    def run(self, exps: List[Experience]) -> Tuple[List[Experience], Dict[str, float]]:
        """What the operators keep, and ``pipeline/<op>/{kept,dropped,...}`` metrics."""
        metrics = {"pipeline/experiences_in": float(len(exps))}
        for label, op in self.operators:
            before = len(exps)
            exps, found = op.process_experiences(exps, self.whole_groups)
            metrics[f"pipeline/{label}/kept"] = float(len(exps))
            metrics[f"pipeline/{label}/dropped"] = float(before - len(exps))
            metrics.update({f"pipeline/{label}/{k}": float(v) for k, v in found.items()})
        metrics["pipeline/experiences_out"] = float(len(exps))
        return exps, metrics

    def close(self) -> None:
        for _, op in self.operators:
            op.close()


def build_task_pipeline(config: Any) -> Optional[TaskPipeline]:
    """The stage's task pipeline, or None when it has no task operators."""
    cfg = config.data_processor.task_pipeline
    if cfg is None or not cfg.operators:
        return None
    return TaskPipeline(
        build_operators(cfg.operators, shared_args(config, "task_pipeline")), config
    )


def build_experience_pipeline(config: Any, whole_groups: bool) -> Optional[ExperiencePipeline]:
    """The stage's experience pipeline, or None when it has no experience operators;
    ``whole_groups``: the algorithm's advantage compares a task's rollouts
    (``trinity.algorithm.needs_groups``), so filters keep or drop whole groups."""
    cfg = config.data_processor.experience_pipeline
    if cfg is None or not cfg.operators:
        return None
    operators = build_operators(cfg.operators, shared_args(config, "experience_pipeline"))
    return ExperiencePipeline(operators, whole_groups)
