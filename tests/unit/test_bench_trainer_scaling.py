"""Smoke test of bench/trainer_scaling.py: a micro run with 1 and 2 ranks (spawned, no Ray)."""

import json
import os

import pytest

from bench import trainer_scaling


@pytest.mark.slow
@pytest.mark.bench
def test_trainer_scaling_reports_both_rank_counts_and_split_state(tmp_path, capsys):
    out = tmp_path / "trainer_scaling.json"
    args = ["--preset", "micro", "--rows", "4", "--prompt-tokens", "6", "--response-tokens", "4"]
    args += ["--micro-batch", "2", "--steps", "1", "--repeats", "1", "--cores", "2"]
    args += ["--malloc-mmap-threshold", "131072"]
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ
    returned = trainer_scaling.main(args + ["--out", str(out), "--cache-dir", str(tmp_path)])

    report = json.loads(out.read_text())
    assert report == json.loads(json.dumps(returned))
    # the ranks ran with the threshold; this process's environment is as it was
    assert report["config"]["malloc_mmap_threshold"] == 131072
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ
    one, two = report["one_rank"], report["two_ranks"]
    same = report["one_rank_same_threads"]
    assert (one["ranks"], len(one["per_rank"])) == (1, 1)
    assert (two["ranks"], len(two["per_rank"])) == (2, 2)
    assert (same["ranks"], len(same["per_rank"])) == (1, 1)
    assert [r["rank"] for r in two["per_rank"]] == [0, 1]
    # 2 cores: 2 threads for 1 rank, 1 each for 2 ranks, and the control's 1
    assert [s["threads_per_rank"] for s in (one, two, same)] == [2, 1, 1]
    for side in (one, two, same):
        assert side["tokens_per_step"] == 40  # 4 rows x (6 + 4) tokens
        assert side["tokens_per_s_best"] > 0 and len(side["rounds"]) == 1
        # the same update on every side: 1 rank and 2 summed shards give one loss
        assert side["sft_loss"] == pytest.approx(one["sft_loss"], abs=1e-5)

    whole = one["per_rank"][0]
    # float32 parameters of the whole model; AdamW keeps two moments per parameter
    assert whole["param_bytes"] == 4 * report["config"]["parameters"]
    assert whole["optimizer_state_bytes"] >= 2 * whole["param_bytes"]
    for rank in two["per_rank"]:
        assert rank["param_bytes"] == pytest.approx(whole["param_bytes"] / 2, rel=0.05)
        assert rank["grad_bytes"] == pytest.approx(whole["grad_bytes"] / 2, rel=0.05)
        held = rank["optimizer_state_bytes"]
        assert held == pytest.approx(whole["optimizer_state_bytes"] / 2, rel=0.05)
        assert rank["start_up_peak_rss_mb"] > 0 and rank["training_peak_rss_mb"] > 0
    assert sum(r["param_bytes"] for r in two["per_rank"]) == whole["param_bytes"]
    ratios = report["ratios"]["two_ranks_over_one_rank"]
    assert ratios["per_rank_param_plus_optimizer_bytes"] == pytest.approx(0.5, rel=0.05)
    assert capsys.readouterr().out.strip().splitlines()[-1] == report["summary"]
