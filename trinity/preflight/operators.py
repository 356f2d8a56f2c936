"""Pre-start checks of ``data_processor``'s pipelines.

Each operator name must resolve in ``OPERATORS`` and suit its pipeline (tasks or
experiences); its ``args`` must bind to the operator's constructor; built-in operators are
then constructed once, so their own argument checks (ranges, files, an installed
Data-Juicer) fail before Ray starts. The task pipeline's ``target_fields`` must be columns
of every training taskset, and ``service.data_juicer`` must name one server. Modes that
explore no training tasks (train, bench) run no pipeline, so nothing is checked there.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

from trinity.buffer.file_reader import load_rows
from trinity.buffer.operators import OPERATORS
from trinity.buffer.operators.data_juicer import service_url
from trinity.buffer.operators.dj_service import DataJuicerClient
from trinity.buffer.pipelines import operator_kwargs, resolved, shared_args
from trinity.buffer.storages import path_missing, read_as_rows
from trinity.common.config.config import Config
from trinity.preflight.components import bind_problems, is_builtin
from trinity.utils.suggest import did_you_mean

PIPELINES = {"task_pipeline": "task", "experience_pipeline": "experience"}


def operator_problems(config: Config, construct: bool) -> List[str]:
    """Every problem of the stage's pipelines; ``construct``: also build built-ins once."""
    if config.mode not in ("both", "colocate", "explore"):
        return []  # nothing runs them (validate.warn_inert says so): nothing to check
    problems = []
    for key, kind in PIPELINES.items():
        pipeline = getattr(config.data_processor, key)
        if pipeline is None or not pipeline.operators:
            continue
        shared = shared_args(config, key)
        for index, op in enumerate(pipeline.operators):
            path = f"data_processor.{key}.operators[{index}]"
            problems += _operator_problems(op, path, kind, construct, shared)
    problems += _service_problems(config.service.data_juicer)
    task_pipeline = config.data_processor.task_pipeline
    if task_pipeline is not None and task_pipeline.operators and task_pipeline.target_fields:
        problems += _target_field_problems(config, task_pipeline.target_fields)
    return problems


def _operator_problems(
    op: Any, path: str, kind: str, construct: bool, shared: Dict[str, Any]
) -> List[str]:
    name, args = resolved(op)
    try:
        cls = OPERATORS.get(name)
    except KeyError as exc:
        return [f"{path}.name = {op.name}: {exc.args[0]}"]
    if kind not in cls.kinds:
        other = next((k for k, v in PIPELINES.items() if v in cls.kinds), None)
        where = f"; put it in data_processor.{other}" if other else ""
        return [f"{path}.name = {op.name}: it does not process {kind}s{where}"]
    problems = bind_problems(cls, args, f"{path}.args", f"operator '{op.name}'", shared)
    if (construct or name == "data_juicer") and not problems and is_builtin(cls):
        try:  # data_juicer always: a missing Data-Juicer is reported with the install command
            built = cls(**operator_kwargs(cls, args, shared))
            problems += _api_model_problems(path, getattr(built, "process", None) or [])
            built.close()
        except (TypeError, ValueError) as exc:
            if name == op.name:
                problems.append(f"{path}.args: {exc}")
            else:  # read as a Data-Juicer operator: maybe a misspelt one of ours
                problems.append(f"{path}.name = {op.name}: {_not_ours(op.name)}, and {exc}")
    return problems


def _api_model_problems(path: str, process: List[Tuple[str, Dict[str, Any]]]) -> List[str]:
    """Data-Juicer's LLM operators call ``api_or_hf_model`` as an OpenAI-compatible API
    (unless ``is_hf_model``) at ``OPENAI_BASE_URL``: unset, every call would fail after start."""
    if os.environ.get("OPENAI_BASE_URL"):
        return []
    return [
        f"{path}: Data-Juicer's {name} calls api_or_hf_model = {args['api_or_hf_model']} as an "
        "OpenAI-compatible API, and OPENAI_BASE_URL is not set; export it (and OPENAI_API_KEY), "
        "or give a local model with is_hf_model: true"
        for name, args in process
        if args.get("api_or_hf_model") and not args.get("is_hf_model")
    ]


def _not_ours(name: str) -> str:
    hint = did_you_mean(name, OPERATORS.names()).removeprefix("; ")
    shown = f" ({hint})" if hint else ""
    return f"not an operator of this build{shown}, known: {', '.join(OPERATORS.names())}"


def _target_field_problems(config: Config, fields: List[str]) -> List[str]:
    problems = []
    for index, storage in enumerate(config.buffer.explorer_input.tasksets):
        if not read_as_rows(storage) or path_missing(storage):
            continue
        try:
            columns = load_rows(storage).column_names
        except Exception:  # noqa: BLE001 - the data checks report an unreadable taskset
            continue
        missing = [f for f in fields if f not in columns]
        source = storage.path or storage.storage_type
        if missing:
            problems.append(
                f"data_processor.task_pipeline.target_fields: '{missing[0]}' is not a column "
                f"of buffer.explorer_input.tasksets[{index}] ({source}; columns: "
                f"{', '.join(columns)})"
            )
    return problems


def _service_problems(service: Any) -> List[str]:
    """``service.data_juicer`` names one server: a running one, or one started here."""
    if service is None:
        return []
    key = "service.data_juicer"
    if not service.auto_start and not service.server_url:
        return [f"{key}.server_url is not set: give the running server's URL, or set auto_start"]
    url = service_url(service)
    if service.auto_start and service.server_url and service.server_url.rstrip("/") != url:
        return [
            f"{key}.server_url = {service.server_url}, but auto_start starts the server at {url} "
            f"({key}.port); set server_url to {url} or leave it out"
        ]
    if not service.auto_start and not DataJuicerClient(url).healthy():
        return [
            f"{key}.server_url = {url}: no Data-Juicer service answers there (GET /health); "
            "start it (python -m trinity.buffer.operators.dj_service --port PORT) or set "
            f"{key}.auto_start: true"
        ]
    return []
