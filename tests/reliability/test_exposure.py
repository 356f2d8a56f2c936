"""Nothing exposed: a local Ray started by `trinity run` listens on loopback only."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import base_overrides
from tests.reliability.conftest import BASE_CONFIG

LOOPBACK = ("127.0.0.1", "[::ffff:127.0.0.1]", "[::1]")


def _listening(pids: set) -> list:
    """(local address, process) of every listening TCP socket of ``pids``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            found.append((line.split()[3].rsplit(":", 1)[0], line.split()[-1]))
    return found


def _group(pgid: int) -> set:
    out = subprocess.run(["ps", "-o", "pid=", "-g", str(pgid)], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


@pytest.mark.slow
def test_ray_of_a_run_listens_on_loopback_only(tmp_path, micro_model, arithmetic_data):
    args = [sys.executable, "-m", "trinity.cli.main", "run", "--config", BASE_CONFIG]
    args += base_overrides(tmp_path, micro_model, arithmetic_data)
    args += ["buffer.total_steps=200", "buffer.explorer_input.eval_tasksets=[]"]
    args += ["cluster.in_process=false"]  # the stage on Ray, whose servers are under test
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    run = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    metrics = os.path.join(tmp_path, "tests", "grpo_small", "monitor", "trainer.jsonl")
    try:
        deadline = time.monotonic() + 300
        while not os.path.exists(metrics):  # training has started: every actor is up
            assert run.poll() is None, run.communicate()[0]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        sockets = _listening(_group(run.pid))
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert len(sockets) >= 3, sockets  # gcs, raylet, workers...
    exposed = [s for s in sockets if s[0] not in LOOPBACK]
    assert not exposed, f"listening beyond loopback: {exposed}"
