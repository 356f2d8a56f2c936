"""Smoke test: bench/async.py runs both sync offsets end to end (2 steps, micro model)."""

import importlib.util
import os

from tests.integration.conftest import HERE

BENCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "async.py")


def test_async_bench_writes_report(tmp_path, micro_model, arithmetic_data, ray_cluster):
    spec = importlib.util.spec_from_file_location("bench_async", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    quickstart = tmp_path / "qs"
    (quickstart / "data").mkdir(parents=True)
    os.symlink(arithmetic_data["rl"], quickstart / "data" / "rl")
    out = tmp_path / "async.json"
    argv = ["--sft-checkpoint", micro_model, "--data", str(quickstart), "--steps", "2"]
    report = bench.main(argv + ["--eval-interval", "1", "--out", str(out)])
    assert [r["sync_offset"] for r in report["runs"]] == [0, 1]
    assert all(r["wall_s"] > 0 and len(r["accuracy"]) == 3 for r in report["runs"])
    assert all(0 < r["loop_s"] < r["wall_s"] and r["startup_s"] > 0 for r in report["runs"])
    assert report["speedup"] > 0 and report["run_speedup"] > 0 and out.exists()
    assert "x loop" in report["summary"]
