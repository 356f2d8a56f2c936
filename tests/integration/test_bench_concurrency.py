"""Smoke test: bench/concurrency.py runs both modes end to end (2 steps, micro model)."""

import importlib.util
import json
import os

from tests.integration.conftest import HERE

BENCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "concurrency.py")


def test_concurrency_bench_writes_report(tmp_path, micro_model, arithmetic_data, ray_cluster):
    spec = importlib.util.spec_from_file_location("bench_concurrency", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "concurrency.json"
    argv = ["--model", micro_model, "--data", arithmetic_data["rl"], "--steps", "2"]
    argv += ["--batch-size", "4", "--repeat-times", "2", "--rounds", "1"]
    report = bench.main(argv + ["--workdir", str(tmp_path / "runs"), "--out", str(out)])
    assert [r["mode"] for r in report["runs"]] == ["multi-threading", "asynchronous"]
    for run in report["runs"]:
        assert len(run["explore_step_s"]) == 2 and run["tasks_failed"] == 0
        assert run["samples_per_s"] > 0 and run["wall_s"] > run["explore_s_total"]
        assert 0 < run["engine_busy_s"] < run["explore_s_total"]
    assert report["ratio"] > 0 and "asynchronous/multi-threading" in report["summary"]
    assert json.loads(out.read_text())["summary"] == report["summary"]
