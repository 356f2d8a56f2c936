"""``monitor``, ``service``, ``data_processor`` and ``log``."""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional

from pydantic import Field

from trinity.common.config.base import ConfigModel


class MonitorConfig(ConfigModel):
    """``monitor``: where metrics go."""

    monitor_type: str = Field(
        "tensorboard",
        description="The metrics sink: tensorboard, wandb, mlflow, or one a plugin registers.",
    )
    monitor_args: Dict[str, Any] = Field(
        default_factory=dict,
        description="The sink's arguments (wandb: base_url, api_key, entity, group, tags, "
        "notes, job_type; mlflow: uri, username, password), checked before start.",
    )
    enable_ray_timeline: bool = Field(False, description="Export a Ray timeline.json.")


class DataJuicerServiceConfig(ConfigModel):
    """``service.data_juicer``."""

    server_url: Optional[str] = Field(None, description="URL of the Data-Juicer server.")
    auto_start: bool = Field(False, description="Start the server automatically.")
    port: Optional[int] = Field(None, description="Port of an auto-started server.")


class ServiceConfig(ConfigModel):
    """``service``: external services."""

    data_juicer: Optional[DataJuicerServiceConfig] = Field(None, description="Data-Juicer service.")


class OperatorConfig(ConfigModel):
    """One operator of a data pipeline."""

    name: str = Field(description="Registered operator name.")
    args: Dict[str, Any] = Field(default_factory=dict, description="Operator arguments.")


class TaskPipelineConfig(ConfigModel):
    """``data_processor.task_pipeline``: preprocess tasksets."""

    num_process: int = Field(
        1, ge=1, description="Processes of its data_juicer operators (built-in operators use one)."
    )
    operators: List[OperatorConfig] = Field(default_factory=list, description="Operators in order.")
    inputs: List[str] = Field(
        default_factory=list,
        description="The dataset the training taskset reads (its path; one at most); unset: "
        "the pipeline runs on buffer.explorer_input.taskset's own path.",
    )
    target_fields: List[str] = Field(
        default_factory=list, description="Row fields making a task's text (default: the prompt)."
    )


class ExperiencePipelineConfig(ConfigModel):
    """``data_processor.experience_pipeline``: transform experiences before training."""

    operators: List[OperatorConfig] = Field(default_factory=list, description="Operators in order.")


class DataProcessorConfig(ConfigModel):
    """``data_processor``: task and experience pipelines."""

    task_pipeline: Optional[TaskPipelineConfig] = Field(None, description="Task pipeline.")
    experience_pipeline: Optional[ExperiencePipelineConfig] = Field(
        None, description="Experience pipeline."
    )


class LogConfig(ConfigModel):
    """``log``: Ray actor logging."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    group_by_node: bool = Field(
        False, description="Each actor logs to log/<its node's IP>/ instead of log/."
    )
