"""`trinity` as a user runs it: a subprocess, exit codes and messages."""

import os
import subprocess
import sys
import time

from tests.integration.conftest import HERE

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


def test_ppo_example_names_the_missing_folders_before_ray(tmp_path):
    """Every part of it is built (its reward model runs as an auxiliary model); what stops it
    here is that the folders it names do not exist, each said before Ray starts."""
    example = os.path.join(os.path.dirname(HERE), "unit", "configs", "ppo_example.yaml")
    out = subprocess.run(
        TRINITY + ["run", "--config", example, "monitor.monitor_type=tensorboard"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert out.returncode == 2
    problems = [line for line in out.stderr.splitlines() if line.strip().startswith("- ")]
    assert not [p for p in problems if "not supported yet" in p], out.stderr
    assert any("explorer.auxiliary_models[0].model_path" in p for p in problems), out.stderr
    assert any(p.strip().startswith("- model.model_path") for p in problems), out.stderr
