"""The tables of what this build supports and what can possibly run (``unsupported.py`` and
``validate.py`` read them).

``SUPPORTED`` maps a key path to the values this build can run; ``*`` in a path matches every
item of a list or mapping. Bounds of a single value are not here: a field declares its own
(``Field(ge=...)``, ``gt``, ``le``), checked when the config is read. Growing a feature
means widening its row, nothing else. ``SAMPLING`` holds the ranges of sampling parameters,
checked on ``model`` and on every taskset's ``rollout_args``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

from pydantic import BaseModel

from trinity.algorithm import (
    ADVANTAGE_FN,
    ALGORITHM_TYPE,
    ENTROPY_LOSS_FN,
    KL_FN,
    POLICY_LOSS_FN,
    SAMPLE_STRATEGY,
)
from trinity.buffer.storages import STORAGES, data_kinds, row_kinds, store_kinds
from trinity.common.config.base import join_path
from trinity.common.config.config import Config
from trinity.common.config.schema_buffer import MAX_TOP_LOGPROBS
from trinity.common.registry import Registry
from trinity.engine import DEFAULT_ENGINE, ENGINES
from trinity.monitor import MONITORS


def _registered_algorithms(config: Config) -> Tuple[Any, ...]:
    return tuple(ALGORITHM_TYPE.names())


def _registered_engines(config: Config) -> Tuple[Any, ...]:
    # Unset resolves to the default engine, listed first (derive.py); a plugin's engine is
    # registered by the time configs are checked (plugins load first).
    names = sorted(ENGINES.names(), key=lambda name: name != DEFAULT_ENGINE)
    return (None, *names)


def _auxiliary_engines(config: Config) -> Tuple[Any, ...]:
    # The tinker engine samples the adapter a Tinker run trains: the rollout model only.
    return tuple(name for name in _registered_engines(config) if name != "tinker")


def _tinker_modes(config: Config) -> Tuple[Any, ...]:
    # A Tinker run trains in the service: mode both (with engine_type tinker) or train.
    return (False, True) if config.mode in ("both", "train") else (False,)


def _registered_monitors(config: Config) -> Tuple[Any, ...]:
    # A plugin's sink is registered by the time configs are checked (plugins load first).
    return tuple(MONITORS.names())


# Storages: a plugin's kind is registered by the time configs are checked (plugins load
# first); what each kind can be is asked of it (trinity/buffer/storages.py).
def _row_storages(config: Config) -> Tuple[Any, ...]:
    return tuple(row_kinds())


def _data_storages(config: Config) -> Tuple[Any, ...]:
    return tuple(data_kinds())


def _experience_buffer_storage(config: Config) -> Tuple[Any, ...]:
    # train mode reads SFT data (from files, ...); otherwise the explorer feeds the trainer a
    # queue, kept in a database (sql: the same queue, its table in the database at `path`).
    # A train run also reads the database a separate explore run writes (decoupled.py).
    # Bench reads no experiences: the training YAML's buffer is taken as it is.
    stores = store_kinds()
    if config.mode in ("train", "bench"):
        return tuple(sorted([*data_kinds(), *stores]))
    return tuple(stores)


def _replay_modes(config: Config) -> Tuple[Any, ...]:
    # The replay pool lives in the queue actor the trainer of a `both` run reads; the guide
    # gives replay_buffer to `queue` buffers only.
    storage = config.buffer.trainer_input.experience_buffer  # unset: the default queue
    name = storage.storage_type if storage is not None else None
    queue = name is None or (name in STORAGES and STORAGES.get(name).replays)
    if config.mode == "bench":  # trains nothing: the training YAML's setting is kept
        return (False, True)
    return (False, True) if config.mode in ("both", "colocate") and queue else (False,)


def algorithm_class(config: Config) -> Optional[type]:
    """The class ``algorithm.algorithm_type`` names; None for a name no plugin registered
    (reported by ``check_supported``), which the checks that need the class skip."""
    name = config.algorithm.algorithm_type
    return ALGORITHM_TYPE.get(name) if name in ALGORITHM_TYPE else None


def uses_teacher(config: Config) -> bool:
    """The algorithm distils from ``explorer.auxiliary_models[0]`` (``use_teacher``)."""
    return getattr(algorithm_class(config), "use_teacher", False)


_STORAGES = (
    "buffer.explorer_input.tasksets.*",
    "buffer.explorer_input.eval_tasksets.*",
    "buffer.trainer_input.experience_buffer",
    "buffer.trainer_input.auxiliary_buffers.*",
)
_VERL_PARTS = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
_VERL_MODELS = ("actor_rollout_ref.actor", "critic")
_MULTIMODAL = "multimodal tasks (images and videos in the prompt) are not built"
_MEGATRON = "the Megatron backend is not built; the trainer shards with FSDP2"

# SUPPORTED row -> why its other values do not run (said after "not supported yet"), or a
# function of the config saying it, for a row whose allowed values depend on the config.
NOT_BUILT: Dict[str, Union[str, Callable[[Config], str]]] = {
    **{
        f"{path}.format.{key}": _MULTIMODAL
        for path in _STORAGES
        for key in ("image_key", "video_key")
    },
    **{f"{path}.mm_data_kwargs": _MULTIMODAL for path in _STORAGES},
    **{f"trainer.trainer_config.{part}.megatron": _MEGATRON for part in _VERL_PARTS},
    **{f"trainer.trainer_config.{part}.strategy": _MEGATRON for part in _VERL_MODELS},
    "trainer.trainer_strategy": _MEGATRON,
    "model.tinker.enable": lambda config: (
        f"a Tinker run is mode both (with engine_type tinker) or train, not {config.mode}"
    ),
    "explorer.auxiliary_models.*.engine_type": (
        "the tinker engine serves only the rollout model (the adapter a Tinker run trains)"
    ),
}


# algorithm key -> the registry of the components it names
COMPONENT_REGISTRIES: Dict[str, Registry] = {
    "sample_strategy": SAMPLE_STRATEGY,
    "advantage_fn": ADVANTAGE_FN,
    "policy_loss_fn": POLICY_LOSS_FN,
    "kl_penalty_fn": KL_FN,
    "kl_loss_fn": KL_FN,
    "entropy_loss_fn": ENTROPY_LOSS_FN,
}

Allowed = Union[Tuple[Any, ...], Callable[[Config], Tuple[Any, ...]]]

SUPPORTED: Dict[str, Allowed] = {
    "mode": ("both", "colocate", "train", "explore", "bench", "serve"),
    "algorithm.algorithm_type": _registered_algorithms,
    # veRL's bypass mode (and its policy-gradient loss): only the decoupled mode is built
    "algorithm.rollout_correction.bypass_mode": (False,),
    "algorithm.rollout_correction.use_policy_gradient": (False,),
    "model.lora_configs.*.lora_dtype": ("auto", "float32", "bfloat16", "float16"),
    "model.rope_scaling": (None,),
    "model.rope_theta": (None,),
    "model.tinker.enable": _tinker_modes,
    # multimodal tasks (Trinity-RFT 0.3+): images and videos in the prompt
    **{f"{path}.format.{key}": (None,) for path in _STORAGES for key in ("image_key", "video_key")},
    **{f"{path}.mm_data_kwargs": (None, {}) for path in _STORAGES},
    # the Megatron backend (Trinity-RFT 0.3+); FSDP2 is the trainer's only one
    **{f"trainer.trainer_config.{part}.megatron": (None,) for part in _VERL_PARTS},
    **{f"trainer.trainer_config.{part}.strategy": ("fsdp", "fsdp2") for part in _VERL_MODELS},
    "buffer.explorer_input.tasksets.*.storage_type": _row_storages,
    "buffer.explorer_input.eval_tasksets.*.storage_type": _row_storages,
    "buffer.trainer_input.experience_buffer.storage_type": _experience_buffer_storage,
    "buffer.trainer_input.experience_buffer.replay_buffer.enable": _replay_modes,
    "buffer.trainer_input.auxiliary_buffers.*.storage_type": _data_storages,
    "explorer.rollout_model.engine_type": _registered_engines,
    "explorer.auxiliary_models.*.engine_type": _auxiliary_engines,
    "synchronizer.sync_method": (None, "memory", "checkpoint", "nccl"),
    "trainer.trainer_strategy": ("fsdp", "fsdp2"),
    # gradients and buffers stay in the fp32 of the master weights
    **{
        f"trainer.trainer_config.{section}.fsdp_config.mixed_precision.{key}": ("fp32", "float32")
        for section in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model")
        for key in ("reduce_dtype", "buffer_dtype")
    },
    "monitor.monitor_type": _registered_monitors,
}


def runnable_values(pattern: str) -> Tuple[Any, ...]:
    """The values of ``SUPPORTED[pattern]`` that run in at least one mode: a row that depends
    on the config is read for each runnable mode's defaults (what the studio offers)."""
    allowed = SUPPORTED[pattern]
    if not callable(allowed):
        return allowed
    values: list = []
    for mode in SUPPORTED["mode"]:
        values += [v for v in allowed(Config(mode=mode)) if v not in values]
    return tuple(values)


STORAGE_PATHS = _STORAGES


def _storage_names() -> Tuple[str, ...]:
    # The guide's file, queue and sql, and every plugin's kind: a registered kind that cannot
    # serve at a path (a plugin's rows as the queue of a `both` run) is not unknown there.
    return tuple(STORAGES.names())


# Name-valued keys (their values are registry names, not a fixed list in the schema) -> the
# names Trinity-RFT's configuration documents for them (or a function giving them). A value
# outside ``SUPPORTED`` that those documents name is a feature this build lacks ("not
# supported yet"); one it does not document names nothing ("unknown", with the closest
# supported name).
DOCUMENTED: Dict[str, Union[Tuple[str, ...], Callable[[], Tuple[str, ...]]]] = {
    # the guide's, and those of the original's releases (0.1.1: pairwise_opmd; 0.2-0.5: the rest)
    "algorithm.algorithm_type": (
        *("ppo", "grpo", "opmd", "dpo", "sft", "mix"),
        *("pairwise_opmd", "raft", "grpo_verl", "multi_step_grpo"),
    ),
    "explorer.rollout_model.engine_type": ("vllm", "tinker", "external"),
    "explorer.auxiliary_models.*.engine_type": ("vllm", "tinker", "external"),
    "monitor.monitor_type": ("wandb", "tensorboard", "mlflow"),
    **{f"{path}.storage_type": _storage_names for path in STORAGE_PATHS},
}

# Sampling parameter -> (whether a value is allowed, the allowed range in words).
# top_k: the transformers engine (trinity/engine/sampling.py), transformers and vLLM read 0 and -1
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
