"""Workflows and a reward function that misbehave on purpose, for the fault tests.

Loaded with ``--plugin-dir`` like any user plugin, so they run inside the real runner actors.
Which task misbehaves is decided from the data row (deterministic); "only once" faults leave
a marker file in ``workflow_args.marker_dir`` so the retry succeeds.
"""

import os
import time
import zlib

import ray

from trinity.common.rewards import REWARD_FUNCTIONS
from trinity.common.rewards.math import MathReward
from trinity.common.workflows.simple import MathWorkflow
from trinity.common.workflows.workflow import WORKFLOWS


def _tenth(row: dict) -> bool:
    """About one row in ten, the same rows in every run."""
    return zlib.crc32(str(row.get("question")).encode()) % 10 == 0


@REWARD_FUNCTIONS.register_module("flaky_reward")
class FlakyReward(MathReward):
    """Raises on about 10% of the tasks, every time they are tried."""

    def __call__(self, response, truth=None, **kwargs):
        if _tenth(kwargs.get("raw_task", {})):
            raise ValueError("flaky_reward cannot score this task")
        return super().__call__(response, truth, **kwargs)


def _first_time(task, what: str) -> bool:
    """True once per (task row, fault): the marker file makes later attempts behave."""
    marker = os.path.join(task.workflow_args["marker_dir"], f"{what}-{task.index}")
    if os.path.exists(marker):
        return False
    with open(marker, "w") as f:
        f.write(str(time.time()))
    return True


@WORKFLOWS.register_module("hanging_workflow")
class HangingWorkflow(MathWorkflow):
    """Row 0 of the taskset never finishes (every attempt)."""

    def run(self):
        if not self.task.is_eval and self.task.index == 0:
            time.sleep(3600)
        return super().run()


@WORKFLOWS.register_module("runner_killing_workflow")
class RunnerKillingWorkflow(MathWorkflow):
    """Row 1's first attempt kills its own runner process."""

    def run(self):
        if not self.task.is_eval and self.task.index == 1 and _first_time(self.task, "runner"):
            os._exit(1)
        return super().run()


@WORKFLOWS.register_module("engine_killing_workflow")
class EngineKillingWorkflow(MathWorkflow):
    """Row ``workflow_args.kill_row``'s first attempt kills the rollout engine mid-step
    (Ray restarts it, with its initial weights)."""

    def run(self):
        args = self.task.workflow_args
        if (
            not self.task.is_eval
            and self.task.index == args["kill_row"]
            and _first_time(self.task, "engine")
        ):
            engine = ray.get_actor(self.task.workflow_args["engine_name"])
            ray.kill(engine, no_restart=False)
            time.sleep(0.5)
        return super().run()
