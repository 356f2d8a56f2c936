"""docs/getting-started/your-own-config.md's minimal config, run as the page says: from the
folder where the quickstart's 2-step try wrote ./checkpoints, starting from its SFT weights."""

import os
import re
from pathlib import Path

import pytest

from trinity.demo.synthetic import prepare_quickstart
from trinity.monitor import read_metrics
from trinity.runtime.launcher import run

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "examples" / "quickstart" / "arithmetic.yaml"
PAGE = ROOT / "docs" / "getting-started" / "your-own-config.md"


@pytest.mark.slow
@pytest.mark.e2e
def test_the_minimal_config_runs_from_the_two_step_trys_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the page's relative paths: ./quickstart, ./checkpoints
    monkeypatch.delenv("TRINITY_QUICKSTART_DIR", raising=False)
    monkeypatch.delenv("TRINITY_CHECKPOINT_ROOT_DIR", raising=False)
    prepare_quickstart("./quickstart")
    sft, _ = run(str(QUICKSTART), ["buffer.total_steps=2"], [])  # the quickstart's 2-step try

    (config,) = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)[:1]
    (tmp_path / "my.yaml").write_text(config)
    (grpo,) = run("my.yaml", ["buffer.total_steps=2"], [])

    assert os.path.samefile(sft.final_hf, "checkpoints/quickstart/arithmetic_sft/global_step_2/hf")
    with open(os.path.join(grpo.job_dir, "config.yaml")) as f:
        assert "model_path: ./checkpoints/quickstart/arithmetic_sft/global_step_2/hf" in f.read()
    trainer = read_metrics(os.path.join(grpo.job_dir, "monitor", "trainer.jsonl"))
    explorer = read_metrics(os.path.join(grpo.job_dir, "monitor", "explorer.jsonl"))
    assert [r["step"] for r in trainer] == [1, 2]
    evals = [r["step"] for r in explorer if "eval/held_out/accuracy/mean" in r]
    assert evals == [0, 2]  # before training, and the final weights
