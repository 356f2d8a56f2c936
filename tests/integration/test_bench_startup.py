"""bench/startup.py end to end: one round of the floor and of ``trinity run`` (short stages)."""

import json

import pytest

from bench import startup


@pytest.mark.slow
@pytest.mark.bench
def test_startup_bench_reports_floor_and_run(tmp_path):
    out = tmp_path / "startup.json"
    argv = ["--repeats", "1", "--sft-steps", "2", "--grpo-steps", "1"]
    report = startup.main(argv + ["--workdir", str(tmp_path / "work"), "--out", str(out)])

    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    floor = report["floor"]["median"]
    assert 0 < floor["imports_s"] <= floor["ready_s"] <= floor["first_step_s"]
    run = report["checkouts"]["current"]["median"]
    assert 0 < run["first_step_s"] < run["wall_s"]
    assert run["arithmetic_sft_to_first_step_s"] == run["first_step_s"]
    assert run["arithmetic_grpo_to_first_step_s"] > 0
    # the quickstart runs in trinity run's own process: no Ray, no other process
    assert run["peak_processes"] == 1 and run["peak_pss_mb"] > 0
