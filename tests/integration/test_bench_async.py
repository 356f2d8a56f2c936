"""Smoke test: bench/async.py runs two sync schedules end to end (2 steps, micro model)."""

import importlib.util
import os

import pytest

from tests.integration.conftest import HERE

BENCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "async.py")


@pytest.mark.slow
@pytest.mark.bench
def test_async_bench_writes_report(tmp_path, micro_model, arithmetic_data, ray_cluster):
    spec = importlib.util.spec_from_file_location("bench_async", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    quickstart = tmp_path / "qs"
    (quickstart / "data").mkdir(parents=True)
    os.symlink(arithmetic_data["rl"], quickstart / "data" / "rl")
    out = tmp_path / "async.json"
    argv = ["--sft-checkpoint", micro_model, "--data", str(quickstart), "--steps", "2"]
    argv += ["--sides", "fixed,explorer_driven", "--eval-interval", "1", "--out", str(out)]
    report = bench.main(argv)
    runs = report["runs"]
    assert [r["side"] for r in runs] == ["fixed", "explorer_driven"]
    assert all(r["wall_s"] > 0 and len(r["accuracy"]) == 3 for r in runs)
    assert all(0 < r["loop_s"] < r["wall_s"] and r["startup_s"] > 0 for r in runs)
    # the quickstart's batch: 16 tasks x 8 rollouts per step
    assert all(r["samples"] == 2 * 16 * 8 and r["samples_per_s"] > 0 for r in runs)
    assert runs[0]["model_versions"] == [0, 1] and runs[0]["mean_staleness"] == 0
    assert len(runs[1]["model_versions"]) == 2 and runs[1]["train_steps"] == 2
    assert report["speedup"]["fixed"] == 1.0 and report["speedup"]["explorer_driven"] > 0
    assert out.exists() and "explorer_driven loop" in report["summary"]
