"""``mode: bench`` on a finished run: every checkpoint evaluated with the weights it saved."""

import os

import pytest

from tests.integration.conftest import base_overrides
from tests.integration.test_run import CONFIG, records
from trinity.runtime.launcher import run


def test_bench_evaluates_each_checkpoint_of_a_run(
    tmp_path, micro_model, arithmetic_data, ray_cluster, capsys, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "160")  # the table's width when printed to a pipe
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + ["buffer.total_steps=2"]
    (trained,) = run(CONFIG, overrides, [])  # 2 GRPO steps, a checkpoint after each
    job_dir = trained.job_dir
    with open(os.path.join(job_dir, "monitor", "explorer.jsonl")) as f:
        explorer_before = f.read()
    with open(os.path.join(job_dir, "config.yaml")) as f:
        config_before = f.read()
    capsys.readouterr()

    # The same YAML with mode bench; a new name would be a new (empty) run: the name stays.
    (bench,) = run(CONFIG, overrides + ["mode=bench", "continue_from_checkpoint=false"], [])
    assert bench.job_dir == job_dir

    # One record per checkpoint (step 0: the base model, eval_on_startup), in the bench
    # role's own file; the run's explorer records and config are left as they were.
    saved = records(job_dir, "bench")
    assert [r["step"] for r in saved] == [0, 1, 2]
    assert bench.bench == [{k: v for k, v in r.items() if k not in ("run", "time")} for r in saved]
    for r in saved:
        for key in ("accuracy", "reward", "response_length", "logprob"):
            assert f"bench/arith_test/{key}/mean" in r, key
    with open(os.path.join(job_dir, "monitor", "explorer.jsonl")) as f:
        assert f.read() == explorer_before
    with open(os.path.join(job_dir, "config.yaml")) as f:
        assert f.read() == config_before
    assert os.path.isfile(os.path.join(job_dir, "bench_config.yaml"))
    assert os.listdir(os.path.join(job_dir, "monitor", "tensorboard", "grpo_small_bench"))

    # Each checkpoint's own weights: where the run evaluated the same weights (steps 0 and
    # 2) bench gets the same greedy responses and their logprobs; those moved in between.
    evals = {
        r["step"]: r for r in records(job_dir, "explorer") if "eval/arith_test/reward/mean" in r
    }
    assert sorted(evals) == [0, 2]
    for step in (0, 2):
        for key in ("accuracy", "reward", "response_length"):
            name = f"arith_test/{key}/mean"
            assert saved[step][f"bench/{name}"] == evals[step][f"eval/{name}"]
        assert saved[step]["bench/arith_test/logprob/mean"] == pytest.approx(
            evals[step]["eval/arith_test/logprob/mean"], abs=1e-4
        )
    first, last = (saved[s]["bench/arith_test/logprob/mean"] for s in (0, 2))
    assert abs(first - last) > 1e-3

    # The table: a row per checkpoint.
    out = capsys.readouterr().out
    assert "bench of grpo_small" in out
    assert "arith_test accuracy" in out and "arith_test logprob" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("│")]
    assert [row[1] for row in rows[-3:]] == ["0", "1", "2"]

    # Only the newest checkpoint; the records are appended after the first bench's.
    run(CONFIG, overrides + ["mode=bench", "explorer.bench_on_latest_checkpoint=true"], [])
    assert [r["step"] for r in records(job_dir, "bench")] == [0, 1, 2, 2]
