"""Every derived value of a config, computed in one place.

``finalize`` never changes a value the user set: each derivation goes through
``set_default``, which only fills keys absent from the section's ``model_fields_set``.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from typing import List, Tuple

from trinity.algorithm import ALGORITHM_TYPE, AlgorithmType
from trinity.algorithm.algorithm import PairExperienceModel
from trinity.buffer import load_rows
from trinity.buffer.pipelines import build_task_pipeline
from trinity.buffer.row_checks import row_schema
from trinity.buffer.storages import read_as_rows, storage_kind
from trinity.common.config import gpus
from trinity.common.config.base import ConfigError, assign, is_set, set_default, unset
from trinity.common.config.config import (
    SYNCED_MODES,
    Config,
    external_models,
    rollouts_per_step,
)
from trinity.common.config.legacy import DROPPED_ARGS, RENAMED_ARGS
from trinity.common.config.schema_algorithm import AlgorithmConfig
from trinity.common.config.schema_buffer import StorageConfig
from trinity.common.config.schema_model import ModelConfig
from trinity.common.config.sync_checks import DYNAMIC_STYLES
from trinity.common.config.verl_mapping import (
    carry_verl_arguments,
    carry_verl_names,
    carry_verl_settings,
)
from trinity.common.weights import collective_backend
from trinity.engine import DEFAULT_ENGINE
from trinity.explorer.bench import bench_steps
from trinity.preflight.api_judge import derive_api_judge
from trinity.preflight.model_folders import chat_template_of
from trinity.preflight.support import COMPONENT_REGISTRIES, algorithm_class
from trinity.preflight.tinker_checks import derive_tinker
from trinity.preflight.unsupported import check_supported, not_naming, set_aside
from trinity.preflight.validate import check_consistency, storages_of, warn_inert

logger = logging.getLogger("trinity.config")


def finalize(config: Config) -> Config:
    """Check support, derive every unset value, check consistency; returns a new Config.

    Raises ``ConfigError`` listing every problem of a stage at once: first everything this
    build does not support, then everything that cannot be derived or cannot run.
    """
    unsupported = check_supported(config)
    config, problems = derive(config)
    if problems:
        header = "Invalid configuration"
        if any("not supported yet" in problem for problem in unsupported):
            header = "Configuration uses features that are not built yet"
        raise ConfigError(problems, header, incomplete=bool(unsupported))
    warn_inert(config)
    return config


def derive(config: Config) -> Tuple[Config, List[str]]:
    """``finalize`` without raising: the derived copy and its problems.

    A value this build does not support is reported and replaced in the copy by one it
    supports (``unsupported.set_aside``), so that everything else is still derived and
    checked; the lines that mention a key set aside are dropped, being about the
    replacement. The pre-start checks (``before_start.py``) go on with the copy so that one
    run of ``trinity run`` reports every problem.
    """
    config = config.model_copy(deep=True)
    _ignore_sync_keys(config)  # before the support check: an ignored value is not refused
    unsupported, keys = set_aside(config)
    problems: List[str] = []
    _derive_run(config)
    _derive_external(config)
    derive_tinker(config)
    _derive_from_machine(config)
    problems += _derive_algorithm(config)
    problems += carry_verl_settings(config)
    problems += _derive_model(config)
    problems += _derive_buffer(config)
    problems += derive_api_judge(config)  # after _derive_buffer names each taskset's workflow
    problems += check_consistency(config)
    return config, unsupported + not_naming(problems, keys)


def _derive_run(config: Config) -> None:
    set_default(config, "ray_namespace", f"{config.project}/{config.name}")
    sync = config.synchronizer
    if sync.sync_style in DYNAMIC_STYLES:  # one version more than fixed can reach (I + O - 1)
        set_default(sync, "max_staleness", sync.sync_interval + sync.sync_offset + 1)
    # Ray actors do not share the launcher's working directory: make the root absolute.
    assign(config, "checkpoint_root_dir", os.path.abspath(config.checkpoint_root_dir))


def _ignore_sync_keys(config: Config) -> None:
    """In a mode without a trainer and an explorer in one run (train, explore, bench), weights
    reach the explorer only as checkpoints on disk: a sync method or a dynamic sync style
    means nothing there (a config written for mode both, run with mode=train), so it is
    ignored with one line instead of refused."""
    if config.mode in SYNCED_MODES:
        return
    sync, ignored = config.synchronizer, []
    if sync.sync_method not in (None, "checkpoint"):
        ignored.append(f"synchronizer.sync_method = {sync.sync_method}")
        unset(sync, "sync_method")
    if sync.sync_style != "fixed":
        ignored.append(f"synchronizer.sync_style = {sync.sync_style}")
        unset(sync, "sync_style")
    if ignored:
        logger.warning(
            "%s: ignored in mode %s, which syncs no weights within the run (a separate "
            "explore run loads the trainer's checkpoints)",
            ", ".join(ignored),
            config.mode,
        )


def _derive_external(config: Config) -> None:
    """``external_model.enable: true`` and ``engine_type: external`` say the same; each fills
    the other when unset (two set values that disagree are reported by validate.py)."""
    for _, _, served, external in external_models(config):
        if external.enable:
            set_default(served, "engine_type", "external")
        elif served.engine_type == "external":
            set_default(external, "enable", True)


def _derive_from_machine(config: Config) -> None:
    """Unset keys whose guide defaults assume GPUs resolve to what this machine can run."""
    rollout = config.explorer.rollout_model
    detected = gpus.detect_gpu_count()
    # colocate is a one-GPU mode: on a machine with several it takes the first
    set_default(
        config.cluster, "gpu_per_node", min(detected, 1) if config.mode == "colocate" else detected
    )
    for served in [rollout, *config.explorer.auxiliary_models]:
        if served.engine_type is None:  # not made external by _derive_external
            set_default(served, "engine_type", DEFAULT_ENGINE)
    # On a GPU engines and trainer compute in bf16 (the trainer over fp32 master weights);
    # on CPU bf16 is slow, so both stay fp32 unless the user asks.
    gpu = config.cluster.gpu_per_node > 0
    for served in [rollout, *config.explorer.auxiliary_models]:
        set_default(served, "dtype", "bfloat16" if gpu else "float32")
    verl = config.trainer.trainer_config
    for section in (verl.actor_rollout_ref.actor, verl.actor_rollout_ref.ref, verl.critic.model):
        set_default(section.fsdp_config.mixed_precision, "param_dtype", "bf16" if gpu else "fp32")
    sync_method = "memory" if config.mode in ("both", "colocate", "serve") else "checkpoint"
    set_default(config.synchronizer, "sync_method", sync_method)
    method = config.synchronizer.sync_method
    if method == "nccl":  # the value names the method; the devices pick the backend
        method += f" (a {collective_backend(gpu)} broadcast{'' if gpu else ': no GPU'})"
    logger.info(
        "Resolved for this machine: cluster.gpu_per_node=%s explorer.rollout_model.engine_type=%s "
        "explorer.rollout_model.dtype=%s synchronizer.sync_method=%s",
        config.cluster.gpu_per_node,
        rollout.engine_type,
        rollout.dtype,
        method,
    )


def _derive_algorithm(config: Config) -> List[str]:
    """The algorithm type's defaults fill unset keys, the base ``AlgorithmType``'s the keys a
    plugin's ``default_config`` leaves out; each ``*_args`` merges over its defaults."""
    algorithm = config.algorithm
    problems = carry_verl_names(config)
    problems += _algorithm_defaults(config)
    carried, notes = carry_verl_arguments(config, _takes)
    problems += carried
    earlier = _rename_earlier_arguments(config.algorithm)
    for note in notes + earlier + _drop_earlier_arguments(config.algorithm):
        logger.warning("%s", note)
    for key, registry in COMPONENT_REGISTRIES.items():
        name = getattr(algorithm, key)
        if name is None:
            continue
        try:
            component = registry.get(name)
        except KeyError as exc:
            problems.append(f"algorithm.{key} = {name}: {exc.args[0]}")
            continue
        defaults = dict(component.default_args())
        if "loss_agg_mode" in defaults:  # one setting for every loss unless its args say otherwise
            defaults["loss_agg_mode"] = algorithm.loss_agg_mode
        assign(algorithm, f"{key}_args", {**defaults, **getattr(algorithm, f"{key}_args")})
    return problems


def _algorithm_defaults(config: Config) -> List[str]:
    """Fill the keys the algorithm type sets; none for an unknown type (reported)."""
    algorithm, algorithm_cls = config.algorithm, algorithm_class(config)
    if algorithm_cls is None:
        return []
    own = algorithm_cls.default_config()
    defaults = {**AlgorithmType.default_config(), **own}
    if not getattr(algorithm_cls, "use_advantage", True) and "advantage_fn" not in own:
        del defaults["advantage_fn"]  # never built (SFT): naming one would only mislead
    problems = []
    for key, value in defaults.items():
        if key not in AlgorithmConfig.model_fields:
            problems.append(
                f"algorithm.algorithm_type = {algorithm.algorithm_type}: its default_config() "
                f"sets unknown key '{key}'"
            )
            continue
        set_default(algorithm, key, value)
    return problems


def _rename_earlier_arguments(algorithm: AlgorithmConfig) -> List[str]:
    """Arguments an earlier release's component of the same name took under another name
    (``legacy.RENAMED_ARGS``): read as the current one (unless it is set too), one line each."""
    notes = []
    for (key, name), table in RENAMED_ARGS.items():
        args = dict(getattr(algorithm, f"{key}_args"))
        found = [arg for arg in table if arg in args]
        if getattr(algorithm, key) != name or not found:
            continue  # nothing to rename: the args stay as they were set (or derived)
        for old in found:
            renamed, value = table[old], args.pop(old)
            new = renamed.convert(value, args.get) if renamed.convert else value
            args.setdefault(renamed.new, new)
            notes.append(
                f"algorithm.{key}_args.{old} = {value} (Trinity-RFT {renamed.until} and "
                f"earlier) is read as algorithm.{key}_args.{renamed.new} = {args[renamed.new]}"
            )
        assign(algorithm, f"{key}_args", args)
    return notes


def _drop_earlier_arguments(algorithm: AlgorithmConfig) -> List[str]:
    """Arguments an earlier release's component of the same name took that mean nothing here
    (``legacy.DROPPED_ARGS``): removed, one line per component."""
    notes = []
    for (key, name), table in DROPPED_ARGS.items():
        args = getattr(algorithm, f"{key}_args")
        found = [arg for arg in table if arg in args and getattr(algorithm, key) == name]
        if not found:
            continue
        dropped = table[found[0]]
        shown = ", ".join(f"algorithm.{key}_args.{arg} = {args[arg]}" for arg in found)
        notes.append(
            f"{shown} (Trinity-RFT {dropped.until} and earlier: {dropped.did}) is not read "
            f"here: {dropped.why}"
        )
        assign(algorithm, f"{key}_args", {k: v for k, v in args.items() if k not in found})
    return notes


def _takes(key: str, name: str, argument: str) -> bool:
    """Whether the ``key`` component named ``name`` (``algorithm.policy_loss_fn: ppo``) has a
    constructor parameter ``argument``; an unknown name takes nothing (reported elsewhere)."""
    if key == "kl_penalty_fn" and argument == "kl_ctrl":
        return name != "none"  # the trainer pops kl_ctrl before building the penalty
    try:
        component = COMPONENT_REGISTRIES[key].get(name)
        return argument in inspect.signature(component).parameters
    except (KeyError, TypeError, ValueError):
        return False


def _derive_model(config: Config) -> List[str]:
    model, trainer, rollout = config.model, config.trainer, config.explorer.rollout_model
    problems = []
    if not model.critic_model_path:
        assign(model, "critic_model_path", model.model_path)
    # Trinity-RFT 0.1.1 wrote the token limits on the rollout model only: the policy's are
    # the rollout model's (and the rollout model's follow the policy's below otherwise)
    for key in ("max_model_len", "max_prompt_tokens", "max_response_tokens"):
        if getattr(model, key) is None and getattr(rollout, key) is not None:
            assign(model, key, getattr(rollout, key))
    if model.max_model_len is None:
        if model.max_prompt_tokens is None or model.max_response_tokens is None:
            problems.append(
                "model.max_model_len is unset and cannot be derived: set it, or set both "
                "model.max_prompt_tokens and model.max_response_tokens"
            )
        else:
            assign(model, "max_model_len", model.max_prompt_tokens + model.max_response_tokens)
    # None, not "unset": veRL's actor.ppo_max_token_len_per_gpu may have been carried here
    if model.max_model_len is not None and trainer.max_token_len_per_gpu is None:
        assign(trainer, "max_token_len_per_gpu", max(16384, model.max_model_len))
    _fit_token_budgets(config)
    if model.chat_template_path:
        problems += _read_chat_template(model)
    set_default(rollout, "model_path", model.model_path)
    set_default(rollout, "chat_template", model.custom_chat_template)
    # Auxiliary models keep their own chat template (another model's); limits as the policy's.
    for served in [rollout, *config.explorer.auxiliary_models]:
        for key in ("max_model_len", "max_prompt_tokens", "max_response_tokens"):
            set_default(served, key, getattr(model, key))
    return problems


def _fit_token_budgets(config: Config) -> None:
    """A packed micro-batch's token budget below ``model.max_model_len`` could not hold one
    full sequence: it is raised to ``max_model_len`` with one line, as the original did
    (a micro-batch then holds at least one whole sequence)."""
    max_len = config.model.max_model_len
    if max_len is None:
        return
    verl, prefix = config.trainer.trainer_config, "trainer.trainer_config"
    budgets = [
        (config.trainer, "max_token_len_per_gpu", "trainer"),
        (
            verl.actor_rollout_ref.ref,
            "log_prob_max_token_len_per_gpu",
            f"{prefix}.actor_rollout_ref.ref",
        ),
        (verl.critic, "ppo_max_token_len_per_gpu", f"{prefix}.critic"),
        (verl.critic, "forward_max_token_len_per_gpu", f"{prefix}.critic"),
    ]
    for section, key, where in budgets:
        value = getattr(section, key)
        if value is None or value >= max_len:
            continue
        logger.warning(
            "%s.%s = %s is less than model.max_model_len = %s: raised to %s so that a "
            "micro-batch holds one whole sequence (lower model.max_model_len to use less memory)",
            where,
            key,
            value,
            max_len,
            max_len,
        )
        setattr(section, key, max_len)


def _read_chat_template(model: ModelConfig) -> List[str]:
    """The guide: chat_template_path, when set, overrides custom_chat_template. A folder (a
    hub id resolves to one) lends its tokenizer's chat template, as TRL's key does."""
    path = model.chat_template_path
    if os.path.isdir(path):
        template = chat_template_of(path)
        if template is None:
            return [f"model.chat_template_path = {path}: the tokenizer there has no chat template"]
        assign(model, "custom_chat_template", template)
        return []
    try:
        with open(path, encoding="utf-8") as f:
            assign(model, "custom_chat_template", f.read())
    except OSError as exc:
        return [f"model.chat_template_path = {path}: {exc.strerror} ({os.path.abspath(path)})"]
    return []


def _derive_buffer(config: Config) -> List[str]:
    buffer = config.buffer
    problems = _derive_total_steps(config)
    trainer_input = buffer.trainer_input
    if trainer_input.experience_buffer is None and config.mode != "train":
        assign(
            trainer_input,
            "experience_buffer",
            StorageConfig(name="experience_buffer", storage_type="queue"),
        )
    elif trainer_input.experience_buffer is None:
        problems.append("buffer.trainer_input.experience_buffer is required in mode train")
    else:
        set_default(trainer_input.experience_buffer, "name", "experience_buffer")
    for key, storage in trainer_input.auxiliary_buffers.items():
        set_default(storage, "name", key)
    if config.model.custom_chat_template is not None:
        for _, storage in storages_of(config):
            set_default(storage.format, "chat_template", config.model.custom_chat_template)
    problems += _taskset_from_pipeline(config)
    tasksets = buffer.explorer_input.tasksets
    for index, storage in enumerate(tasksets):
        name = "taskset" if len(tasksets) == 1 else f"taskset_{index}"
        _derive_taskset(config, storage, name, is_eval=False, index=index)
    for index, storage in enumerate(buffer.explorer_input.eval_tasksets):
        _derive_taskset(config, storage, f"eval_taskset_{index}", is_eval=True, index=index)
    set_default(buffer, "train_batch_size", rollouts_per_step(config))
    return problems


def _taskset_from_pipeline(config: Config) -> List[str]:
    """``data_processor.task_pipeline.inputs``: the pipeline's output is the explorer's input,
    so the training taskset reads the input (the pipeline runs where a training taskset's rows
    are loaded, ``buffer/pipelines.py``); the taskset still says what its rows hold."""
    pipeline, key = config.data_processor.task_pipeline, "data_processor.task_pipeline.inputs"
    if pipeline is None or not pipeline.inputs:
        return []
    tasksets = config.buffer.explorer_input.tasksets
    if len(pipeline.inputs) > 1:
        return [f"{key}: more than one input is not supported yet; give one dataset path"]
    if not tasksets and config.mode == "train":
        return [
            f"{key} with no training taskset: processing the trainer's dataset (the experience "
            "buffer, as Trinity-RFT 0.3 did in mode train) is not supported yet; the pipeline "
            "feeds buffer.explorer_input.taskset"
        ]
    if len(tasksets) != 1:
        return [
            f"{key} feeds buffer.explorer_input.taskset: give exactly one training taskset "
            f"(its format says what the rows hold; {len(tasksets)} given)"
        ]
    (storage,), (path,) = tasksets, pipeline.inputs
    if storage.path is not None and storage.path != path:
        # Trinity-RFT 0.3 wrote the pipeline's output to the taskset's path and explored that
        # file; here the output goes to the explorer directly, so that path is not read.
        logger.warning(
            "buffer.explorer_input.taskset.path = %s is not read: the explorer reads the output "
            "of the task pipeline on %s = [%s] directly (Trinity-RFT 0.3 wrote that output to "
            "the taskset's path first)",
            storage.path,
            key,
            path,
        )
    if not storage_kind(storage).needs_path:
        return [f"{key}: the taskset's storage_type '{storage.storage_type}' reads no path"]
    assign(storage, "path", path)
    return []


def _derive_total_steps(config: Config) -> List[str]:
    buffer, trainer = config.buffer, config.trainer
    if buffer.total_steps is not None and trainer.total_steps is not None:
        if buffer.total_steps != trainer.total_steps:
            return [
                f"buffer.total_steps = {buffer.total_steps} and trainer.total_steps = "
                f"{trainer.total_steps} disagree; set one of them"
            ]
    elif buffer.total_steps is not None:
        assign(trainer, "total_steps", buffer.total_steps)
    elif trainer.total_steps is not None:
        assign(buffer, "total_steps", trainer.total_steps)
    return []


def _derive_taskset(
    config: Config, storage: StorageConfig, name: str, is_eval: bool, index: int
) -> None:
    explorer_input, model = config.buffer.explorer_input, config.model
    assign(storage, "is_eval", is_eval)
    set_default(storage, "name", name)
    set_default(storage, "repeat_times", 1 if is_eval else config.algorithm.repeat_times)
    workflow = explorer_input.default_workflow_type
    if is_eval and explorer_input.default_eval_workflow_type is not None:
        workflow = explorer_input.default_eval_workflow_type
    set_default(storage, "default_workflow_type", workflow)
    set_default(storage, "default_reward_fn_type", explorer_input.default_reward_fn_type)
    args = storage.rollout_args
    if is_set(args, "n") and args.n != storage.repeat_times:
        # the original overwrote n with the repeat times in every release
        logger.warning(
            "%s.rollout_args.n = %s is not read: the taskset's repeat_times (%s) is its samples "
            "per task",
            "buffer.explorer_input." + ("eval_tasksets" if is_eval else "tasksets") + f"[{index}]",
            args.n,
            storage.repeat_times,
        )
        unset(args, "n")
    set_default(args, "n", storage.repeat_times)
    set_default(args, "max_tokens", model.max_response_tokens)
    for key in ("temperature", "top_p", "top_k", "logprobs"):
        if getattr(model, key) is not None:
            set_default(args, key, getattr(model, key))


def planned_steps(config: Config) -> int:
    """Training steps of a finalized stage: ``total_steps``, else epochs over the dataset that
    drives it. Its rows are read as the checks before start read them (the same reader and
    columns), so ``load_rows``' cache answers and no file is read twice."""
    buf = config.buffer
    if config.mode == "bench":  # one evaluation per checkpoint
        return len(bench_steps(config))
    if buf.total_steps:
        return int(buf.total_steps)
    storage = buf.trainer_input.experience_buffer
    if config.mode == "train" and read_as_rows(storage, experience_buffer=True):  # SFT/DPO data
        paired = ALGORITHM_TYPE.get(config.algorithm.algorithm_type).schema is PairExperienceModel
        # the rows its reader keeps (skip_bad_rows drops the others)
        columns = row_schema(storage.format, "dpo" if paired else "sft")
        rows = len(load_rows(storage, columns=columns))
        per_step = buf.train_batch_size // 2 if paired else buf.train_batch_size  # DPO: pairs
        return max(1, math.ceil(rows * buf.total_epochs / per_step))
    pipeline = build_task_pipeline(config)  # the explorer explores only the rows it keeps
    loaded = [(load_rows(ts), ts) for ts in buf.explorer_input.tasksets]
    rows = sum(len(pipeline.apply(data, ts) if pipeline else data) for data, ts in loaded)
    if pipeline is not None:
        pipeline.close()
    explore_steps = math.ceil(rows * buf.total_epochs / buf.batch_size)
    # A train step may take less than an explore step makes (train_batch_size below
    # batch_size * repeat_times): then there are more train steps than explore steps.
    made = rollouts_per_step(config)
    return max(1, math.ceil(explore_steps * made / (buf.train_batch_size or made)))
