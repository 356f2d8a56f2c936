"""The shipped quickstart, shortened: SFT warm-up then GRPO, and held-out accuracy rises.

Takes a few minutes on 2 CPU cores; it is the suite's proof that training learns.
"""

import os

import pytest

from trinity.demo.synthetic import prepare_quickstart
from trinity.monitor import read_metrics
from trinity.runtime.launcher import run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
CONFIG = os.path.join(ROOT, "examples", "quickstart", "arithmetic.yaml")


@pytest.mark.slow
@pytest.mark.e2e
def test_quickstart_grpo_raises_heldout_accuracy(tmp_path, monkeypatch, ray_cluster):
    prepare_quickstart(str(tmp_path / "quickstart"))
    monkeypatch.setenv("TRINITY_QUICKSTART_DIR", str(tmp_path / "quickstart"))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ck"))
    # the shipped SFT stage whole, the GRPO stage shortened (a global total_steps would cut both)
    sft, grpo = run(CONFIG, ["stages.1.buffer.total_steps=40", "explorer.eval_interval=20"], [])
    evals = [
        (r["step"], r["eval/arithmetic_test/accuracy/mean"])
        for r in read_metrics(os.path.join(grpo.job_dir, "monitor", "explorer.jsonl"))
        if "eval/arithmetic_test/accuracy/mean" in r
    ]
    (first_step, before), (last_step, after) = evals[0], evals[-1]
    assert (first_step, last_step) == (0, 40)
    assert after >= before + 0.10, evals  # 200 held-out problems, greedy
