"""Checks that need the whole config: what this build supports, and what can possibly run.

Both are tables: ``SUPPORTED`` maps a key path to the values this build can run, and
``MINIMUMS`` (``ABOVE``, ``AT_MOST_ONE``) maps a key path to its smallest sensible value
(a strict lower bound, an upper bound of 1). ``*`` in a path matches every item of a list or
mapping. Growing a feature means widening its row, nothing else. ``SAMPLING`` holds the
ranges of sampling parameters, checked on ``model`` and on every taskset's ``rollout_args``.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any, Callable, Dict, Iterator, List, Tuple, Union

from pydantic import BaseModel

from trinity.common.config.base import explicit_inert_values, is_set, join_path
from trinity.common.config.config import Config
from trinity.common.config.decoupled_checks import STORE_TYPES, decoupled_problems
from trinity.common.config.lora_checks import lora_problems
from trinity.common.config.nodes import node_problems
from trinity.common.config.ranks import rank_problems
from trinity.common.config.schema_buffer import MAX_TOP_LOGPROBS, StorageConfig
from trinity.common.config.sync_checks import sync_problems
from trinity.utils.database import database_url

logger = logging.getLogger("trinity.config")


def algorithm_module() -> Any:
    """``trinity.algorithm``, imported on first use (it imports config types itself)."""
    return importlib.import_module("trinity.algorithm")


def _registered_algorithms(config: Config) -> Tuple[Any, ...]:
    return tuple(algorithm_module().ALGORITHM_TYPE.names())


def _experience_buffer_storage(config: Config) -> Tuple[Any, ...]:
    # train mode reads SFT data from files; otherwise the explorer feeds the trainer a queue,
    # kept in a database (sql: the same queue, its table in the database at `path`). A train
    # run also reads the database a separate explore run writes (decoupled_checks.py).
    # Bench reads no experiences: the training YAML's buffer is taken as it is.
    return ("file", *STORE_TYPES) if config.mode in ("train", "bench") else STORE_TYPES


def _replay_modes(config: Config) -> Tuple[Any, ...]:
    # The replay pool lives in the queue actor the trainer of a `both` run reads; the guide
    # gives replay_buffer to `queue` buffers only.
    storage = config.buffer.trainer_input.experience_buffer  # unset: the default queue
    queue = storage is None or storage.storage_type == "queue"
    if config.mode == "bench":  # trains nothing: the training YAML's setting is kept
        return (False, True)
    return (False, True) if config.mode == "both" and queue else (False,)


def _uses_teacher(config: Config) -> bool:
    """The algorithm distils from ``explorer.auxiliary_models[0]`` (``use_teacher``)."""
    registry = algorithm_module().ALGORITHM_TYPE
    name = config.algorithm.algorithm_type
    return name in registry and getattr(registry.get(name), "use_teacher", False)


# algorithm key -> name of its registry in trinity.algorithm
COMPONENT_REGISTRIES = {
    "sample_strategy": "SAMPLE_STRATEGY",
    "advantage_fn": "ADVANTAGE_FN",
    "policy_loss_fn": "POLICY_LOSS_FN",
    "kl_penalty_fn": "KL_FN",
    "kl_loss_fn": "KL_FN",
    "entropy_loss_fn": "ENTROPY_LOSS_FN",
}

Allowed = Union[Tuple[Any, ...], Callable[[Config], Tuple[Any, ...]]]

SUPPORTED: Dict[str, Allowed] = {
    "mode": ("both", "train", "explore", "bench"),
    "algorithm.algorithm_type": _registered_algorithms,
    "model.lora_configs.*.lora_dtype": ("auto", "float32", "bfloat16", "float16"),
    "model.rope_scaling": (None,),
    "model.rope_theta": (None,),
    "model.tinker.enable": (False,),
    "buffer.explorer_input.tasksets.*.storage_type": ("file", "sql"),
    "buffer.explorer_input.eval_tasksets.*.storage_type": ("file", "sql"),
    "buffer.trainer_input.experience_buffer.storage_type": _experience_buffer_storage,
    "buffer.trainer_input.experience_buffer.replay_buffer.enable": _replay_modes,
    "buffer.trainer_input.auxiliary_buffers.*.storage_type": ("file",),
    "explorer.rollout_model.engine_type": (None, "transformers", "external"),
    "explorer.auxiliary_models.*.engine_type": (None, "transformers", "external"),
    "synchronizer.sync_style": ("fixed", "explorer_driven", "trainer_driven"),
    "synchronizer.sync_method": (None, "memory", "checkpoint"),
    "trainer.trainer_strategy": ("fsdp", "fsdp2"),
    "trainer.ulysses_sequence_parallel_size": (1,),
    "trainer.trainer_config.actor_rollout_ref.actor.ulysses_sequence_parallel_size": (1,),
    "trainer.trainer_config.actor_rollout_ref.ref.ulysses_sequence_parallel_size": (None, 1),
    "trainer.trainer_config.critic.ulysses_sequence_parallel_size": (1,),
    "monitor.monitor_type": ("tensorboard", "wandb", "mlflow"),
    # the task pipeline processes buffer.explorer_input.tasksets where they are read
    "data_processor.task_pipeline.inputs": ([],),
}

MINIMUMS: Dict[str, float] = {
    "cluster.node_num": 1,
    "cluster.gpu_per_node": 0,
    "algorithm.repeat_times": 1,
    "algorithm.optimizer.lr": 0.0,
    "algorithm.optimizer.lr_warmup_steps_ratio": 0.0,
    "algorithm.optimizer.min_lr_ratio": 0.0,
    "algorithm.optimizer.weight_decay": 0.0,
    "model.min_response_tokens": 0,
    "model.lora_configs.*.lora_rank": 1,
    "model.max_model_len": 1,
    "model.max_prompt_tokens": 1,
    "model.max_response_tokens": 1,
    "buffer.batch_size": 1,
    "buffer.train_batch_size": 1,
    "buffer.total_epochs": 1,
    "buffer.total_steps": 1,
    "buffer.explorer_input.tasksets.*.repeat_times": 1,
    "buffer.explorer_input.eval_tasksets.*.repeat_times": 1,
    "buffer.trainer_input.experience_buffer.max_read_timeout": 0.0,
    "buffer.trainer_input.experience_buffer.replay_buffer.reuse_cooldown_time": 0.0,
    "explorer.runner_per_model": 1,
    "explorer.max_repeat_times_per_runner": 1,
    "explorer.runner_state_report_interval": 0,
    "explorer.max_timeout": 1,
    "explorer.max_retry_times": 0,
    "explorer.max_failed_ratio": 0.0,
    "explorer.eval_interval": 1,
    "explorer.bench_checkpoints.*": 0,
    "explorer.rollout_model.engine_num": 1,
    "synchronizer.sync_interval": 1,
    "synchronizer.sync_offset": 0,
    "synchronizer.sync_timeout": 1,
    "trainer.total_steps": 1,
    "trainer.save_interval": 0,
    # -1 used to delete the checkpoint just written; null keeps every checkpoint
    "trainer.max_checkpoints_to_keep": 1,
    "trainer.max_token_len_per_gpu": 1,
    "trainer.trainer_config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
    "trainer.trainer_config.actor_rollout_ref.actor.ppo_epochs": 1,
    "trainer.trainer_config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 1,
    "data_processor.task_pipeline.num_process": 1,
}

STORAGE_PATHS = (
    "buffer.explorer_input.tasksets.*",
    "buffer.explorer_input.eval_tasksets.*",
    "buffer.trainer_input.experience_buffer",
    "buffer.trainer_input.auxiliary_buffers.*",
)

# Values that must be strictly greater than the given bound.
ABOVE: Dict[str, float] = {
    "model.repetition_penalty": 0.0,
    "model.lora_configs.*.lora_alpha": 0.0,
    "trainer.grad_clip": 0.0,  # clipping the gradient norm to 0 zeroes every update
}

# Fractions that must lie in [0, 1].
AT_MOST_ONE = (
    "algorithm.optimizer.lr_warmup_steps_ratio",
    "algorithm.optimizer.min_lr_ratio",
    "explorer.max_failed_ratio",
)

# Sampling parameter -> (whether a value is allowed, the allowed range in words).
# top_k: the engine (trinity/common/models/sampling.py), transformers and vLLM read 0 and -1
# as "no top-k limit", so both are allowed; anything below -1 is a typo.
SAMPLING: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "temperature": (lambda v: v >= 0, ">= 0 (0 is greedy)"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1] (1 is off)"),
    "top_k": (lambda v: v >= -1, ">= 1, or -1 (or 0) for no limit"),
    "n": (lambda v: v >= 1, ">= 1"),
    "max_tokens": (lambda v: v >= 1, ">= 1"),
    "logprobs": (lambda v: 0 <= v <= MAX_TOP_LOGPROBS, f"in [0, {MAX_TOP_LOGPROBS}]"),
}


def values_at(obj: Any, path: str, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """(concrete path, value) for every match of ``path``; unset (None) sections match nothing."""
    head, _, rest = path.partition(".")
    if obj is None:
        return
    if head == "*":
        items = enumerate(obj) if isinstance(obj, list) else obj.items()
        for key, item in items:
            yield from _descend(item, rest, join_path(prefix, key))
    else:
        yield from _descend(getattr(obj, head), rest, join_path(prefix, head))


def _descend(value: Any, rest: str, path: str) -> Iterator[Tuple[str, Any]]:
    if rest:
        yield from values_at(value, rest, path)
    else:
        yield path, value


def show(value: Any) -> str:
    """A value as a user would write it in YAML."""
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_unset=True)
    elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
        value = [v.model_dump(exclude_unset=True) for v in value]
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def check_supported(config: Config) -> List[str]:
    """One "<path> = <value> is not supported yet" line per value outside ``SUPPORTED``."""
    problems = []
    for pattern, allowed in SUPPORTED.items():
        values = allowed(config) if callable(allowed) else allowed
        for path, value in values_at(config, pattern):
            if value not in values:
                choices = [show(v) for v in values if v is not None]
                choices += ["unset"] if None in values else []
                problems.append(
                    f"{path} = {show(value)} is not supported yet (supported: {', '.join(choices)})"
                )
    return problems


def check_consistency(config: Config) -> List[str]:
    """Impossible or contradictory values of a finalized config."""
    problems = []
    for pattern, minimum in MINIMUMS.items():
        for path, value in values_at(config, pattern):
            if value is not None and value < minimum:
                problems.append(f"{path} = {value} must be >= {minimum}")
    for pattern, bound in ABOVE.items():
        for path, value in values_at(config, pattern):
            if value is not None and value <= bound:
                problems.append(f"{path} = {value} must be > {bound}")
    for pattern in AT_MOST_ONE:
        for path, value in values_at(config, pattern):
            if value > 1:
                problems.append(f"{path} = {value} must be <= 1")
    problems += _check_sampling(config)
    problems += _check_model(config)
    problems += lora_problems(config)
    problems += _check_run(config)
    problems += _check_openai_api(config)
    problems += _check_external(config)
    problems += _check_batches(config)
    problems += _check_datasets(config)
    problems += _check_buffer_path(config)
    problems += decoupled_problems(config)
    problems += rank_problems(config)
    problems += node_problems(config)
    problems += sync_problems(config)
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
    if config.mode in ("both", "explore", "bench") and model.max_response_tokens is None:
        problems.append(f"model.max_response_tokens is required in mode {config.mode}")
    trainer = config.trainer
    if (
        trainer.use_dynamic_bsz
        and model.max_model_len is not None
        and trainer.max_token_len_per_gpu is not None
        and trainer.max_token_len_per_gpu < model.max_model_len
    ):
        problems.append(
            f"trainer.max_token_len_per_gpu = {trainer.max_token_len_per_gpu} is less than "
            f"model.max_model_len = {model.max_model_len}: one full sequence would not fit"
        )
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
    if _uses_teacher(config) and not teachers:
        problems.append(
            f"algorithm.algorithm_type = {algorithm.algorithm_type} distils from a teacher: set "
            "explorer.auxiliary_models[0].model_path to it"
        )
    if config.synchronizer.sync_method == "memory" and config.mode != "both":
        problems.append(
            f"synchronizer.sync_method = memory needs mode both (trainer and explorer in one "
            f"run); with mode {config.mode} use checkpoint"
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


def external_models(config: Config) -> List[Tuple[str, str, Any, Any]]:
    """(YAML path of its ``external_model``, of its ``engine_type``, inference config,
    ``external_model``) of the rollout model and of every auxiliary model."""
    found = [
        (
            "model.external_model",
            "explorer.rollout_model.engine_type",
            config.explorer.rollout_model,
            config.model.external_model,
        )
    ]
    for index, aux in enumerate(config.explorer.auxiliary_models):
        prefix = f"explorer.auxiliary_models[{index}]"
        found.append((f"{prefix}.external_model", f"{prefix}.engine_type", aux, aux.external_model))
    return found


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
        if config.mode != "explore":
            problems.append(
                f"{key}: an external model cannot be trained (no weight sync to an API), so "
                f"mode {config.mode} cannot run; use mode: explore"
            )
        if rollout.enable_history:
            problems.append(
                f"explorer.rollout_model.enable_history = true with {key}: an API's replies "
                "carry no token ids to record; set enable_history: false"
            )
    teachers = config.explorer.auxiliary_models
    if _uses_teacher(config) and teachers and teachers[0].engine_type == "external":
        problems.append(
            f"explorer.auxiliary_models[0].engine_type = external: "
            f"{config.algorithm.algorithm_type} scores with the teacher's weights in the "
            "trainer, which an API does not give; use a local model"
        )
    return problems


def needs_groups(config: Config) -> bool:
    """Whether the algorithm's advantage fn compares the rollouts of one task (it declares
    ``needs_groups``), so batches must hold whole groups of ``repeat_times`` experiences."""
    registries, algorithm = algorithm_module(), config.algorithm
    if algorithm.advantage_fn is None or algorithm.algorithm_type not in registries.ALGORITHM_TYPE:
        return False
    if not getattr(registries.ALGORITHM_TYPE.get(algorithm.algorithm_type), "use_advantage", True):
        return False  # the advantage fn is never built
    try:
        advantage_fn = registries.ADVANTAGE_FN.get(algorithm.advantage_fn)
    except KeyError:  # reported by derive.py
        return False
    return bool(getattr(advantage_fn, "needs_groups", False))


def _buffer_rows(config: Config) -> Tuple[int, str]:
    """Experiences a train step takes from the experience buffer, and a note when that is
    fewer than ``train_batch_size`` (a sample strategy that mixes in auxiliary data)."""
    algorithm, batch = config.algorithm, config.buffer.train_batch_size
    try:
        strategy = algorithm_module().SAMPLE_STRATEGY.get(algorithm.sample_strategy or "default")
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
    if groups and repeat <= 1:
        problems.append(
            f"algorithm.repeat_times = {repeat}: {algorithm.algorithm_type} "
            "compares several rollouts of each task, so it needs repeat_times > 1"
        )
    if config.mode != "both" or min(buffer.batch_size, repeat, buffer.train_batch_size) < 1:
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
    if rows > output:
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
    if storage is None or storage.storage_type not in ("queue", "sql") or not storage.path:
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


def storages_of(config: Config) -> List[Tuple[str, StorageConfig]]:
    """(path, storage) of every taskset, eval taskset and buffer of the config."""
    found: List[Tuple[str, StorageConfig]] = []
    for pattern in STORAGE_PATHS:
        found += [(p, s) for p, s in values_at(config, pattern) if s is not None]
    return found


def _check_datasets(config: Config) -> List[str]:
    problems, names = [], {}
    if config.mode in ("both", "explore") and not config.buffer.explorer_input.tasksets:
        problems.append(f"buffer.explorer_input.taskset is required in mode {config.mode}")
    for path, storage in storages_of(config):
        needs_path = storage.storage_type == "file" or (
            storage.storage_type == "sql" and path.startswith("buffer.explorer_input")
        )
        if needs_path and not storage.path:
            problems.append(f"{path}.path is required for storage_type {storage.storage_type}")
        if storage.name in names:
            problems.append(f"{path}.name = {storage.name} is also used by {names[storage.name]}")
        names.setdefault(storage.name, path)
        n, repeat_times = storage.rollout_args.n, storage.repeat_times
        if repeat_times is not None and is_set(storage.rollout_args, "n") and n != repeat_times:
            problems.append(
                f"{path}.rollout_args.n = {storage.rollout_args.n} differs from its repeat_times "
                f"= {storage.repeat_times}; set repeat_times only"
            )
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


def _idle_pipelines(config: Config) -> List[Tuple[str, Any, str]]:
    """``data_processor`` pipelines in a mode that explores no training tasks (train, bench:
    e.g. the training YAML run again as the trainer of a decoupled pair): they do not run."""
    if config.mode in ("both", "explore"):
        return []
    why = f"mode {config.mode} explores no training tasks; pipelines run in modes both, explore"
    found = []
    for key in ("task_pipeline", "experience_pipeline"):
        pipeline = getattr(config.data_processor, key)
        if pipeline is not None and pipeline.operators:
            names = [op.name for op in pipeline.operators]
            found.append((f"data_processor.{key}.operators", names, why))
    return found


def warn_inert(config: Config) -> None:
    """Warn about every user-set key that this build accepts but does not use."""
    found = explicit_inert_values(config) + _idle_replay(config) + _idle_pipelines(config)
    if found:
        lines = "\n".join(f"  - {path} = {show(value)}: {reason}" for path, value, reason in found)
        logger.warning("These keys are accepted but have no effect here:\n%s", lines)
