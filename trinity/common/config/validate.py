"""Checks that need the whole config: what this build supports, and what can possibly run.

Both are tables: ``SUPPORTED`` maps a key path to the values this build can run, and
``MINIMUMS`` maps a key path to its smallest sensible value. ``*`` in a path matches every
item of a list or mapping. Growing a feature means widening its row, nothing else.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable, Dict, Iterator, List, Tuple, Union

from pydantic import BaseModel

from trinity.common.config.base import explicit_inert_values, is_set, join_path
from trinity.common.config.config import Config
from trinity.common.config.schema_buffer import StorageConfig

logger = logging.getLogger("trinity.config")

# Algorithms whose advantages compare the rollouts of one task (the guide: GRPO and OPMD
# require repeat_times > 1).
GROUP_ALGORITHMS = ("grpo", "opmd")


def algorithm_module() -> Any:
    """``trinity.algorithm``, imported on first use (it imports config types itself)."""
    return importlib.import_module("trinity.algorithm")


def _registered_algorithms(config: Config) -> Tuple[Any, ...]:
    return tuple(algorithm_module().ALGORITHM_TYPE.names())


def _experience_buffer_storage(config: Config) -> Tuple[Any, ...]:
    # train mode reads SFT data from files; otherwise the explorer feeds the trainer a queue.
    return ("file",) if config.mode == "train" else ("queue",)


def _auxiliary_models(config: Config) -> Tuple[Any, ...]:
    # So far the only consumer is the teacher of a distilling algorithm (use_teacher).
    registry = algorithm_module().ALGORITHM_TYPE
    name = config.algorithm.algorithm_type
    if name in registry and getattr(registry.get(name), "use_teacher", False):
        return (config.explorer.auxiliary_models,)
    return ([],)


Allowed = Union[Tuple[Any, ...], Callable[[Config], Tuple[Any, ...]]]

SUPPORTED: Dict[str, Allowed] = {
    "mode": ("both", "train", "explore"),
    "algorithm.algorithm_type": _registered_algorithms,
    "model.lora_configs": (None, []),
    "model.rope_scaling": (None,),
    "model.rope_theta": (None,),
    "model.tinker.enable": (False,),
    "model.external_model.enable": (False,),
    "buffer.explorer_input.tasksets.*.storage_type": ("file",),
    "buffer.explorer_input.eval_tasksets.*.storage_type": ("file",),
    # the engine stops on eos/stop token ids and returns the sampled token's logprob only
    "buffer.explorer_input.tasksets.*.rollout_args.stop": (None, []),
    "buffer.explorer_input.eval_tasksets.*.rollout_args.stop": (None, []),
    "buffer.explorer_input.tasksets.*.rollout_args.logprobs": (0,),
    "buffer.explorer_input.eval_tasksets.*.rollout_args.logprobs": (0,),
    "buffer.trainer_input.experience_buffer.storage_type": _experience_buffer_storage,
    "buffer.trainer_input.experience_buffer.replay_buffer.enable": (False,),
    "buffer.trainer_input.auxiliary_buffers.*.storage_type": ("file",),
    "explorer.concurrent_mode": ("sequential", "multi-threading"),
    "explorer.rollout_model.engine_type": (None, "transformers"),
    "explorer.rollout_model.enable_openai_api": (False,),
    "explorer.rollout_model.enable_history": (False,),
    "explorer.auxiliary_models": _auxiliary_models,
    "explorer.over_rollout.ratio": (0.0,),
    "explorer.dynamic_timeout.enable": (False,),
    "synchronizer.sync_style": ("fixed",),
    "synchronizer.sync_method": (None, "memory", "checkpoint"),
    "trainer.trainer_strategy": ("fsdp", "fsdp2"),
    "trainer.ulysses_sequence_parallel_size": (1,),
    "trainer.trainer_config.actor_rollout_ref.actor.ulysses_sequence_parallel_size": (1,),
    "trainer.trainer_config.actor_rollout_ref.ref.ulysses_sequence_parallel_size": (None, 1),
    "trainer.trainer_config.critic.ulysses_sequence_parallel_size": (1,),
    "monitor.monitor_type": ("tensorboard",),
    "monitor.enable_ray_timeline": (False,),
    "service.data_juicer": (None,),
    "data_processor.task_pipeline": (None,),
    "data_processor.experience_pipeline": (None,),
}

MINIMUMS: Dict[str, float] = {
    "cluster.node_num": 1,
    "cluster.gpu_per_node": 0,
    "algorithm.repeat_times": 1,
    "algorithm.optimizer.lr": 0.0,
    "algorithm.optimizer.lr_warmup_steps_ratio": 0.0,
    "algorithm.optimizer.min_lr_ratio": 0.0,
    "model.min_response_tokens": 0,
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
    "explorer.runner_per_model": 1,
    "explorer.max_timeout": 1,
    "explorer.max_retry_times": 0,
    "explorer.eval_interval": 1,
    "explorer.rollout_model.engine_num": 1,
    "synchronizer.sync_interval": 1,
    "synchronizer.sync_offset": 0,
    "synchronizer.sync_timeout": 1,
    "trainer.save_interval": 0,
    "trainer.max_token_len_per_gpu": 1,
    "trainer.trainer_config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
    "trainer.trainer_config.actor_rollout_ref.actor.ppo_epochs": 1,
    "trainer.trainer_config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 1,
}

STORAGE_PATHS = (
    "buffer.explorer_input.tasksets.*",
    "buffer.explorer_input.eval_tasksets.*",
    "buffer.trainer_input.experience_buffer",
    "buffer.trainer_input.auxiliary_buffers.*",
)

# Fractions that must lie in [0, 1].
AT_MOST_ONE = ("algorithm.optimizer.lr_warmup_steps_ratio", "algorithm.optimizer.min_lr_ratio")


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
    for pattern in AT_MOST_ONE:
        for path, value in values_at(config, pattern):
            if value > 1:
                problems.append(f"{path} = {value} must be <= 1")
    problems += _check_model(config)
    problems += _check_run(config)
    problems += _check_datasets(config)
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
    if config.mode in ("both", "explore") and model.max_response_tokens is None:
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
    if algorithm.algorithm_type in GROUP_ALGORITHMS and algorithm.repeat_times <= 1:
        problems.append(
            f"algorithm.repeat_times = {algorithm.repeat_times}: {algorithm.algorithm_type} "
            "compares several rollouts of each task, so it needs repeat_times > 1"
        )
    teachers = config.explorer.auxiliary_models
    if _auxiliary_models(config) != ([],) and (len(teachers) != 1 or not teachers[0].model_path):
        problems.append(
            f"algorithm.algorithm_type = {algorithm.algorithm_type} distils from a teacher: set "
            f"explorer.auxiliary_models to one model with a model_path (got {len(teachers)})"
        )
    if config.synchronizer.sync_method == "memory" and config.mode != "both":
        problems.append(
            f"synchronizer.sync_method = memory needs mode both (trainer and explorer in one "
            f"run); with mode {config.mode} use checkpoint"
        )
    return problems


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
        if storage.storage_type == "file" and not storage.path:
            problems.append(f"{path}.path is required for storage_type file")
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


def warn_inert(config: Config) -> None:
    """Warn about every user-set key that this build accepts but does not use."""
    found = explicit_inert_values(config)
    if found:
        lines = "\n".join(f"  - {path} = {show(value)}: {reason}" for path, value, reason in found)
        logger.warning("These keys are accepted but have no effect here:\n%s", lines)
