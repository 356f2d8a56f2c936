"""Earlier releases' names: what a config written for Trinity-RFT 0.1.1 .. 0.5.2 means now.

DESIGN decision 20: a user's config from any release is read as written. Before validation,
``legacy_read.read_earlier_names`` applies these tables to the config and to each stage (a
stage is a partial config):

- ``RENAMED``: an earlier key read as its current one (one log line says the current name);
- ``RENAMED_VALUES``: earlier values of a key read as their current ones (the same line);
- ``DROPPED``: a key that means nothing here, removed with one line saying what it did and
  why it does nothing here (ignoring it leaves a run as the original ran it);
- ``REFUSED``: a key whose meaning is not built, so ignoring it would change results: an
  error naming it and what to write instead.

A path is dotted; ``*`` is any item of a list or entry of a mapping; ``<storage>.`` stands for
each place a dataset is configured (``STORAGE_PLACES``). ``until`` is the last release whose
documentation used the earlier form. docs/reference/earlier-releases.md is generated from
these tables (docs/gen_reference.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

# Every place a dataset (a StorageConfig) sits, in the forms earlier releases wrote it.
STORAGE_PLACES = (
    "buffer.explorer_input.taskset",
    "buffer.explorer_input.tasksets.*",
    "buffer.explorer_input.eval_tasksets.*",
    "buffer.trainer_input.experience_buffer",
    "buffer.trainer_input.auxiliary_buffers.*",
    "buffer.trainer_input.sft_warmup_dataset",
    "buffer.explorer_output",
)

# (path, value) -> the value at another path of the same config (a stage falls back to the
# whole config), as the file wrote it.
Lookup = Callable[[str], Any]
Convert = Callable[[Any, Lookup], Any]


@dataclass(frozen=True)
class Renamed:
    """An earlier key read as ``new`` (its value through ``convert``, described by ``how``).

    Both set: the same value is read once; different values are an error naming both,
    unless ``new_wins`` (the original read only the new key when both were set).
    """

    new: str
    until: str
    convert: Optional[Convert] = None
    how: str = ""
    new_wins: bool = False


@dataclass(frozen=True)
class Dropped:
    """A key that means nothing here: ``did`` is what it did, ``why`` why it does nothing."""

    until: str
    did: str
    why: str


@dataclass(frozen=True)
class Refused:
    """A key whose meaning is not built: ``why`` says so and what to write instead."""

    until: str
    why: str


def _per_engine(total: Any, get: Lookup) -> int:
    """0.1.1's runner_num counted every runner; runner_per_model counts those of one engine."""
    engines = get("explorer.rollout_model.engine_num") or 1
    return max(1, math.ceil(int(total) / int(engines)))


def _betas(index: int) -> Convert:
    """veRL's optim.beta1 / beta2 (0.1.1) -> one side of optim.betas, the other as written."""

    def convert(value: Any, get: Lookup) -> Tuple[float, float]:
        prefix = "trainer.trainer_config.actor_rollout_ref.actor.optim."
        pair = [get(prefix + "beta1"), get(prefix + "beta2")]
        defaults = (0.9, 0.999)
        return tuple(defaults[i] if v is None else float(v) for i, v in enumerate(pair))

    return convert


_ACTOR = "trainer.trainer_config.actor_rollout_ref.actor"
_VERL_TRAINER = "trainer.trainer_config.trainer"
_REPLAY = "replay_buffer"

RENAMED: Dict[str, Renamed] = {
    "explorer.runner_num": Renamed(
        "explorer.runner_per_model",
        "0.1.1",
        _per_engine,
        "runner_num counted the runners of all engines: divided by "
        "explorer.rollout_model.engine_num, rounded up",
        new_wins=True,
    ),
    "explorer.eval_on_latest_checkpoint": Renamed("explorer.bench_on_latest_checkpoint", "0.1.1"),
    # 0.1.1 copied these into the veRL actor; trainer_config carries them on (verl_mapping.py)
    "trainer.actor_use_kl_loss": Renamed(f"{_ACTOR}.use_kl_loss", "0.1.1"),
    "trainer.actor_kl_loss_coef": Renamed(f"{_ACTOR}.kl_loss_coef", "0.1.1"),
    "trainer.actor_entropy_coef": Renamed(f"{_ACTOR}.entropy_coeff", "0.1.1"),
    "trainer.actor_clip_ratio": Renamed(f"{_ACTOR}.clip_ratio", "0.1.1"),
    "trainer.actor_grad_clip": Renamed("trainer.grad_clip", "0.1.1"),
    "algorithm.gamma": Renamed("trainer.trainer_config.algorithm.gamma", "0.1.1"),
    "algorithm.lam": Renamed("trainer.trainer_config.algorithm.lam", "0.1.1"),
    **{
        f"{optim}.warmup_style": Renamed(f"{optim}.lr_scheduler_type", "0.3.1")
        for optim in (
            "algorithm.optimizer",
            f"{_ACTOR}.optim",
            "trainer.trainer_config.critic.optim",
        )
    },
    "model.enable_thinking": Renamed("explorer.rollout_model.enable_thinking", "0.5.2"),
    f"{_ACTOR}.optim.beta1": Renamed(
        f"{_ACTOR}.optim.betas", "0.1.1", _betas(0), "betas = [beta1, beta2]"
    ),
    f"{_ACTOR}.optim.beta2": Renamed(
        f"{_ACTOR}.optim.betas", "0.1.1", _betas(1), "betas = [beta1, beta2]"
    ),
    "<storage>.use_priority_queue": Renamed(f"<storage>.{_REPLAY}.enable", "0.3.1"),
    "<storage>.reuse_cooldown_time": Renamed(f"<storage>.{_REPLAY}.reuse_cooldown_time", "0.3.1"),
    "<storage>.replay_buffer_kwargs.priority_fn": Renamed(
        f"<storage>.{_REPLAY}.priority_fn", "0.3.1"
    ),
    "<storage>.replay_buffer_kwargs": Renamed(f"<storage>.{_REPLAY}.priority_fn_args", "0.3.1"),
}

# Earlier values of a key -> the current ones. The original also read the values of these
# keys in any case (FILE, Nccl), so a value differing only in case is read in lower case.
RENAMED_VALUES: Dict[str, Dict[str, str]] = {
    "synchronizer.sync_style": {
        "dynamic_by_explorer": "explorer_driven",
        "dynamic_by_trainer": "trainer_driven",
    },
    "synchronizer.sync_method": {"online": "nccl", "offline": "checkpoint"},
    "explorer.rollout_model.engine_type": {"vllm_async": "vllm"},
    "explorer.auxiliary_models.*.engine_type": {"vllm_async": "vllm"},
    "<storage>.storage_type": {},
    "<storage>.format.prompt_type": {},
    "trainer.save_strategy": {},
}
# Where each earlier value was last documented (docs table).
VALUES_UNTIL = {"dynamic_by_explorer": "0.5.0", "dynamic_by_trainer": "0.5.0"}
VALUES_UNTIL.update({"online": "0.1.1", "offline": "0.1.1", "vllm_async": "0.3.1"})

_NO_RETRY = (
    "a database call here is not retried: the buffer has one writer per table, and an error "
    "stops the run naming the database"
)
_DJ_SERVER = (
    "0.1.1's Data-Juicer data-workflow server, which ran only with "
    "data_processor.data_workflow_url set"
)
_SET_FROM = "Trinity-RFT overwrote it with {key} in every release; {key} sets it here too"
_VERL_LOOP = "veRL's own training loop, which Trinity-RFT never ran"


def _overwritten(key: str, until: str = "0.5.2") -> Dropped:
    return Dropped(until, f"veRL's copy of {key}", _SET_FROM.format(key=key))


DROPPED: Dict[str, Dropped] = {
    "buffer.max_retry_times": Dropped("0.2.0", "retries of a failed SQL buffer call", _NO_RETRY),
    "buffer.max_retry_interval": Dropped(
        "0.2.0", "seconds between retries of a failed SQL buffer call", _NO_RETRY
    ),
    "<storage>.max_retry_times": Dropped("0.5.2", "retries of a failed SQL call", _NO_RETRY),
    "<storage>.max_retry_interval": Dropped(
        "0.5.2", "seconds between retries of a failed SQL call", _NO_RETRY
    ),
    **{
        f"{place}.total_epochs": Dropped(
            "0.5.2",
            "passes over the dataset, which the original set from buffer.total_epochs",
            "buffer.total_epochs sets it (an auxiliary buffer's own total_epochs is read)",
        )
        for place in STORAGE_PLACES
        if place != "buffer.trainer_input.auxiliary_buffers.*"
    },
    "<storage>.total_steps": _overwritten("buffer.total_steps"),
    "<storage>.schema_type": Dropped(
        "0.5.2",
        "the row schema (sft, dpo, experience), which the original derived from the algorithm",
        "the reader takes the schema from where the data is read (auxiliary buffers and the "
        "sft algorithm: SFT rows; dpo: pairs)",
    ),
    "<storage>.index": Dropped(
        "0.5.2",
        "the row to start reading at, restored from a checkpoint",
        "a resumed run restores its read position from the checkpoint itself",
    ),
    "<storage>.wrap_in_ray": Dropped(
        "0.5.2", "whether a buffer ran as a Ray actor", "the buffer's process layout is fixed"
    ),
    "<storage>.ray_namespace": Dropped(
        "0.5.2", "the Ray namespace of a buffer's actor", "ray_namespace sets the run's one"
    ),
    "<storage>.capacity": Dropped(
        "0.5.2",
        "how many experiences a queue held in memory",
        "the queue is kept in a database, so it has no in-memory capacity",
    ),
    "<storage>.algorithm_type": _overwritten("algorithm.algorithm_type", "0.1.1"),
    "<storage>.task_type": Dropped(
        "0.1.1", "train or eval, set by the original", "a taskset's list says which it is"
    ),
    "algorithm.use_token_level_loss": Dropped(
        "0.2.0",
        "declared but not read by the trainer in 0.2.0",
        "loss aggregation is algorithm.loss_agg_mode",
    ),
    "explorer.rollout_model.use_v1": Dropped(
        "0.5.2", "vLLM's V1 or V0 engine", "vLLM's library here runs its V1 engine (V0 is gone)"
    ),
    "explorer.auxiliary_models.*.use_v1": Dropped(
        "0.5.2", "vLLM's V1 or V0 engine", "vLLM's library here runs its V1 engine (V0 is gone)"
    ),
    "explorer.rollout_model.enable_log_requests": Dropped(
        "0.5.2",
        "vLLM logging every request",
        "requests are not logged one by one; enable_history records model calls",
    ),
    "explorer.auxiliary_models.*.enable_log_requests": Dropped(
        "0.5.2",
        "vLLM logging every request",
        "requests are not logged one by one; enable_history records model calls",
    ),
    "explorer.rollout_model.bundle_indices": _overwritten("the run's GPU placement", "0.1.1"),
    "trainer.enable_preview": Dropped(
        "0.5.2",
        "a preview of experiences in the wandb monitor",
        "experiences are kept in the buffer database; monitors get metrics only",
    ),
    "buffer.explorer_output": Dropped(
        "0.2.0",
        "the buffer the explorer wrote to when a 0.2.0 experience pipeline stood between it "
        "and the trainer",
        "the explorer writes to buffer.trainer_input.experience_buffer, and "
        "data_processor.experience_pipeline transforms experiences on the way",
    ),
    "cluster.ray_address": Dropped(
        "0.4.0",
        "the Ray cluster to join",
        "trinity run joins the cluster in RAY_ADDRESS, or starts one on this machine",
    ),
    "log.save_dir": Dropped(
        "0.3.0", "the log folder, derived from the job dir", "logs go to <job dir>/log"
    ),
    "monitor.cache_dir": _overwritten("<job dir>/monitor", "0.1.1"),
    "synchronizer.wait_for_checkpoint": Dropped(
        "0.3.1", "declared, marked 'to be used', never read", "nothing read it"
    ),
    "group": Dropped(
        "0.5.2",
        "a folder between project and name in the job dir, and the wandb group",
        "the job dir is <checkpoint_root_dir>/<project>/<name>; for wandb set "
        "monitor.monitor_args.group",
    ),
    "data_processor.experience_pipeline.save_input": Dropped(
        "0.5.2",
        "a copy of the pipeline's input experiences at input_save_path",
        "the pipeline's input is not copied; the experience buffer holds what the trainer read",
    ),
    "data_processor.experience_pipeline.input_save_path": Dropped(
        "0.5.2",
        "where save_input copied the pipeline's input experiences",
        "the pipeline's input is not copied",
    ),
    **{
        f"data_processor.{key}": Dropped(
            "0.1.1", f"settings of {_DJ_SERVER}", "that server is gone"
        )
        for key in (
            "source_data_path",
            "format",
            "load_kwargs",
            "dj_config_path",
            "dj_process_desc",
            "agent_model_name",
            "agent_model_config",
            "clean_strategy",
            "min_size_ratio",
            "min_priority_score",
            "priority_weights",
            "data_dist",
            "db_url",
            "max_retry_times",
            "max_retry_interval",
        )
    },
    f"{_ACTOR}.ppo_mini_batch_size": _overwritten("buffer.train_batch_size"),
    "trainer.trainer_config.critic.ppo_mini_batch_size": _overwritten("buffer.train_batch_size"),
    f"{_ACTOR}.checkpoint.contents": Dropped(
        "0.2.0",
        "what a checkpoint holds",
        "checkpoints always hold model, optimizer and extra state",
    ),
    f"{_ACTOR}.use_uid": Dropped(
        "0.1.1",
        "pairwise OPMD's grouping by task id",
        "pairwise_opmd is not built; opmd groups by task",
    ),
    "trainer.trainer_config.custom_reward_function": Dropped(
        "0.1.1",
        "veRL's reward function file",
        "rewards come from the workflow and buffer.explorer_input.default_reward_fn_type "
        "(the original's trainer did not read it either)",
    ),
    f"{_VERL_TRAINER}.project_name": _overwritten("project"),
    f"{_VERL_TRAINER}.experiment_name": _overwritten("name"),
    f"{_VERL_TRAINER}.default_local_dir": _overwritten("checkpoint_root_dir"),
    f"{_VERL_TRAINER}.nnodes": _overwritten("cluster.node_num"),
    f"{_VERL_TRAINER}.n_gpus_per_node": _overwritten("cluster.gpu_per_node"),
    f"{_VERL_TRAINER}.save_freq": _overwritten("trainer.save_interval"),
    f"{_VERL_TRAINER}.total_training_steps": _overwritten("buffer.total_steps"),
    f"{_VERL_TRAINER}.sync_freq": _overwritten("synchronizer.sync_interval"),
    f"{_VERL_TRAINER}.total_epochs": Dropped(
        "0.5.2", f"epochs of {_VERL_LOOP}", "buffer.total_epochs sets the run's epochs"
    ),
    f"{_VERL_TRAINER}.val_before_train": Dropped(
        "0.5.2",
        f"validation at step 0 in {_VERL_LOOP}",
        "the explorer evaluates: explorer.eval_on_startup",
    ),
    f"{_VERL_TRAINER}.test_freq": Dropped(
        "0.5.2", f"validation interval of {_VERL_LOOP}", "explorer.eval_interval sets it"
    ),
    f"{_VERL_TRAINER}.logger": Dropped(
        "0.5.2", f"the loggers of {_VERL_LOOP}", "monitor.monitor_type picks the metrics sink"
    ),
}

_SERVER_02 = (
    "the 0.2.0 form of a data pipeline, run by a data-processor server at "
    "data_processor.data_processor_url, which is not built; write the pipeline as "
    "data_processor.{section}.operators (docs/guides/data-pipelines.md)"
)

REFUSED: Dict[str, Refused] = {
    "data_processor.data_workflow_url": Refused(
        "0.1.1",
        "it ran 0.1.1's Data-Juicer data-workflow server, which is not built; write the "
        "processing as data_processor.task_pipeline.operators (docs/guides/data-pipelines.md)",
    ),
    "data_processor.data_processor_url": Refused(
        "0.2.0", _SERVER_02.format(section="task_pipeline or experience_pipeline")
    ),
    **{
        f"data_processor.{section}.{key}": Refused("0.2.0", _SERVER_02.format(section=section))
        for section in ("task_pipeline", "experience_pipeline")
        for key in (
            "input_buffers",
            "output_buffer",
            "format",
            "dj_config_path",
            "dj_process_desc",
            "agent_model_name",
            "clean_strategy",
            "min_size_ratio",
            "min_priority_score",
            "priority_weights",
            "data_dist",
            "reward_shaping",
        )
    },
    "data_processor.task_pipeline.config_path": Refused(
        "0.3.1",
        "a Data-Juicer recipe in place of operators is not supported yet; list the recipe's "
        "operators under data_processor.task_pipeline.operators",
    ),
}

_MIX_WEIGHTS = (
    "batch sizes the original's mix loss weighted each micro-batch's expert and RL rows by",
    "each side of the mix loss is averaged over its own rows of the batch, which needs none",
)

# (algorithm component key, its name) -> arguments the original's component of that name
# took that mean nothing to the component here; dropped with one line before the arguments
# are checked (trinity/preflight/derive.py).
DROPPED_ARGS: Dict[Tuple[str, str], Dict[str, Dropped]] = {
    ("policy_loss_fn", "mix"): {
        arg: Dropped("0.5.2", *_MIX_WEIGHTS)
        for arg in (
            "ngpus_trainer",
            "ppo_mini_batch_size",
            "ppo_micro_batch_size_per_gpu",
            "use_dynamic_bsz",
            "train_batch_size_usual",
            "train_batch_size_expert",
            "read_batch_size_usual",
            "read_batch_size_expert",
            "repeat_times",
        )
    },
}


def _sft_agg(token_level: Any, get: Lookup) -> str:
    """``use_token_level_loss_in_sft``: the SFT term's mean over all tokens of the batch, or
    (false) each sequence's mean, then their mean."""
    return "token-mean" if token_level else "seq-mean-token-mean"


_SFT_TOKEN_LEVEL = Renamed(
    "sft_loss_agg_mode",
    "0.3.0",
    _sft_agg,
    "true: token-mean, false: seq-mean-token-mean",
)

# (algorithm component key, its name) -> arguments the original's component of that name
# took under an earlier name: read as the current one with one line (trinity/preflight/derive.py).
RENAMED_ARGS: Dict[Tuple[str, str], Dict[str, Renamed]] = {
    ("policy_loss_fn", "mix"): {"use_token_level_loss_in_sft": _SFT_TOKEN_LEVEL},
    ("policy_loss_fn", "mix_chord"): {"use_token_level_loss_in_sft": _SFT_TOKEN_LEVEL},
}
