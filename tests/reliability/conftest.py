"""Shared helpers of the reliability tier: run `trinity run` in-process with Ray guarded.

``ray_guard`` replaces ``trinity.runtime.launcher.init_ray`` with a stand-in that records the
call and raises :class:`RayStartAttempted`, so a test sees whether a run got past every check
done before start (and no cluster is ever started). ``run_cli`` runs the real CLI
(``typer.testing.CliRunner``) and times it; ``base_config`` is the small GRPO config of the
integration tests with the tiny model and data filled in, as a dict to edit and ``write_config``.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List

import pytest
import yaml
from typer.testing import CliRunner

HERE = os.path.dirname(__file__)
BASE_CONFIG = os.path.join(os.path.dirname(HERE), "integration", "configs", "grpo_small.yaml")


class RayStartAttempted(RuntimeError):
    """Raised by the guarded ``init_ray``: the run passed every check done before start."""


@dataclass
class CliRun:
    exit_code: int
    output: str  # stdout and stderr together
    exception: Any
    elapsed: float  # seconds the command took


@pytest.fixture
def ray_guard(monkeypatch, no_ray_yet) -> List[str]:
    """Namespaces ``init_ray`` was called with (empty while nothing tried to start Ray)."""
    import trinity.runtime.launcher as launcher

    calls: List[str] = []

    def guarded(namespace: str, *args: Any, **kwargs: Any) -> None:
        calls.append(namespace)
        raise RayStartAttempted(f"init_ray({namespace!r}) was called")

    monkeypatch.setattr(launcher, "init_ray", guarded)
    return calls


def run_cli(args: List[str]) -> CliRun:
    """``trinity <args>`` in this process; exceptions the CLI does not handle are kept."""
    from trinity.cli.main import app

    start = time.monotonic()
    result = CliRunner().invoke(app, args)
    elapsed = time.monotonic() - start
    output = result.output
    return CliRun(result.exit_code, output, result.exception, elapsed)


@pytest.fixture
def base_config(tmp_path, micro_model, arithmetic_data) -> Dict[str, Any]:
    """grpo_small.yaml pointing at the tiny model, the arithmetic data and ``tmp_path``."""
    with open(BASE_CONFIG, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    data["checkpoint_root_dir"] = str(tmp_path / "checkpoints")
    data["model"]["model_path"] = micro_model
    data["buffer"]["explorer_input"]["taskset"]["path"] = arithmetic_data["rl"]
    for taskset in data["buffer"]["explorer_input"]["eval_tasksets"]:
        taskset["path"] = arithmetic_data["rl"]
    return copy.deepcopy(data)


def write_config(directory: Any, data: Dict[str, Any], name: str = "config.yaml") -> str:
    """Write ``data`` as YAML under ``directory``; returns the file's path."""
    path = os.path.join(str(directory), name)
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return path
