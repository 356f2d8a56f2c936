import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def base_overrides(tmp_path, micro_model, data) -> list:
    """Point the small test config at the fixtures."""
    return [
        f"checkpoint_root_dir={tmp_path}",
        f"model.model_path={micro_model}",
        f"buffer.explorer_input.taskset.path={data['rl']}",
        f"buffer.explorer_input.eval_tasksets.0.path={data['rl']}",
    ]


def module_report(module: str, out_path: str, args: list) -> dict:
    """Run ``python -m <module> <out_path> <args...>`` from the repository root, in a process
    of its own with no Ray settings of this one, and return the JSON it wrote to
    ``out_path``: a test that needs a Ray of its own (nodes, logical GPUs) runs it there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run(
        [sys.executable, "-m", module, out_path, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(out_path) as f:
        return json.load(f)
