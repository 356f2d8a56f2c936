"""Smoke test: bench/grpo_vs_trl.py runs Trinity and TRL end to end (2 steps, micro model)."""

import importlib.util
import json
import os

import pytest

from bench import grpo_vs_trl


def check_system(system: dict, samples_per_step: int) -> None:
    assert system["steps"] == 2 and system["samples"] == 2 * samples_per_step
    for key in ("wall_s", "startup_s", "loop_s", "eval_s", "samples_per_s"):
        assert system[key] > 0, key
    assert system["wall_s"] > system["loop_s"]
    curve = system["curve"]
    assert [p[0] for p in curve] == [0, 1, 2]
    assert [p[1] for p in curve] == [0, samples_per_step, 2 * samples_per_step]
    assert curve[0][2] == 0 and curve[1][2] <= curve[2][2] <= system["loop_s"] + 1e-6
    assert all(0.0 <= p[3] <= 1.0 for p in curve)
    assert system["final_accuracy"] == curve[-1][3]
    assert system["peak_memory"]["pss_mb"] > 0 and system["peak_memory"]["processes"] >= 1


@pytest.mark.slow
@pytest.mark.bench
def test_grpo_vs_trl_bench_writes_report(
    tmp_path, micro_model, arithmetic_data, ray_cluster, capsys
):
    quickstart = tmp_path / "qs"
    (quickstart / "data").mkdir(parents=True)
    os.symlink(arithmetic_data["rl"], quickstart / "data" / "rl")
    out, png = tmp_path / "report.json", tmp_path / "curve.png"
    has_trl = importlib.util.find_spec("trl") is not None
    argv = ["--preset", "micro", "--steps", "2", "--eval-interval", "1", "--target", "0.0"]
    argv += ["--sft-checkpoint", micro_model, "--data", str(quickstart)]
    argv += ["--workdir", str(tmp_path / "work"), "--out", str(out), "--plot", str(png)]
    report = grpo_vs_trl.main(argv + ["--systems", "trinity,trl" if has_trl else "trinity"])

    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert png.stat().st_size > 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == report["summary"]
    params = report["params"]
    assert (params["prompts_per_step"], params["samples_per_prompt"]) == (16, 8)
    assert params["steps"] == 2 and params["kl"] == "none"
    check_system(report["systems"]["trinity"], params["samples_per_step"])
    assert report["systems"]["trinity"]["time_to_target_s"] == 0  # target 0: met at step 0
    assert "to 0.0: reached at start (raise --target)" in report["summary"]

    pytest.importorskip("trl")  # the TRL half needs the `bench` extra
    check_system(report["systems"]["trl"], params["samples_per_step"])
    # Same checkpoint, same greedy decoding: the two step-0 accuracies agree.
    assert report["systems"]["trl"]["initial_accuracy"] == pytest.approx(
        report["systems"]["trinity"]["initial_accuracy"]
    )
    assert report["ratios"]["samples_per_s"] > 0 and report["ratios"]["time_to_target"] is None
