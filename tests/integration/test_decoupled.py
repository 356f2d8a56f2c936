"""Decoupled runs: `trinity run` in mode train and another in mode explore, as a user starts
them (two processes, each with its own local Ray), sharing the experience store and the job
dir's checkpoints. Every experience written is read exactly once, also when the trainer or
the explorer is killed (-9) mid-run and started again."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter

import psutil
import pytest

from tests.integration.conftest import HERE, base_overrides

TRINITY = [sys.executable, "-m", "trinity.cli.main"]
CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")
BUFFER = "exp_buffer"
PLUGINS = os.path.join(HERE, "plugins_slow")
ROWS_PER_STEP = 2 * 4  # batch_size x repeat_times


class Side:
    """One `trinity run` of the pair, its console in ``<tmp>/<label>.out``."""

    def __init__(self, tmp_path, label: str, mode: str, overrides: list) -> None:
        self.log = os.path.join(tmp_path, f"{label}.out")
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a Ray of its own
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                TRINITY
                + ["run", "--config", CONFIG, "--plugin-dir", PLUGINS]
                + [*overrides, f"mode={mode}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its Ray processes with it, for kill()
            )

    def output(self) -> str:
        with open(self.log) as f:
            return f.read()

    def wait_for_step(self, job_dir: str, role: str, step: int, timeout: float = 240) -> None:
        """Until the role's metrics file holds ``step`` (console lines come every 10 steps)."""
        path = os.path.join(job_dir, "monitor", f"{role}.jsonl")
        deadline = time.monotonic() + timeout
        while not os.path.exists(path) or step not in steps_logged(path):
            assert self.proc.poll() is None, f"exited before step {step}:\n{self.output()}"
            assert time.monotonic() < deadline, f"no step {step} in {timeout}s:\n{self.output()}"
            time.sleep(0.5)

    def wait_for(self, text: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.proc.poll() is None, f"exited before '{text}':\n{self.output()}"
            assert time.monotonic() < deadline, f"no '{text}' in {timeout}s:\n{self.output()}"
            time.sleep(0.5)

    def finish(self, timeout: float = 300) -> str:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout}s:\n{self.output()}") from None
        assert code == 0, self.output()
        return self.output()

    def kill(self) -> None:
        """kill -9 the run and every process of its Ray, as a crashed machine would: its
        process group and every descendant (Ray starts its workers in sessions of their own,
        which would outlive the group and go on training for a while)."""
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        os.killpg(self.proc.pid, signal.SIGKILL)
        for process in family:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait()


def steps_logged(path: str) -> set:
    with open(path) as f:
        return {json.loads(line)["step"] for line in f if line.endswith("\n")}


def steps_written(job_dir: str) -> int:
    """Whole explore steps in the experience store."""
    with sqlite3.connect(os.path.join(job_dir, "buffer", f"{BUFFER}.db")) as db:
        (rows,) = db.execute(f"SELECT COUNT(*) FROM {BUFFER}").fetchone()
    return rows // ROWS_PER_STEP


def overrides(tmp_path, micro_model, data, steps: int) -> list:
    return base_overrides(tmp_path, micro_model, data) + [
        "buffer.explorer_input.taskset.default_workflow_type=slow_math_workflow",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.batch_size=2",
        f"buffer.total_steps={steps}",
        "synchronizer.sync_method=checkpoint",
        f"buffer.trainer_input.experience_buffer={{name: {BUFFER}, storage_type: queue}}",
        # one rollout at a time: the explorer is not far ahead of the trainer's checkpoints
        "explorer.concurrent_mode=sequential",
        "explorer.runner_per_model=1",
    ]


def counts(job_dir: str, steps: int) -> dict:
    """Written, read, lost and read-twice counts, from the store and the trainer's metrics
    (each train step's ``sample/experience_count`` against the rows marked with its step)."""
    with sqlite3.connect(os.path.join(job_dir, "buffer", f"{BUFFER}.db")) as db:
        rows = db.execute(f"SELECT step, model_version, consumed_by FROM {BUFFER}").fetchall()
    with open(os.path.join(job_dir, "monitor", "trainer.jsonl")) as f:
        trained = {r["step"]: int(r["sample/experience_count"]) for r in map(json.loads, f)}
    marked = Counter(by for _, _, by in rows if by is not None)
    found = dict(
        written=len(rows),
        read=sum(marked.values()),
        lost=sum(1 for _, _, by in rows if by is None),
        twice=sum(trained.values()) - sum(marked.values()),
        versions={s: v for s, v, _ in sorted(rows)},  # explore step -> model version
    )
    print(f"decoupled run: {found}")
    assert dict(marked) == trained  # every train step read exactly the rows marked with it
    assert sorted(trained) == list(range(1, steps + 1))
    # every explore step written once, whole (also when the explorer was restarted)
    assert Counter(s for s, _, _ in rows) == {s: ROWS_PER_STEP for s in range(1, steps + 1)}
    return found


@pytest.mark.slow
def test_explore_and_train_runs_share_the_buffer_and_checkpoints(
    tmp_path, micro_model, arithmetic_data
):
    args = overrides(tmp_path, micro_model, arithmetic_data, steps=6)
    trainer = Side(tmp_path, "train", "train", args)  # first: it waits for the explorer
    trainer.wait_for("for the explorer (a separate `mode: explore` run writing")
    explorer = Side(tmp_path, "explore", "explore", args)
    explorer_out, trainer_out = explorer.finish(), trainer.finish()

    job_dir = os.path.join(tmp_path, "tests", "grpo_small")
    found = counts(job_dir, steps=6)
    assert (found["written"], found["read"], found["lost"], found["twice"]) == (48, 48, 0, 0)
    # the explorer loaded the checkpoints the trainer saved at each sync
    assert found["versions"][1] == 0 and found["versions"][6] > 0
    assert os.path.isdir(os.path.join(job_dir, "global_step_6", "hf"))
    # each side keeps its own config; each console shows its own role's numbers
    assert {"train_config.yaml", "explore_config.yaml"} <= set(os.listdir(job_dir))
    assert "| step 6/6" in trainer_out and "| step 6/6" in explorer_out
    assert re.search(r"pg_loss -?\d", trainer_out) and not re.search(r"reward -?\d", trainer_out)
    assert re.search(r"reward -?\d", explorer_out) and "pg_loss" not in explorer_out


@pytest.mark.slow
def test_a_killed_trainer_restarts_and_still_reads_each_experience_once(
    tmp_path, micro_model, arithmetic_data
):
    # a checkpoint every 2 steps: the killed trainer loses the steps after the last one
    args = overrides(tmp_path, micro_model, arithmetic_data, steps=6) + [
        "synchronizer.sync_interval=2",
        "trainer.save_interval=0",
    ]
    job_dir = os.path.join(tmp_path, "tests", "grpo_small")
    # the explorer is killed after a few steps, so the trainer, once it has trained what was
    # written, waits mid-run: killed then (a kill timed on a step it may have passed is not)
    explorer = Side(tmp_path, "explore", "explore", args)
    trainer = Side(tmp_path, "train", "train", args)
    explorer.wait_for_step(job_dir, "explorer", 3)
    explorer.kill()
    written = steps_written(job_dir)
    assert 3 <= written < 6
    trainer.wait_for_step(job_dir, "trainer", written)
    trainer.kill()
    explorer = Side(tmp_path, "explore_again", "explore", args)
    again = Side(tmp_path, "train_again", "train", args)
    trainer_out = again.finish()
    explorer.finish()

    # from its last checkpoint (every 2 steps)
    assert f"resuming at step {written // 2 * 2}\n" in trainer_out, trainer_out
    found = counts(job_dir, steps=6)
    assert (found["written"], found["read"], found["lost"], found["twice"]) == (48, 48, 0, 0)


@pytest.mark.slow
def test_a_killed_explorer_restarts_after_the_last_step_it_wrote(
    tmp_path, micro_model, arithmetic_data
):
    args = overrides(tmp_path, micro_model, arithmetic_data, steps=6)
    trainer = Side(tmp_path, "train", "train", args)
    explorer = Side(tmp_path, "explore", "explore", args)
    explorer.wait_for_step(os.path.join(tmp_path, "tests", "grpo_small"), "explorer", 2)
    explorer.kill()  # the trainer waits for the steps it did not write
    again = Side(tmp_path, "explore_again", "explore", args)
    explorer_out = again.finish()
    trainer.finish()

    assert "resuming at step" in explorer_out
    found = counts(os.path.join(tmp_path, "tests", "grpo_small"), steps=6)
    assert (found["written"], found["read"], found["lost"], found["twice"]) == (48, 48, 0, 0)


@pytest.mark.slow
def test_a_lora_pair_trains_the_adapter_and_explores_with_its_checkpoints(
    tmp_path, micro_model, arithmetic_data
):
    # both sides read the same LoRA config: the explorer's engine merges each adapter
    # checkpoint the trainer saves over its base weights
    lora = ["model.lora_configs=[{lora_rank: 8, lora_alpha: 16}]", "algorithm.optimizer.lr=0.02"]
    args = overrides(tmp_path, micro_model, arithmetic_data, steps=4) + lora
    trainer = Side(tmp_path, "train", "train", args)
    trainer.wait_for("for the explorer (a separate `mode: explore` run writing")
    explorer = Side(tmp_path, "explore", "explore", args)
    explorer.finish()
    trainer.finish()

    found = counts(os.path.join(tmp_path, "tests", "grpo_small"), steps=4)
    assert (found["written"], found["read"], found["lost"], found["twice"]) == (32, 32, 0, 0)
    # the explorer loaded adapter checkpoints (the first explore step used the base)
    assert found["versions"][1] == 0 and found["versions"][4] > 0
