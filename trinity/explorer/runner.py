"""WorkflowRunner: runs one task's workflow with retries and returns its experiences."""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from trinity.common.experience import Experience
from trinity.common.models.model import ModelWrapper
from trinity.common.workflows.workflow import Task, Workflow


@dataclass
class TaskResult:
    task: Task
    experiences: List[Experience] = field(default_factory=list)
    error: Optional[str] = None  # the last attempt's traceback when every attempt failed
    seconds: float = 0.0
    attempts: int = 0


class WorkflowRunner:
    def __init__(
        self,
        engine: Any,
        default_params: Dict[str, Any],
        max_retry_times: int = 2,
        auxiliary_models: Optional[List] = None,
    ) -> None:
        self.model = ModelWrapper(engine, default_params)
        self.max_retry_times = max_retry_times
        self.auxiliary_models = auxiliary_models
        # Resettable workflows, reused across tasks; one set per thread, because a runner in
        # ``concurrent_mode: multi-threading`` runs several tasks at once.
        self._local = threading.local()

    @property
    def _workflows(self) -> Dict[type, Workflow]:
        if not hasattr(self._local, "workflows"):
            self._local.workflows = {}
        return self._local.workflows

    def _workflow(self, task: Task) -> Workflow:
        cls = task.workflow_cls
        cached = self._workflows.get(cls)
        if cached is not None:
            cached.reset(task)
            return cached
        workflow = task.to_workflow(self.model, self.auxiliary_models)
        if workflow.resettable():
            self._workflows[cls] = workflow
        return workflow

    def run_task(self, task: Task) -> TaskResult:
        start = time.monotonic()
        result = TaskResult(task=task)
        for attempt in range(1, self.max_retry_times + 2):
            result.attempts = attempt
            try:
                with self.model.track_versions() as seen:
                    experiences = self._workflow(task).run()
                # The oldest weights that sampled any of the task's replies (read from the
                # replies: no extra engine call); asked for only if the workflow made none.
                version = min(seen) if seen else self.model.model_version
                if not isinstance(experiences, list) or not all(
                    isinstance(e, Experience) for e in experiences
                ):
                    raise TypeError(
                        f"{task.workflow_cls.__name__}.run() must return a list of Experience, "
                        f"got {type(experiences).__name__}"
                    )
                for exp in experiences:
                    exp.group_id = task.task_id
                    exp.model_version = version
                result.experiences, result.error = experiences, None
                break
            except Exception:  # a workflow or reward fn that raises: retry, then report
                self._workflows.clear()  # never reuse a workflow left in a failed state
                result.error = traceback.format_exc()
        result.seconds = time.monotonic() - start
        return result
