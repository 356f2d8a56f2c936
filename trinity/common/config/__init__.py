"""Typed configuration: YAML (through OmegaConf) -> validated ``Config`` -> finalized ``Config``.

Typical use (what the launcher does)::

    config = apply_run_name(load_config("run.yaml", ["buffer.batch_size=8"]))
    for stage in config.stage_configs():
        stage = finalize(stage)               # trinity.preflight.derive
        save_resolved_config(stage, os.path.join(stage.checkpoint_job_dir, "config.yaml"))

Modules: ``schema_*.py`` declare the config's sections (docs/reference/configuration.md is
generated from them), ``verl.py`` the
veRL keys of ``trainer.trainer_config``, ``loader.py`` reads and writes YAML; the checks that
need only the config itself sit beside them (``gpus``, ``nodes``, ``lora_checks``,
``sync_checks``). What reads the registries of the packages above this
one (algorithm defaults, engine names, buffer components, monitors) is ``trinity.preflight``:
``derive.py`` derives unset values (``finalize``), ``support.py`` holds the support and range
tables that ``unsupported.py`` and ``validate.py`` check, and ``before_start.py`` is what
``trinity run`` checks before Ray starts (on what ``read_config`` could read).

How to add a new key
--------------------
1. Declare it once, in the section class of its YAML path (e.g. ``explorer.foo`` goes in
   ``ExplorerConfig`` in ``schema_explorer.py``)::

       foo: int = Field(3, ge=1, description="One line saying what it does.")

   The attribute name is the YAML key; unknown-key errors and their suggestions pick it up.
   Bounds go on the field (``ge``, ``gt``, ``le``): the error names the key and the bound,
   and the configuration reference reads them there.
2. If its default depends on other keys or on the machine, make it ``Optional[...] = None``
   ("unset") and derive it in ``trinity/preflight/derive.py`` with
   ``set_default(section, "foo", value)``, which never overrides a value the user wrote.
3. If only some values work yet, add a row to ``SUPPORTED`` in ``trinity/preflight/support.py``
   (a sampling parameter's range: ``SAMPLING``). If it is
   accepted for compatibility but has no effect, declare it with ``inert(..., reason=...)``
   instead of ``Field``. A check that reads a registry (names of algorithms, engines,
   components) belongs in ``trinity/preflight/`` too: nothing in ``common`` imports the
   packages that fill them.
4. A key that moved elsewhere goes in the section's ``MOVED_KEYS`` so the error says where.
"""

from trinity.common.config.base import ConfigError, ConfigModel
from trinity.common.config.config import Config, StageConfig
from trinity.common.config.loader import (
    apply_run_name,
    load_config,
    read_config,
    save_resolved_config,
)
from trinity.common.config.schema_algorithm import AlgorithmConfig, OptimizerConfig
from trinity.common.config.schema_buffer import (
    BufferConfig,
    ExplorerInput,
    FormatConfig,
    GenerationConfig,
    ReplayBufferConfig,
    StorageConfig,
    TaskSelectorConfig,
    TrainerInput,
)
from trinity.common.config.schema_explorer import (
    APIServerConfig,
    ExplorerConfig,
    InferenceModelConfig,
    SynchronizerConfig,
)
from trinity.common.config.schema_misc import (
    DataProcessorConfig,
    LogConfig,
    MonitorConfig,
    ServiceConfig,
)
from trinity.common.config.schema_model import ClusterConfig, LoRAConfig, ModelConfig
from trinity.common.config.schema_trainer import TrainerConfig
from trinity.common.config.verl import VerlTrainerConfig
from trinity.common.config.verl_mapping import effective_trainer_settings

__all__ = [
    "APIServerConfig",
    "AlgorithmConfig",
    "BufferConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "ConfigModel",
    "DataProcessorConfig",
    "ExplorerConfig",
    "ExplorerInput",
    "FormatConfig",
    "GenerationConfig",
    "InferenceModelConfig",
    "LoRAConfig",
    "LogConfig",
    "ModelConfig",
    "MonitorConfig",
    "OptimizerConfig",
    "ReplayBufferConfig",
    "ServiceConfig",
    "StageConfig",
    "StorageConfig",
    "SynchronizerConfig",
    "TaskSelectorConfig",
    "TrainerConfig",
    "TrainerInput",
    "VerlTrainerConfig",
    "apply_run_name",
    "effective_trainer_settings",
    "load_config",
    "read_config",
    "save_resolved_config",
]
