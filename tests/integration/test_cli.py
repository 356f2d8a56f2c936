"""`trinity` as a user runs it: a subprocess, exit codes and messages."""

import os
import signal
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


def _trainer_steps(job_dir: str) -> int:
    path = os.path.join(job_dir, "monitor", "trainer.jsonl")
    return sum(1 for _ in open(path)) if os.path.exists(path) else 0


def test_ctrl_c_says_where_it_stopped_and_how_to_go_on(tmp_path, micro_model, arithmetic_data):
    """SIGINT (what Ctrl-C sends) to a running `trinity run`: exit status 130 within seconds,
    and one line with the train step, the last checkpoint and the command to go on."""
    from tests.integration.conftest import base_overrides
    from trinity.common.weights import latest_step

    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "buffer.total_steps=500",
        "trainer.save_interval=2",
        "buffer.explorer_input.eval_tasksets=[]",
    ]
    run = subprocess.Popen(
        TRINITY + ["run", "--config", CONFIG, *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell's Ctrl-C reaches a foreground job with SIGINT's default action in place
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    job_dir = os.path.join(tmp_path, "tests", "grpo_small")
    deadline = time.monotonic() + 180
    while _trainer_steps(job_dir) < 3 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert run.poll() is None, run.communicate()
    run.send_signal(signal.SIGINT)
    stopped = time.monotonic()
    out, err = run.communicate(timeout=120)
    assert run.returncode == 130, (run.returncode, out + err)
    assert time.monotonic() - stopped < 30
    saved = latest_step(job_dir)
    trained = _trainer_steps(job_dir)
    assert saved is not None and saved % 2 == 0 and saved <= trained
    assert err.strip().splitlines()[-1] == (
        f"stopped at train step {trained}; the last checkpoint is step {saved} "
        f"({os.path.join(job_dir, f'global_step_{saved}')}); run the same command to go on"
    )


def test_a_local_ray_keeps_token_auth_without_saying_so_on_the_console(tmp_path):
    """Ray warns at every start that it enabled token authentication (its default); the run
    keeps the authentication and drops the notice."""
    script = (
        "import os\n"
        "from trinity.runtime.launcher import init_ray\n"
        "init_ray('trinity-tests-auth')\n"
        "import ray\n"
        "print('auth mode:', os.environ.get('RAY_AUTH_MODE'))\n"
        "ray.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "auth mode: token" in out.stdout
    assert "Token authentication" not in out.stdout + out.stderr, out.stderr
