"""``trinity.run``: the quickstart run from Python, as a notebook or script would, with the
same checks as the command line; ``import trinity`` itself stays cheap."""

import json
import os
import subprocess
import sys

import pytest
import yaml

import trinity
from trinity.demo.synthetic import prepare_quickstart

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
QUICKSTART = os.path.join(ROOT, "examples", "quickstart", "arithmetic.yaml")


@pytest.fixture
def quickstart(tmp_path, monkeypatch):
    """The quickstart's folder (micro model, little data) and a root for its runs."""
    prepare_quickstart(
        str(tmp_path / "qs"), preset="micro", digits=2, n_sft=160, n_train=40, n_test=8
    )
    monkeypatch.setenv("TRINITY_QUICKSTART_DIR", str(tmp_path / "qs"))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ck"))
    return tmp_path


def _steps(job_dir, role):
    with open(os.path.join(job_dir, "monitor", f"{role}.jsonl")) as f:
        return sorted({json.loads(line)["step"] for line in f if '"step"' in line})


def test_the_quickstart_runs_two_steps_per_stage_from_python(quickstart):
    result = trinity.run(
        QUICKSTART, overrides=["buffer.total_steps=2", "explorer.eval_on_startup=false"]
    )
    sft, grpo = result.stages
    assert (
        result.job_dir == grpo.job_dir == str(quickstart / "ck" / "quickstart" / "arithmetic_grpo")
    )
    assert _steps(sft.job_dir, "trainer") == [1, 2] and _steps(grpo.job_dir, "trainer") == [1, 2]
    assert result.final_hf and os.path.isfile(os.path.join(result.final_hf, "config.json"))
    assert os.path.isfile(os.path.join(result.job_dir, "config.yaml"))


def test_a_config_given_as_a_dict_gets_the_checks_of_the_command_line(quickstart):
    with open(QUICKSTART) as f:
        config = yaml.safe_load(f)
    config["buffer"]["batch_size"] = 0
    with pytest.raises(trinity.ConfigError) as info:
        trinity.run(config, overrides=["model.model_path=./no-model"])
    problems = info.value.problems
    assert any(p.startswith("buffer.batch_size = 0 must be >= 1") for p in problems), problems
    assert not os.path.exists(quickstart / "ck")  # nothing started


def test_import_trinity_loads_nothing_else_and_the_cli_prints_the_version():
    heavy = "('trinity.', 'torch', 'typing', 'ray')"
    probe = f"import sys, trinity; print(sorted(m for m in sys.modules if m.startswith({heavy})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    done = subprocess.run(
        [sys.executable, "-m", "trinity.cli.main", "--version"], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, f"trinity-rft {trinity.__version__}\n")
    from importlib.metadata import version

    assert version("trinity-rft") == trinity.__version__
