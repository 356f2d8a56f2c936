"""A staged run tried short, then run in full, then again: each stage starts from the weights
the previous stage ends with, a finished stage is not run again, and a shorter try in a
finished run's folder says why it cannot run (issue 45, items 1, 2 and 6)."""

import json
import os

import pytest
from typer.testing import CliRunner

from tests.integration.conftest import HERE, base_overrides
from trinity.cli.main import app
from trinity.common.weights import latest_step
from trinity.runtime.launcher import run
from trinity.runtime.stage_folder import read_start

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")
STAGES = """
stages:
  - stage_name: sft
    mode: train
    algorithm: {{algorithm_type: sft}}
    buffer:
      train_batch_size: 16
      total_steps: 3
      trainer_input:
        experience_buffer:
          name: sft_data
          storage_type: file
          path: {sft}
          format: {{prompt_key: prompt, response_key: response}}
  - stage_name: rl
    buffer: {{total_steps: 2}}
"""


def records(job_dir: str, role: str) -> list:
    with open(os.path.join(job_dir, "monitor", f"{role}.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def staged(tmp_path_factory, micro_model, arithmetic_data):
    """The quickstart's sequence on a short staged config: a 1-step try of both stages
    (``buffer.total_steps=1``), then the full run, each printing to a captured console."""
    root = tmp_path_factory.mktemp("staged")
    config = root / "stages.yaml"
    with open(CONFIG) as f:
        config.write_text(f.read() + STAGES.format(sft=arithmetic_data["sft"]))
    overrides = base_overrides(root, micro_model, arithmetic_data) + [
        "explorer.eval_on_startup=false"
    ]
    runner = CliRunner()
    tried = runner.invoke(app, ["run", "--config", str(config), *overrides, "buffer.total_steps=1"])
    assert tried.exit_code == 0, tried.output
    tried_rl = read_start(os.path.join(root, "tests", "grpo_small_rl"))
    full = runner.invoke(app, ["run", "--config", str(config), *overrides])
    assert full.exit_code == 0, full.output
    return {
        "config": str(config),
        "overrides": overrides,
        "project": os.path.join(root, "tests"),
        "tried_rl": tried_rl,
        "full": full.output,
    }


def test_the_full_run_starts_the_next_stage_from_the_full_weights(staged):
    project, out = staged["project"], staged["full"]
    sft, rl = os.path.join(project, "grpo_small_sft"), os.path.join(project, "grpo_small_rl")
    assert staged["tried_rl"]["step"] == 1  # the try's rl stage started from sft's step 1
    assert "stage grpo_small_sft: mode=train algorithm=sft steps=3, resuming at step 1" in out
    # the rl stage's try was trained from sft's step 1: it starts fresh, its folder moved aside
    moved = [d for d in os.listdir(project) if d.startswith("grpo_small_rl.old-")]
    assert len(moved) == 1
    old = os.path.join(project, moved[0])
    assert (
        "stage grpo_small_rl: its folder was trained from grpo_small_sft's step 1, and "
        "grpo_small_sft now ends at step 3: starting it fresh from those weights; the old "
        f"folder is kept as {old}"
    ) in " ".join(out.split())  # the console may wrap the line
    assert "stage grpo_small_rl: mode=both algorithm=grpo steps=2\n" in out  # no "resuming"
    assert latest_step(old) == 1 and [r["step"] for r in records(old, "trainer")] == [1]
    # the new folder holds this run only, started from the full sft's final weights
    assert [r["step"] for r in records(rl, "trainer")] == [1, 2]
    assert [r["step"] for r in records(rl, "explorer")][0] == 1
    start = read_start(rl)
    assert (start["stage_dir"], start["step"]) == (sft, 3)
    with open(os.path.join(sft, "global_step_3", "extra.json")) as f:
        assert start["checkpoint_id"] == json.load(f)["checkpoint_id"]
    with open(os.path.join(rl, "config.yaml")) as f:
        assert os.path.join(sft, "global_step_3", "hf") in f.read()


def test_a_finished_run_says_already_finished_and_runs_nothing(staged):
    project = staged["project"]
    rl = os.path.join(project, "grpo_small_rl")
    before = os.path.getsize(os.path.join(rl, "monitor", "trainer.jsonl"))
    sft_result, rl_result = run(staged["config"], staged["overrides"], [])
    assert sft_result.already_finished and rl_result.already_finished
    assert rl_result.final_hf == os.path.join(rl, "global_step_2", "hf")
    assert os.path.getsize(os.path.join(rl, "monitor", "trainer.jsonl")) == before
    result = CliRunner().invoke(app, ["run", "--config", staged["config"], *staged["overrides"]])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "stage grpo_small_sft: already finished (step 3 of 3); final weights (HF)" in out
    assert "stage grpo_small_rl: already finished (step 2 of 2); final weights (HF)" in out
    assert "resuming" not in out and "run finished" not in out


def test_a_shorter_try_in_a_finished_folder_says_why_in_one_line(staged):
    args = ["run", "--config", staged["config"], *staged["overrides"], "buffer.total_steps=1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    sft = os.path.join(staged["project"], "grpo_small_sft")
    assert " ".join(result.output.split()) == (
        f"error: stage grpo_small_sft: the run in {sft} is already past step 1 (it stopped at "
        "step 3); to run 1 step, give it another folder (name=... or checkpoint_root_dir=...) "
        "or start a new run (continue_from_checkpoint=false); to go on, ask for more than 3 "
        "steps (buffer.total_steps)"
    )
    assert "StopIteration" not in result.output


def test_debug_names_the_stage_and_the_weights_it_starts_from(staged, tmp_path):
    args = ["debug", "--config", staged["config"], "--tasks", "1", *staged["overrides"]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    final = os.path.join(staged["project"], "grpo_small_sft", "global_step_3", "hf")
    assert (
        f"debugging stage grpo_small_rl with grpo_small_sft's final weights (step 3): {final}"
    ) in " ".join(result.output.split())
    # the same config where the sft stage has not run: the base model, said so
    fresh = [*args, f"checkpoint_root_dir={tmp_path}"]
    result = CliRunner().invoke(app, fresh)
    assert result.exit_code == 0, result.output
    sft = os.path.join(tmp_path, "tests", "grpo_small_sft")
    out = " ".join(result.output.split())
    assert "debugging stage grpo_small_rl with the base model " in out
    assert (
        ": stage grpo_small_sft, whose final weights it starts from in a full run, has not been "
        f"run (no checkpoint in {sft})"
    ) in out
    assert not os.path.exists(sft)
