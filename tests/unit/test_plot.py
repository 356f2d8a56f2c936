"""trinity plot: one PNG per run with the panels its metrics fill."""

import json
import os

from typer.testing import CliRunner

from trinity.cli.main import app
from trinity.monitor.plot import job_dirs, panels, plot_run


def write(job_dir, role, records):
    os.makedirs(os.path.join(job_dir, "monitor"), exist_ok=True)
    with open(os.path.join(job_dir, "monitor", f"{role}.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def grpo_run(job_dir):
    write(
        job_dir,
        "explorer",
        [
            {"step": 0, "eval/t/accuracy/mean": 0.1, "eval/t/logprob/mean": -3.0},
            {"step": 1, "rollout/reward/mean": 0.2, "rollout/reward/max": 1.0},
            {"step": 2, "rollout/reward/mean": 0.5, "eval/t/accuracy/mean": 0.4},
        ],
    )
    write(
        job_dir,
        "trainer",
        [
            {"step": 1, "actor/pg_loss": 0.3, "actor/kl_loss": 0.01, "critic/rewards/mean": 0.2},
            {"step": 2, "actor/pg_loss": None, "actor/kl_loss": 0.02, "actor/lr": 1e-3},
        ],
    )


def test_a_grpo_run_gets_reward_eval_and_loss_panels(tmp_path):
    grpo_run(str(tmp_path))
    shown = dict(panels(str(tmp_path)))
    assert list(shown) == ["training reward", "evaluation", "losses"]
    # the explorer's reward wins over the trainer's copy; max/min and logprobs are not drawn
    assert shown["training reward"] == {"rollout/reward/mean": [(1, 0.2), (2, 0.5)]}
    assert shown["evaluation"] == {"eval/t/accuracy/mean": [(0, 0.1), (2, 0.4)]}
    # a NaN written as null is skipped; the lr is not a loss
    assert shown["losses"] == {
        "actor/pg_loss": [(1, 0.3)],
        "actor/kl_loss": [(1, 0.01), (2, 0.02)],
    }
    path = plot_run(str(tmp_path))
    assert path == os.path.join(str(tmp_path), "monitor", "plots.png")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_an_sft_stage_gets_only_its_loss(tmp_path):
    write(str(tmp_path), "trainer", [{"step": 1, "actor/sft_loss": 2.0, "actor/lr": 1e-3}])
    assert panels(str(tmp_path)) == [("losses", {"actor/sft_loss": [(1, 2.0)]})]


def test_nothing_logged_gives_no_png(tmp_path):
    write(str(tmp_path), "trainer", [])
    assert plot_run(str(tmp_path)) is None
    assert not os.path.exists(os.path.join(str(tmp_path), "monitor", "plots.png"))


def test_the_cli_plots_every_run_of_a_project_folder(tmp_path):
    grpo_run(str(tmp_path / "exp_sft"))
    grpo_run(str(tmp_path / "exp_rl"))
    assert job_dirs(str(tmp_path)) == [str(tmp_path / "exp_rl"), str(tmp_path / "exp_sft")]
    result = CliRunner().invoke(app, ["plot", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert os.path.isfile(tmp_path / "exp_rl" / "monitor" / "plots.png")
    assert os.path.isfile(tmp_path / "exp_sft" / "monitor" / "plots.png")
    missing = CliRunner().invoke(app, ["plot", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "holds no run" in missing.output
