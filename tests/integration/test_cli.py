"""`trinity` as a user runs it: a subprocess, exit codes and messages."""

import os
import signal
import subprocess
import sys
import time

from tests.integration.conftest import HERE, base_overrides

TRINITY = [sys.executable, "-m", "trinity.cli.main"]
CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")


def test_help_is_quick():
    start = time.monotonic()
    out = subprocess.run(TRINITY + ["--help"], capture_output=True, text=True, check=True)
    assert "run" in out.stdout
    assert time.monotonic() - start < 20  # generous: heavy imports are deferred


def test_misspelled_key_fails_before_ray(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(CONFIG).read().replace("  batch_size: 4", "  batchsize: 4"))
    out = subprocess.run(
        TRINITY + ["run", "--config", str(bad), f"checkpoint_root_dir={tmp_path}/ck"],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "buffer.batchsize" in out.stderr and "batch_size" in out.stderr
    assert "Ray" not in out.stderr + out.stdout  # failed before any cluster was started
    assert not os.path.exists(tmp_path / "ck")


def test_ppo_example_names_exactly_the_parts_not_built_yet(tmp_path):
    """Only its reward model (explorer.auxiliary_models) is not built; ppo itself is."""
    example = os.path.join(os.path.dirname(HERE), "unit", "configs", "ppo_example.yaml")
    out = subprocess.run(
        TRINITY + ["run", "--config", example, "monitor.monitor_type=tensorboard"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert out.returncode == 2
    problems = [line for line in out.stderr.splitlines() if line.strip().startswith("- ")]
    assert len(problems) == 1, out.stderr
    assert "explorer.auxiliary_models" in problems[0] and "not supported yet" in problems[0]


def _wait_for(path: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _wait_group_gone(pgid: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def test_killed_run_resumes_from_its_checkpoint(tmp_path, micro_model, arithmetic_data):
    args = (
        TRINITY
        + ["run", "--config", CONFIG]
        + base_overrides(tmp_path, micro_model, arithmetic_data)
    )
    args += [
        # Enough steps that the kill lands mid-run: micro-model steps take well under 0.1 s.
        "buffer.total_steps=40",
        "trainer.save_interval=2",
        "buffer.explorer_input.eval_tasksets=[]",
    ]
    job_dir = os.path.join(tmp_path, "tests", "grpo_small")
    marker = os.path.join(job_dir, "latest_checkpointed_iteration.txt")

    first = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    _wait_for(marker, first, timeout=300)
    os.killpg(first.pid, signal.SIGKILL)  # the driver and the Ray it started
    first.wait()
    _wait_group_gone(first.pid)  # actors may finish a save while Ray goes down
    killed_at = int(open(marker).read())
    assert 2 <= killed_at < 40

    second = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resuming at step {killed_at}" in second.stdout
    steps = [line for line in second.stdout.splitlines() if line.strip().startswith("trainer")]
    assert steps and f"step {killed_at + 1:>4}" in steps[0]
    assert int(open(marker).read()) == 40
