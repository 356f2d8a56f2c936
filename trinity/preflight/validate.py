"""Checks that need the whole config: what can possibly run.

The tables they read (``SAMPLING``...) are in ``support.py``; what this build supports
(``SUPPORTED``) is checked by ``unsupported.py``; a field's own bounds are declared on it
and checked when the config is read.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Tuple

from trinity.algorithm import SAMPLE_STRATEGY, needs_groups
from trinity.buffer.priority import build_priority_fn
from trinity.buffer.selector import TASK_SELECTORS, build_selector
from trinity.buffer.storages import path_missing, read_as_rows, storage_kind
from trinity.common.config.base import explicit_inert_values, is_set
from trinity.common.config.config import Config, external_models
from trinity.common.config.gpus import gpu_problems
from trinity.common.config.lora_checks import lora_problems
from trinity.common.config.nodes import node_problems
from trinity.common.config.schema_buffer import StorageConfig
from trinity.common.config.schema_explorer import VLLM_KEYS
from trinity.common.config.sync_checks import sync_problems
from trinity.preflight.components import bind_problems, is_builtin
from trinity.preflight.decoupled import decoupled_problems
from trinity.preflight.hardware import hardware_problems
from trinity.preflight.ranks import rank_problems, unsplit_sequences
from trinity.preflight.reasoning_gym_checks import reasoning_gym_problems
from trinity.preflight.serve_checks import serve_problems
from trinity.preflight.storage_names import name_problem
from trinity.preflight.support import (
    COMPONENT_REGISTRIES,
    SAMPLING,
    STORAGE_PATHS,
    show,
    uses_teacher,
    values_at,
)
from trinity.preflight.tinker_checks import idle_keys, tinker_problems
from trinity.utils.database import database_url

logger = logging.getLogger("trinity.config")

# Served-model keys an external API's own server decides, not this config -> why.
API_DECIDES = {
    "enable_thinking": "the API's server applies its own chat template",
    "enable_auto_tool_choice": "the API's server decides whether it takes tool_choice auto",
}

# What every selector is built with besides task_selector.kwargs (buffer/selector/base.py).
SELECTOR_CONTEXT = ("seed", "feature_keys")


def check_consistency(config: Config) -> List[str]:
    """Impossible or contradictory values of a finalized config."""
    problems = _check_sampling(config)
    problems += _check_model(config)
    problems += lora_problems(config)
    problems += _check_run(config)
    problems += _check_openai_api(config)
    problems += _check_external(config)
    problems += _check_batches(config)
    problems += _check_datasets(config)
    problems += reasoning_gym_problems(config, storages_of(config))
    problems += _check_buffer_path(config)
    problems += buffer_component_problems(config)
    problems += decoupled_problems(config)
    problems += rank_problems(config)
    problems += hardware_problems(config)  # what this machine lacks (hardware.py)
    problems += node_problems(config)
    problems += gpu_problems(config)
    problems += sync_problems(config)
    problems += serve_problems(config)
    problems += tinker_problems(config)
    return problems


def _check_sampling(config: Config) -> List[str]:
    """``SAMPLING`` ranges on ``model`` and on each taskset's ``rollout_args``.

    A taskset's value that the user did not set was copied from ``model`` (or derived from
    checked keys), so only user-set ``rollout_args`` keys are checked: one mistake, one line.
    """
    sections: List[Tuple[str, Any]] = [("model", config.model)]
    for pattern in STORAGE_PATHS[:2]:  # tasksets and eval tasksets
        sections += [(f"{p}.rollout_args", s.rollout_args) for p, s in values_at(config, pattern)]
    problems = []
    for prefix, section in sections:
        for key, (allowed, text) in SAMPLING.items():
            if key not in type(section).model_fields:
                continue
            if section is not config.model and not is_set(section, key):
                continue
            value = getattr(section, key)
            if value is not None and not allowed(value):
                problems.append(f"{prefix}.{key} = {value} must be {text}")
    return problems


def _check_model(config: Config) -> List[str]:
    model, problems = config.model, []
    if not model.model_path:
        problems.append("model.model_path is required (a local HF model folder)")
    if model.max_response_tokens is not None and (
        model.min_response_tokens >= model.max_response_tokens
    ):
        problems.append(
            f"model.min_response_tokens = {model.min_response_tokens} must be less than "
            f"model.max_response_tokens = {model.max_response_tokens}"
        )
    if model.max_model_len is not None and model.max_prompt_tokens is not None:
        if model.max_prompt_tokens + model.min_response_tokens > model.max_model_len:
            problems.append(
                f"model.max_prompt_tokens + model.min_response_tokens = "
                f"{model.max_prompt_tokens} + {model.min_response_tokens} exceeds "
                f"model.max_model_len = {model.max_model_len}"
            )
    if (
        config.mode in ("both", "colocate", "explore", "bench")
        and model.max_response_tokens is None
    ):
        problems.append(f"model.max_response_tokens is required in mode {config.mode}")
    return problems


def _check_run(config: Config) -> List[str]:
    problems = []
    algorithm = config.algorithm
    teachers = config.explorer.auxiliary_models
    for index, aux in enumerate(teachers):
        if aux.engine_type == "external":
            if not (aux.model_path or aux.external_model.model_name):
                problems.append(
                    f"explorer.auxiliary_models[{index}].external_model.model_name is required "
                    "(the model name sent to the API)"
                )
        elif not aux.model_path:
            problems.append(
                f"explorer.auxiliary_models[{index}].model_path is required (the model to serve)"
            )
    if uses_teacher(config) and not teachers:
        problems.append(
            f"algorithm.algorithm_type = {algorithm.algorithm_type} distils from a teacher: set "
            "explorer.auxiliary_models[0].model_path to it"
        )
    if config.synchronizer.sync_method == "nccl" and config.mode in ("colocate", "serve"):
        problems.append(
            "synchronizer.sync_method = nccl needs mode both (the trainer broadcasts to the "
            f"rollout engines of its own run, each in a process of its own); with mode "
            f"{config.mode} use memory"
        )
    return problems


def _check_openai_api(config: Config) -> List[str]:
    """The rollout engines' OpenAI-compatible servers listen on a port each."""
    rollout, key = config.explorer.rollout_model, "explorer.rollout_model.openai_api_port"
    port = rollout.openai_api_port
    if not 0 <= port <= 65535:
        return [f"{key} = {port} must be in [0, 65535] (0: a free port)"]
    if port and rollout.enable_openai_api and rollout.engine_num > 1:
        return [
            f"{key} = {port} with explorer.rollout_model.engine_num = {rollout.engine_num}: "
            "each engine serves on a port of its own; set 0 (a free port for each)"
        ]
    return []


def _check_external(config: Config) -> List[str]:
    """External (API) models: one switch, never trained, no token-exact history."""
    problems = []
    for path, engine_key, served, external in external_models(config):
        # derive.py fills either key from the other, so they differ only when both were set
        if external.enable != (served.engine_type == "external"):
            problems.append(
                f"{path}.enable = {show(external.enable)} contradicts {engine_key} = "
                f"{served.engine_type}; set only one (engine_type: external is enable: true)"
            )
    rollout = config.explorer.rollout_model
    if rollout.external_model != type(rollout.external_model)():  # a saved config has defaults
        problems.append(
            "explorer.rollout_model.external_model: the rollout model's API is set in "
            "model.external_model; move it there"
        )
    if rollout.engine_type == "external":
        key = "model.external_model.enable"
        if not is_set(config.model.external_model, "enable"):
            key = "explorer.rollout_model.engine_type = external"
        if config.mode not in ("explore", "bench"):
            problems.append(
                f"{key}: an external model cannot be trained (no weight sync to an API), so "
                f"mode {config.mode} cannot run; use mode: explore (or bench to evaluate it)"
            )
        if rollout.enable_history:
            problems.append(
                f"explorer.rollout_model.enable_history = true with {key}: an API's replies "
                "carry no token ids to record; set enable_history: false"
            )
    teachers = config.explorer.auxiliary_models
    if uses_teacher(config) and teachers and teachers[0].engine_type == "external":
        problems.append(
            f"explorer.auxiliary_models[0].engine_type = external: "
            f"{config.algorithm.algorithm_type} scores with the teacher's weights in the "
            "trainer, which an API does not give; use a local model"
        )
    for _, engine_key, served, _ in external_models(config):
        for name, reason in API_DECIDES.items():
            if served.engine_type == "external" and is_set(served, name):
                key = engine_key.rsplit(".", 1)[0] + f".{name}"
                problems.append(
                    f"{key} with engine_type external is not supported yet: {reason}; "
                    "remove the key"
                )
    return problems


def _buffer_rows(config: Config) -> Tuple[int, str]:
    """Experiences a train step takes from the experience buffer, and a note when that is
    fewer than ``train_batch_size`` (a sample strategy that mixes in auxiliary data)."""
    algorithm, batch = config.algorithm, config.buffer.train_batch_size
    try:
        strategy = SAMPLE_STRATEGY.get(algorithm.sample_strategy or "default")
        rows_of = getattr(strategy, "buffer_rows", None)
        rows = rows_of(batch, dict(algorithm.sample_strategy_args)) if rows_of else batch
    except (KeyError, TypeError, ValueError):  # a bad name or argument is reported elsewhere
        rows = batch
    note = "" if rows == batch else f" (of which {rows} from the experience buffer)"
    return rows, note


def _check_batches(config: Config) -> List[str]:
    """Group sizes and what one explore step can feed one train step."""
    algorithm, buffer, problems = config.algorithm, config.buffer, []
    groups, repeat = needs_groups(config), algorithm.repeat_times
    # mode serve: a group is what clients give one task_id, whatever repeat_times says
    if groups and repeat <= 1 and config.mode != "serve":
        problems.append(
            f"algorithm.repeat_times = {repeat}: {algorithm.algorithm_type} "
            "compares several rollouts of each task, so it needs repeat_times > 1"
        )
    if (
        config.mode not in ("both", "colocate")
        or min(buffer.batch_size, repeat, buffer.train_batch_size) < 1
    ):
        return problems
    rows, note = _buffer_rows(config)
    if groups and repeat > 1 and rows % repeat:
        problems.append(
            f"buffer.train_batch_size = {buffer.train_batch_size}{note} is not a multiple of "
            f"algorithm.repeat_times = {repeat}: {algorithm.algorithm_type} trains on whole "
            f"groups of {repeat} rollouts, so a step would split a group"
        )
    tasksets = config.buffer.explorer_input.tasksets
    fewest = min(tasksets, key=lambda t: t.repeat_times or repeat, default=None)
    per_task, source = repeat, "algorithm.repeat_times"
    if fewest is not None and fewest.repeat_times and fewest.repeat_times < repeat:
        per_task, source = fewest.repeat_times, f"taskset '{fewest.name}' repeat_times"
    output = buffer.batch_size * per_task
    # in the dynamic styles the explorer does not wait for the trainer's update, so a train
    # step may take the experiences of several explore steps
    if rows > output and config.synchronizer.sync_style == "fixed":
        problems.append(
            f"buffer.train_batch_size = {buffer.train_batch_size}{note} exceeds one explore "
            f"step's output, buffer.batch_size * {source} = {buffer.batch_size} * {per_task} = "
            f"{output}: the trainer would wait for experiences of a step that needs its own "
            f"update first; use at most {output}"
        )
    return problems


def _check_buffer_path(config: Config) -> List[str]:
    """A queue's or sql buffer's ``path`` is a SQLite file or a database URL SQLAlchemy
    parses; whether it can be reached is checked before start (``preflight``)."""
    storage = config.buffer.trainer_input.experience_buffer
    if storage is None or not storage.path or not storage_kind(storage).holds_experiences:
        return []
    key = "buffer.trainer_input.experience_buffer.path"
    if os.path.splitext(storage.path)[1].lower() in (".json", ".jsonl"):
        return [
            f"{key} = {storage.path}: backing the queue with a JSON file is not supported yet; "
            "use a SQLite file such as 'sqlite:///buffer.db' or a database URL"
        ]
    try:
        database_url(storage.path)
    except ValueError as exc:
        return [f"{key}: {exc}"]
    return []


def buffer_component_problems(config: Config) -> List[str]:
    """Each storage's task selector is registered, and its replay priority function builds
    with its arguments (plugins are imported before the config is checked)."""
    problems = []
    for path, storage in storages_of(config):
        problems += selector_problems(f"{path}.task_selector", storage.task_selector)
        replay = storage.replay_buffer
        try:
            build_priority_fn(replay.priority_fn, dict(replay.priority_fn_args))
        except KeyError as exc:
            message = f"priority_fn = {replay.priority_fn}: {exc.args[0]}"
            problems.append(f"{path}.replay_buffer: {message}")
        except (TypeError, ValueError) as exc:
            message = f"priority_fn_args of '{replay.priority_fn}': {exc}"
            problems.append(f"{path}.replay_buffer: {message}")
    return problems


def selector_problems(path: str, task_selector: Any) -> List[str]:
    """The selector is registered, its ``kwargs`` are arguments it takes, and a built-in
    one builds with them (its own checks: ranges, how many ``feature_keys``)."""
    name = task_selector.selector_type
    try:
        cls = TASK_SELECTORS.get(name)
    except KeyError as exc:
        return [f"{path}.selector_type: {exc.args[0]}"]
    owner = f"selector '{name}'"
    problems = bind_problems(cls, task_selector.kwargs, f"{path}.kwargs", owner, SELECTOR_CONTEXT)
    if problems or not is_builtin(cls):
        return problems
    try:
        build_selector(task_selector)
    except (TypeError, ValueError) as exc:
        return [f"{path}: {exc}"]
    return []


def storages_of(config: Config) -> List[Tuple[str, StorageConfig]]:
    """(path, storage) of every taskset, eval taskset and buffer of the config."""
    found: List[Tuple[str, StorageConfig]] = []
    for pattern in STORAGE_PATHS:
        found += [(p, s) for p, s in values_at(config, pattern) if s is not None]
    return found


def _check_datasets(config: Config) -> List[str]:
    problems: List[str] = []
    names: Dict[Tuple[str, str], str] = {}
    if config.mode in ("both", "colocate", "explore") and not config.buffer.explorer_input.tasksets:
        problems.append(f"buffer.explorer_input.taskset is required in mode {config.mode}")
    for path, storage in storages_of(config):
        as_rows = read_as_rows(storage, path == "buffer.trainer_input.experience_buffer")
        if as_rows and path_missing(storage):
            problems.append(f"{path}.path is required for storage_type {storage.storage_type}")
        problems += name_problem(path, storage.name, names)
    return problems


def _idle_replay(config: Config) -> List[Tuple[str, Any, str]]:
    """``replay_buffer.enable`` without a cooldown: the guide's null means never reused."""
    storage = config.buffer.trainer_input.experience_buffer
    replay = storage.replay_buffer if storage is not None else None
    if replay is None or not replay.enable or replay.reuse_cooldown_time is not None:
        return []
    path = "buffer.trainer_input.experience_buffer.replay_buffer"
    why = "reuse_cooldown_time is null, so no experience is reused; set it (seconds)"
    return [(f"{path}.enable", True, why)]


def _idle_engine_keys(config: Config) -> List[Tuple[str, Any, str]]:
    """Keys only the vllm engine reads, set for a model another engine serves."""
    explorer = config.explorer
    served = [("explorer.rollout_model", explorer.rollout_model)]
    served += [
        (f"explorer.auxiliary_models[{i}]", a) for i, a in enumerate(explorer.auxiliary_models)
    ]
    found = [
        (
            f"{path}.{key}",
            getattr(model, key),
            f"only the vllm engine reads it ({path}.engine_type = {model.engine_type})",
        )
        for path, model in served
        if model.engine_type != "vllm"
        for key in VLLM_KEYS
        if is_set(model, key)
    ]
    if not config.cluster.gpu_per_node:  # a GPU config run on CPU: the key is kept, unread
        why = "applies to GPUs; on CPU the vllm engine sizes its KV cache from max_model_len"
        key = "gpu_memory_utilization"
        found += [
            (f"{path}.{key}", getattr(model, key), why)
            for path, model in served
            if model.engine_type == "vllm" and is_set(model, key)
        ]
    return found


def _idle_pipelines(config: Config) -> List[Tuple[str, Any, str]]:
    """``data_processor`` pipelines in a mode that explores no training tasks (train, bench:
    e.g. the training YAML run again as the trainer of a decoupled pair): they do not run."""
    if config.mode in ("both", "colocate", "explore"):
        return []
    why = f"mode {config.mode} explores no training tasks; pipelines run in modes both, explore"
    found = []
    for key in ("task_pipeline", "experience_pipeline"):
        pipeline = getattr(config.data_processor, key)
        if pipeline is not None and pipeline.operators:
            names = [op.name for op in pipeline.operators]
            found.append((f"data_processor.{key}.operators", names, why))
    return found


def _inert_component_args(config: Config) -> List[Tuple[str, Any, str]]:
    """Arguments of the algorithm's components that they accept unread (``inert_args``)."""
    algorithm, found = config.algorithm, []
    for key, registry in COMPONENT_REGISTRIES.items():
        name = getattr(algorithm, key)
        if name is None or name not in registry:
            continue
        inert = getattr(registry.get(name), "inert_args", {})
        args = getattr(algorithm, f"{key}_args")
        found += [
            (f"algorithm.{key}_args.{arg}", value, inert[arg])
            for arg, value in args.items()
            if arg in inert
        ]
    return found


def warn_inert(config: Config) -> None:
    """Warn about every user-set key that this build accepts but does not use."""
    found = explicit_inert_values(config) + _idle_replay(config) + _idle_pipelines(config)
    found += _idle_engine_keys(config) + _inert_component_args(config) + idle_keys(config)
    found += unsplit_sequences(config)
    if found:
        lines = "\n".join(f"  - {path} = {show(value)}: {reason}" for path, value, reason in found)
        logger.warning("These keys are accepted but have no effect here:\n%s", lines)


def read_storages(config: Config, kinds: Tuple[str, ...]) -> List[Tuple[str, StorageConfig]]:
    """(YAML path, storage) of the named kinds of storage that the stage's mode reads."""
    found: List[Tuple[str, StorageConfig]] = []
    explorer_input, trainer_input = config.buffer.explorer_input, config.buffer.trainer_input
    if config.mode in ("both", "colocate", "explore", "bench"):
        # bench evaluates checkpoints: it reads the eval tasksets only
        read = ("eval_tasksets",) if config.mode == "bench" else ("tasksets", "eval_tasksets")
        for kind in read:
            if kind in kinds:
                storages = getattr(explorer_input, kind)
                found += [(f"buffer.explorer_input.{kind}[{i}]", s) for i, s in enumerate(storages)]
    buffer = trainer_input.experience_buffer
    if "experience_buffer" in kinds and buffer is not None and config.mode == "train":
        found.append(("buffer.trainer_input.experience_buffer", buffer))
    if "auxiliary_buffers" in kinds and config.mode in ("both", "colocate", "train"):
        auxiliary = trainer_input.auxiliary_buffers.items()
        found += [(f"buffer.trainer_input.auxiliary_buffers.{k}", s) for k, s in auxiliary]
    return found
