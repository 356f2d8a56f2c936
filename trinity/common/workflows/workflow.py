"""Task and Workflow: the plugin API for RL environments (spec/developer-guide.txt).

A ``Task`` is one row of a taskset plus the dataset-level settings that shape how it
runs; a ``Workflow`` turns one task into experiences using the ``ModelWrapper``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from trinity.common.config import FormatConfig, GenerationConfig
from trinity.common.experience import Experience
from trinity.common.registry import Registry

if TYPE_CHECKING:
    from trinity.common.models.model import ModelWrapper

WORKFLOWS: Registry = Registry("workflows", base=lambda: Workflow)


@dataclass
class Task:
    """One unit of exploration: a raw data row and how to run it."""

    workflow: Any = None  # registered workflow name (str) or a Workflow class
    reward_fn: Any = None  # registered reward function name, class, or None
    raw_task: Dict[str, Any] = field(default_factory=dict)  # the data row
    format_args: FormatConfig = field(default_factory=FormatConfig)
    rollout_args: GenerationConfig = field(default_factory=GenerationConfig)
    workflow_args: Dict[str, Any] = field(default_factory=dict)
    reward_fn_args: Dict[str, Any] = field(default_factory=dict)
    is_eval: bool = False
    taskset_name: str = ""
    index: int = 0  # position of the row in its taskset
    task_id: str = ""  # unique per exploration; experiences of this task are grouped by it

    @property
    def workflow_cls(self) -> type:
        return WORKFLOWS.get(self.workflow) if isinstance(self.workflow, str) else self.workflow

    def to_workflow(self, model: ModelWrapper, auxiliary_models: Optional[List] = None) -> Workflow:
        return self.workflow_cls(model=model, task=self, auxiliary_models=auxiliary_models)


class Workflow(ABC):
    """Runs one task with the model under training and returns its experiences."""

    def __init__(self, model: ModelWrapper, task: Task, auxiliary_models: Optional[List] = None):
        self.model = model
        self.task = task
        self.auxiliary_models = auxiliary_models

    @abstractmethod
    def run(self) -> List[Experience]:
        """Run the workflow and return a list of Experiences."""

    def resettable(self) -> bool:
        """True if ``reset`` can re-point this instance at a new task (saves re-initialising)."""
        return False

    def reset(self, task: Task) -> None:
        raise NotImplementedError(f"{type(self).__name__} is not resettable")
