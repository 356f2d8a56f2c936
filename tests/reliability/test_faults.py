"""Injected faults: each ends in a finished run or one clear failure, never a silent stall.

Each test prints one line, ``FAULT <name>: <outcome> in <seconds>``, for the closing note
(``pytest -s`` shows them). The faults come from ``fault_plugins/faults.py``, loaded as a
user plugin, so they happen inside the real runner and engine actors.
"""

import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from bench.kill_matrix import kill_group
from tests.integration.conftest import base_overrides
from tests.reliability.conftest import BASE_CONFIG
from trinity.runtime.launcher import RunFailed, run

PLUGINS = os.path.join(os.path.dirname(__file__), "fault_plugins")


def records(job_dir: str, role: str) -> list:
    with open(os.path.join(job_dir, "monitor", f"{role}.jsonl")) as f:
        return [json.loads(line) for line in f]


def overrides(tmp_path, micro_model, arithmetic_data, *extra: str) -> list:
    return base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "buffer.explorer_input.eval_tasksets=[]",
        "trainer.save_interval=0",
        *extra,
    ]


def say(line: str) -> None:
    """A figure for the closing note, past pytest's capture (shown with ``-s``)."""
    print(f"\nFAULT {line}", file=sys.__stderr__, flush=True)


def timed(name: str, fn):
    start = time.monotonic()
    try:
        result = fn()
    except RunFailed as exc:
        say(f"{name}: failed cleanly in {time.monotonic() - start:.1f}s: {exc}")
        raise
    say(f"{name}: run finished in {time.monotonic() - start:.1f}s")
    return result


def test_reward_fn_raising_on_a_tenth_of_tasks(
    tmp_path, micro_model, arithmetic_data, ray_cluster, capsys
):
    """The failing tasks are retried, reported with their id, and the trainer trains on the
    rest of each step at once: no wait for experiences that will not come."""
    args = overrides(
        tmp_path,
        micro_model,
        arithmetic_data,
        "buffer.explorer_input.default_reward_fn_type=flaky_reward",
        "buffer.batch_size=8",
        "buffer.total_steps=4",
        "explorer.max_retry_times=1",
    )
    (result,) = timed(
        "reward_fn raises on ~10% of tasks", lambda: run(BASE_CONFIG, args, [PLUGINS])
    )
    out = capsys.readouterr().out
    trainer = records(result.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1, 2, 3, 4]
    counts = [r["sample/experience_count"] for r in trainer]
    explored = records(result.job_dir, "explorer")
    failed = [r["rollout/tasks_failed"] for r in explored]
    # each step trains on exactly what its explore step produced: 4 samples per good task
    assert counts == [32 - 4 * f for f in failed]
    assert sum(failed) > 0, "the data should hold some rows the reward fn refuses"
    assert "cannot score this task" in out and "after 2 attempt(s)" in out
    assert "max_read_timeout" not in out  # no read waited for what never came


def test_a_hanging_workflow_times_out_is_retried_and_reported(
    tmp_path, micro_model, arithmetic_data, ray_cluster, capsys
):
    args = overrides(
        tmp_path,
        micro_model,
        arithmetic_data,
        "buffer.explorer_input.default_workflow_type=hanging_workflow",
        "buffer.total_steps=2",
        "explorer.max_timeout=6",
        "explorer.max_retry_times=1",
    )
    (result,) = timed("hanging workflow", lambda: run(BASE_CONFIG, args, [PLUGINS]))
    out = capsys.readouterr().out
    assert "timed out after explorer.max_timeout=6s" in out and "after 2 attempt(s)" in out
    assert "waiting" in out and "train-1-arith_train-0" in out  # what the explorer waited for
    trainer = records(result.job_dir, "trainer")
    assert [r["sample/experience_count"] for r in trainer] == [12, 16]  # row 0 only in step 1


@pytest.mark.slow
def test_a_killed_runner_is_replaced_and_its_task_rerun(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    markers = tmp_path / "markers"
    markers.mkdir()
    args = overrides(
        tmp_path,
        micro_model,
        arithmetic_data,
        "buffer.explorer_input.default_workflow_type=runner_killing_workflow",
        f"buffer.explorer_input.taskset.workflow_args={{marker_dir: {markers}}}",
        "buffer.total_steps=2",
        "cluster.in_process=false",  # runners in processes of their own, so one can die
    )
    (result,) = timed("runner process killed", lambda: run(BASE_CONFIG, args, [PLUGINS]))
    assert os.path.exists(markers / "runner-1")  # the fault did happen
    trainer = records(result.job_dir, "trainer")
    assert [r["sample/experience_count"] for r in trainer] == [16, 16]  # nothing lost


@pytest.mark.slow
def test_a_killed_engine_is_restarted_and_gets_the_weights_back(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    """Killed in step 3 (holding version 2); with sync_interval 2, step 4 brings no new
    weights, so only the explorer's check of each engine's version restores them."""
    markers = tmp_path / "markers"
    markers.mkdir()
    args = overrides(
        tmp_path,
        micro_model,
        arithmetic_data,
        "buffer.explorer_input.default_workflow_type=engine_killing_workflow",
        f"buffer.explorer_input.taskset.workflow_args="
        f"{{marker_dir: {markers}, engine_name: explorer_engine_0, kill_row: 8}}",
        "buffer.total_steps=4",
        "synchronizer.sync_interval=2",
        "cluster.in_process=false",  # the engine an actor Ray restarts
    )
    (result,) = timed("rollout engine killed", lambda: run(BASE_CONFIG, args, [PLUGINS]))
    assert os.path.exists(markers / "engine-8")
    trainer = records(result.job_dir, "trainer")
    assert [r["step"] for r in trainer] == [1, 2, 3, 4]
    assert [r["sample/experience_count"] for r in trainer] == [16, 16, 16, 16]
    # step 3 sampled partly after the restart (version 0); step 4 from version 2 again
    assert trainer[2]["sample/model_version/min"] == 0
    assert trainer[3]["sample/model_version/min"] == 2


def test_every_task_failing_ends_the_run_with_one_message(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    args = overrides(
        tmp_path,
        micro_model,
        arithmetic_data,
        "buffer.explorer_input.default_workflow_type=hanging_workflow",
        "buffer.batch_size=1",
        "explorer.max_timeout=3",
        "explorer.max_retry_times=0",
    )
    with pytest.raises(RunFailed) as info:
        timed("every task of a step fails", lambda: run(BASE_CONFIG, args, [PLUGINS]))
    message = str(info.value)
    assert "the explorer failed" in message and "1 of 1 task(s) failed" in message
    assert "explorer.max_failed_ratio" in message and "log/explorer.log" in message
    assert len(message.splitlines()) <= 4 and "Traceback" not in message


def _wait_for_steps(job_dir: str, proc: subprocess.Popen, steps: int, timeout: float) -> None:
    """Until the trainer logged ``steps`` steps (the run is mid-way), or fail."""
    path = os.path.join(job_dir, "monitor", "trainer.jsonl")
    deadline = time.monotonic() + timeout
    while not (os.path.exists(path) and len(open(path).readlines()) >= steps):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the run never got going"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("style", ["fixed", "explorer_driven", "trainer_driven", "fully_async"])
def test_kill_9_and_resume_trains_every_experience_once(
    tmp_path, micro_model, arithmetic_data, style
):
    """kill -9 of the whole run mid-way, then the same command again: every experience
    written is trained on once or dropped as stale and counted (``staleness/dropped``), none
    lost and none trained twice; each step explored and logged once."""
    args = [sys.executable, "-m", "trinity.cli.main", "run", "--config", BASE_CONFIG]
    args += overrides(tmp_path, micro_model, arithmetic_data, "buffer.total_steps=8")
    args += ["trainer.save_interval=2", f"synchronizer.sync_style={style}"]
    job_dir = os.path.join(tmp_path, "tests", "grpo_small")
    first = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    _wait_for_steps(job_dir, first, steps=3, timeout=300)
    start = time.monotonic()
    kill_group(first)  # reaps the driver: a zombie leader would keep the group alive
    second = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming at step" in second.stdout

    trainer = records(job_dir, "trainer")
    last = trainer[-1]["step"]
    assert [r["step"] for r in trainer] == list(range(1, last + 1))  # each step once
    explored = [r["step"] for r in records(job_dir, "explorer") if "rollout/model_version" in r]
    assert explored == list(range(1, 9))  # nothing explored twice
    with sqlite3.connect(os.path.join(job_dir, "buffer", "experience_buffer.db")) as db:
        written = db.execute("SELECT COUNT(*) FROM experience_buffer").fetchone()[0]
        unread = db.execute("SELECT COUNT(*) FROM experience_buffer WHERE consumed_by IS NULL")
        assert unread.fetchone()[0] == 0
        (late,) = db.execute(
            "SELECT COUNT(*) FROM experience_buffer WHERE consumed_by > ?", (last,)
        ).fetchone()
    assert written == 8 * 16
    trained = sum(r["sample/experience_count"] for r in trainer)
    dropped = sum(r.get("staleness/dropped", 0) for r in trainer) + late  # late: stale at the end
    assert trained + dropped == written  # none lost, none twice
    if style == "fixed":
        assert last == 8 and dropped == 0
    say(
        f"kill -9 mid-run ({style}): resumed and finished in {time.monotonic() - start:.1f}s; "
        f"written {written}, trained {trained:g}, dropped as stale {dropped:g}"
    )


def _small_tmpfs(path: str, size: str) -> bool:
    """Mount a tmpfs of ``size`` at ``path`` (root only); False where that is not allowed."""
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True
    )
    return done.returncode == 0


def test_a_full_disk_fails_the_run_clearly_and_keeps_the_last_checkpoint(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    """A 4 MiB tmpfs as checkpoint_root_dir holds about two checkpoints of the micro model;
    where none can be mounted, a plugin makes checkpoint writes fail with ENOSPC instead."""
    from trinity.trainer.checkpoint import latest_step, load_checkpoint

    root = str(tmp_path / "small_disk")
    mounted = _small_tmpfs(root, "4m")
    plugins = [] if mounted else [os.path.join(os.path.dirname(__file__), "diskfull_plugin")]
    args = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        f"checkpoint_root_dir={root}",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=20",
        "trainer.save_interval=1",
    ]
    try:
        with pytest.raises(RunFailed) as info:
            timed(
                f"full disk ({'tmpfs' if mounted else 'stand-in'})",
                lambda: run(BASE_CONFIG, args, plugins),
            )
        message = str(info.value)
        assert "disk full" in message or "No space left on device" in message, message
        assert len(message.splitlines()) <= 4 and "Traceback" not in message
        job_dir = os.path.join(root, "tests", "grpo_small")
        kept = latest_step(job_dir)
        assert kept is not None and kept >= 1
        assert load_checkpoint(job_dir, kept)["model"]  # the marked checkpoint is whole
        assert not [d for d in os.listdir(job_dir) if ".tmp" in d]  # no partial folder left
    finally:
        if mounted:
            subprocess.run(["umount", "-l", root], capture_output=True)
