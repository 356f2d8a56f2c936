"""Task and Workflow: the plugin API for RL environments (docs/reference/plugin-api.md).

A ``Task`` is one row of a taskset plus the dataset-level settings that shape how it
runs; a ``Workflow`` turns one task into experiences using the ``ModelWrapper``.
"""

from __future__ import annotations

import asyncio
import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from trinity.common.config import FormatConfig, GenerationConfig
from trinity.common.config.base import ConfigError, validate_model
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


class Workflow:
    """Runs one task with the model under training and returns its experiences.

    Define ``run`` (blocking: ``model.chat``), ``run_async`` (a coroutine:
    ``await model.chat_async``), or both. The runner calls ``run`` when
    ``explorer.concurrent_mode`` is ``sequential`` or ``multi-threading`` and ``run_async`` when
    it is ``asynchronous``; whichever one is missing runs the other, so every workflow works in
    every mode.

    Class attributes:
        records_turn_states: its experiences carry ``turn_states`` (the environment's state at
            each turn, ``merge_turns(states=...)``); the config check holds an advantage fn
            that needs them (GiGPO) to workflows declaring it (default False).
        needs_packages: the optional packages it imports (module name -> the extra of this
            project that installs it); the config check refuses a taskset naming the
            workflow where one is not installed (``missing_packages``).
        needs_openai_api: its model calls go through the rollout model's OpenAI-compatible
            server (a program it starts makes them); the config check then requires
            ``explorer.rollout_model.enable_openai_api`` (default False).

    A workflow may also define a classmethod ``auxiliary_models_needed(workflow_args) -> int``:
    how many of ``explorer.auxiliary_models`` its tasks use with those ``workflow_args``; the
    config check refuses a taskset that asks for more than are configured. One with
    ``needs_openai_api`` may define a classmethod ``sends_tools(workflow_args) -> bool``:
    whether the program's calls offer the model tools; the config check then requires
    ``explorer.rollout_model.enable_auto_tool_choice``.
    """

    records_turn_states: bool = False
    needs_packages: Dict[str, str] = {}
    needs_openai_api: bool = False

    def __init__(self, model: ModelWrapper, task: Task, auxiliary_models: Optional[List] = None):
        self.model = model
        self.task = task
        self.auxiliary_models = auxiliary_models

    def run(self) -> List[Experience]:
        """Run the workflow and return a list of Experiences.

        The default runs ``run_async`` to completion on this instance's own event loop, kept
        for the instance's later tasks: what ``run_async`` binds to the loop and keeps (an
        ``AsyncOpenAI`` client's connections) stays usable when the runner reuses it.
        """
        if type(self).run_async is Workflow.run_async:
            raise NotImplementedError(f"{type(self).__name__} must define run() or run_async()")
        loop = self.__dict__.get("_run_loop")
        if loop is None:  # the runner never runs one instance in two threads at once
            loop = self._run_loop = asyncio.new_event_loop()
        return loop.run_until_complete(self.run_async())

    async def run_async(self) -> List[Experience]:
        """Run the workflow as a coroutine and return a list of Experiences.

        With ``explorer.concurrent_mode: asynchronous`` a runner runs many tasks' ``run_async``
        at once on one event loop, so it must never block: call ``await
        self.model.chat_async(...)`` / ``generate_async``, ``asyncio.sleep``, and keep per-task
        state on the instance (instances are never shared by two running tasks). The default
        runs ``run`` in a worker thread, so a blocking workflow works too (its concurrency is
        then bounded by the runner's threads).
        """
        if type(self).run is Workflow.run:
            raise NotImplementedError(f"{type(self).__name__} must define run() or run_async()")
        return await asyncio.to_thread(self.run)

    def resettable(self) -> bool:
        """True if ``reset`` can re-point this instance at a new task (saves re-initialising)."""
        return False

    def reset(self, task: Task) -> None:
        raise NotImplementedError(f"{type(self).__name__} is not resettable")


class ResettableWorkflow(Workflow):
    """A workflow whose per-task state is all set by ``reset``, which ``__init__`` calls: the
    runner re-points one instance at each new task. Subclasses define ``reset``."""

    def __init__(self, model: Any, task: Task, auxiliary_models: Optional[List] = None) -> None:
        super().__init__(model, task, auxiliary_models)
        self.reset(task)

    def resettable(self) -> bool:
        return True


def missing_packages(workflow: Any) -> List[str]:
    """What to install for each package ``workflow.needs_packages`` names that is not
    installed (looked up, not imported: an import may take seconds)."""
    return [
        f'needs the {module} package, which is not installed: pip install -e ".[{extra}]"'
        for module, extra in getattr(workflow, "needs_packages", {}).items()
        if importlib.util.find_spec(module) is None
    ]


def read_workflow_args(args_model: type, task: Task) -> Any:
    """``task.workflow_args`` as ``args_model`` (a workflow's ``args_model``); a ValueError
    naming the taskset and each bad key."""
    try:
        return validate_model(args_model, task.workflow_args, "workflow_args")
    except ConfigError as exc:
        raise ValueError(f"taskset '{task.taskset_name}': {'; '.join(exc.problems)}") from None
