"""explorer.runner_state_report_interval: a runner's status line, and its periodic report."""

import threading
import time

from trinity.common.experience import Experience
from trinity.common.workflows import Task, Workflow
from trinity.explorer.runner import WorkflowRunner
from trinity.explorer.runner_state import RunnerState
from trinity.utils.status import Reporter, RunStatus


def test_the_line_names_running_tasks_and_counts_the_ended_ones():
    state = RunnerState()
    state.attempt(1, "train-1-ts-0", 1)
    state.attempt(2, "train-1-ts-1", 1)
    state.attempt(2, "train-1-ts-1", 2)  # retried: same start, attempt 2
    state.attempt(3, "train-1-ts-2", 1)
    state.end(3, ok=False)
    line = state.line()
    assert line.startswith("2 running: train-1-ts-0 0s, train-1-ts-1 0s (attempt 2);")
    assert line.endswith("0 finished, 1 failed so far")
    state.end(1, ok=True)
    state.end(2, ok=None)  # given up on (cancelled): neither finished nor failed
    assert state.line() == "idle; 1 finished, 1 failed so far"
    assert state.line() is None  # idle and nothing new: quiet


def test_more_than_three_running_tasks_are_summarised():
    state = RunnerState()
    for i in range(5):
        state.attempt(i, f"t{i}", 1)
    assert "t0 0s, t1 0s, t2 0s and 2 more;" in state.line()


class Slow(Workflow):
    """Holds its task until the test lets it go, then returns one experience."""

    release = threading.Event()

    def run(self):
        assert self.release.wait(10)
        return [Experience(tokens=[1, 2, 3], prompt_length=1, reward=1.0)]


class Raises(Workflow):
    def run(self):
        raise RuntimeError("boom")


class Engine:
    """Enough of an engine for workflows that make no model call."""

    def model_version(self):
        return 0


def test_a_runner_reports_its_state_every_interval():
    board = RunStatus()
    runner = WorkflowRunner(
        Engine(),
        default_params={},
        max_retry_times=0,
        report=Reporter(board, "runner_0"),
        report_interval=0.05,
    )
    assert runner.run_task(Task(workflow=Raises, task_id="bad")).error is not None
    worker = threading.Thread(target=runner.run_task, args=(Task(workflow=Slow, task_id="t7"),))
    worker.start()
    deadline = time.monotonic() + 5
    while not any("t7" in text for _, text in board.events) and time.monotonic() < deadline:
        time.sleep(0.02)
    Slow.release.set()
    worker.join()
    lines = [text for role, text in board.events if role == "runner_0"]
    running = next(text for text in lines if "t7" in text)
    assert running.startswith("1 running: t7 ") and running.endswith("0 finished, 1 failed so far")
    time.sleep(0.2)  # the end of t7 is reported once, then the idle runner is quiet
    final = [text for _, text in board.events if text == "idle; 1 finished, 1 failed so far"]
    assert len(final) == 1
