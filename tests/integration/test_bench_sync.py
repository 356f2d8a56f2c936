"""Smoke test of bench/sync.py on the ~1M model: each default method runs the real sync path."""

import json

import pytest

from bench import sync


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.integration
def test_sync_bench_writes_report(tmp_path, ray_cluster, capsys):
    out = tmp_path / "sync.json"
    args = ["--size", "1m", "--repeats", "1", "--out", str(out)]
    returned = sync.main(args + ["--cache-dir", str(tmp_path), "--work-dir", str(tmp_path)])

    report = json.loads(out.read_text())
    assert report == json.loads(json.dumps(returned))
    (result,) = report["results"]
    assert result["size"] == "1m" and 0.9e6 < result["parameters"] < 1.2e6
    assert result["state_dict_bytes"] > 4 * result["parameters"] - 1  # float32, tied head
    for method in ("memory", "checkpoint", "nccl"):
        timing = result[method]
        assert timing["publish_s"] > 0 and timing["receive_s"] > 0
        assert timing["total_s"] == pytest.approx(timing["publish_s"] + timing["receive_s"])
        assert len(timing["rounds"]) == 1 and timing["best_total_s"] > 0
        assert timing["weights_match"] is True  # the engine really holds the trainer's weights
    assert capsys.readouterr().out.strip().splitlines()[-1] == report["summary"]
