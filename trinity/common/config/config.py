"""The root ``Config`` and the ``stages`` it may run in sequence."""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Literal, Optional, Tuple

from pydantic import Field, field_validator

from trinity.common.config.base import (
    ConfigError,
    ConfigModel,
    Name,
    inert,
    repeated,
    validate_model,
)
from trinity.common.config.schema_algorithm import AlgorithmConfig
from trinity.common.config.schema_buffer import BufferConfig
from trinity.common.config.schema_explorer import ExplorerConfig, SynchronizerConfig
from trinity.common.config.schema_misc import (
    DataProcessorConfig,
    LogConfig,
    MonitorConfig,
    ServiceConfig,
)
from trinity.common.config.schema_model import ClusterConfig, ModelConfig
from trinity.common.config.schema_trainer import TrainerConfig

Mode = Literal["both", "train", "explore", "bench", "colocate", "serve"]
# Modes whose stage both explores (or serves) and trains: the only ones where weights sync.
SYNCED_MODES = ("both", "colocate", "serve")


class StageConfig(ConfigModel):
    """One entry of ``stages``: sections given here override the global ones key by key."""

    stage_name: Name = Field(description="Unique stage name; the run is named <name>_<stage_name>.")
    mode: Optional[Mode] = Field(None, description="Mode of this stage; unset: the global mode.")
    algorithm: Optional[AlgorithmConfig] = Field(None, description="Algorithm overrides.")
    buffer: Optional[BufferConfig] = Field(None, description="Buffer overrides.")
    explorer: Optional[ExplorerConfig] = Field(None, description="Explorer overrides.")
    trainer: Optional[TrainerConfig] = Field(None, description="Trainer overrides.")
    synchronizer: Optional[SynchronizerConfig] = Field(
        None,
        description=(
            "Synchronizer overrides. A stage that does not both explore and train ignores the "
            "global synchronizer section and reads only these."
        ),
    )


class Config(ConfigModel):
    """A whole run. Attribute names are the YAML keys (docs/reference/configuration.md)."""

    project: Name = Field("Trinity-RFT", description="Project name.")
    name: Name = Field("rft", description="Experiment name.")
    mode: Mode = Field("both", description="Which components run.")
    checkpoint_root_dir: str = Field(
        "./checkpoints", description="Everything lands in <checkpoint_root_dir>/<project>/<name>."
    )
    continue_from_checkpoint: bool = Field(
        True, description="Resume from the latest checkpoint; false: rename to <name>_<timestamp>."
    )
    ray_namespace: Optional[str] = Field(
        None, description="Ray namespace; unset: <project>/<name>."
    )
    ignore_validator_suggestions: bool = inert(
        False,
        description="Skip the GPU memory suggestions of the validator.",
        reason="the checks before start make no GPU memory suggestions, so there are none to "
        "skip (a stage that does not fit its GPUs fails with torch's out-of-memory error)",
    )
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="Algorithm.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model and token limits.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Nodes and GPUs.")
    buffer: BufferConfig = Field(default_factory=BufferConfig, description="Data.")
    explorer: ExplorerConfig = Field(default_factory=ExplorerConfig, description="Explorer.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Trainer.")
    synchronizer: SynchronizerConfig = Field(
        default_factory=SynchronizerConfig, description="Weight sync."
    )
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Metrics.")
    service: ServiceConfig = Field(default_factory=ServiceConfig, description="Services.")
    data_processor: DataProcessorConfig = Field(
        default_factory=DataProcessorConfig, description="Data pipelines."
    )
    log: LogConfig = Field(default_factory=LogConfig, description="Logging.")
    stages: List[StageConfig] = Field(
        default_factory=list, description="Stages run in sequence; empty: one stage."
    )

    @field_validator("stages")
    @classmethod
    def _unique_stage_names(cls, stages: List[StageConfig]) -> List[StageConfig]:
        duplicates = repeated([stage.stage_name for stage in stages])
        if duplicates:
            raise ValueError(f"stage_name must be unique, repeated: {duplicates}")
        return stages

    @property
    def checkpoint_job_dir(self) -> str:
        """``<checkpoint_root_dir>/<project>/<name>``: where this run writes everything."""
        return os.path.join(self.checkpoint_root_dir, self.project, self.name)

    def stage_configs(self) -> List[Config]:
        """One config per stage, each stage's sections deep-merged over the global ones.

        Call it on a loaded config before ``finalize`` (``trinity.preflight.derive``): each
        stage is finalized on its own, so derived values (train_batch_size, ray_namespace,
        ...) follow the stage.
        """
        if not self.stages:
            return [self]
        base = self.model_dump(exclude_unset=True, exclude={"stages"})
        configs, problems = [], []
        for stage in self.stages:
            overrides = stage.model_dump(exclude_unset=True, exclude={"stage_name"})
            merged = merge_stage(base, overrides)
            merged["name"] = f"{self.name}_{stage.stage_name}"
            if self.mode == "bench":  # benchmark the run of every stage, whatever it ran as
                merged["mode"] = "bench"
            if self.stage_mode(stage) not in SYNCED_MODES:
                # weights sync between a trainer and an explorer of the same stage: the
                # global section (written for the stages that have both) means nothing here
                merged["synchronizer"] = copy.deepcopy(overrides.get("synchronizer", {}))
            try:
                configs.append(validate_model(Config, merged))
            except ConfigError as exc:  # the stage's values and the global ones disagree
                problems += [f"stage '{stage.stage_name}': {p}" for p in exc.problems]
        if problems:
            raise ConfigError(problems)
        return configs

    def stage_mode(self, stage: StageConfig) -> str:
        """The mode ``stage`` runs in: its own, else the global one (every stage benchmarks
        in ``mode: bench``)."""
        return "bench" if self.mode == "bench" else stage.mode or self.mode

    def ignored_synchronizer(self) -> List[str]:
        """One line per stage that ignores a global ``synchronizer`` value (one other than the
        default): a stage that only trains or only explores has no weights to sync."""
        defaults = SynchronizerConfig()
        changed = [
            f"synchronizer.{key}={value}"
            for key, value in self.synchronizer.model_dump(exclude_unset=True).items()
            if value != getattr(defaults, key)
        ]
        if not changed:
            return []
        return [
            f"stage '{stage.stage_name}' (mode {self.stage_mode(stage)}) ignores "
            f"{', '.join(changed)}: weights sync only in a stage that both explores and "
            f"trains (stages.{index}.synchronizer sets this stage's own)"
            for index, stage in enumerate(self.stages)
            if self.stage_mode(stage) not in SYNCED_MODES
        ]


def merge_stage(base: Dict[str, Any], stage: Dict[str, Any]) -> Dict[str, Any]:
    """Deep-merge ``stage`` over ``base``: mappings merge key by key, anything else replaces.

    A stage that changes ``algorithm.algorithm_type`` does not inherit the global algorithm
    section: component choices of one algorithm (KL loss, advantage, repeat_times) are wrong
    for another, so the new algorithm starts from its own defaults.
    """
    merged = copy.deepcopy(base)
    new_algorithm = stage.get("algorithm", {}).get("algorithm_type")
    if new_algorithm is not None and new_algorithm != base.get("algorithm", {}).get(
        "algorithm_type", AlgorithmConfig().algorithm_type
    ):
        merged.pop("algorithm", None)
    return _deep_merge(merged, stage)


def _deep_merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = _deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


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


def rollouts_per_step(config: Config) -> int:
    """Experiences one explore step makes: ``batch_size`` x the training taskset's
    ``repeat_times`` (its own, else ``algorithm.repeat_times``); the largest where tasksets
    of different ``repeat_times`` are mixed."""
    tasksets = config.buffer.explorer_input.tasksets
    repeats = [ts.repeat_times or config.algorithm.repeat_times for ts in tasksets]
    return config.buffer.batch_size * max(repeats or [config.algorithm.repeat_times])


def rollout_temperature(config: Config) -> float:
    """The temperature training rollouts are sampled at, which the trainer divides logits by
    too: the first training taskset's ``rollout_args.temperature``; in ``mode: serve`` (no
    taskset: clients send the requests) ``model.temperature``, unset 1.0."""
    taskset = config.buffer.explorer_input.taskset
    if taskset is not None:
        return taskset.rollout_args.temperature
    return 1.0 if config.model.temperature is None else config.model.temperature
