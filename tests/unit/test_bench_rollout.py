"""Smoke test of bench/rollout.py: a micro run writes the report the lead quotes."""

import json

from bench import rollout


def test_rollout_bench_writes_report(tmp_path, capsys):
    out = tmp_path / "rollout.json"
    args = ["--preset", "micro", "--prompts", "2", "--samples", "2", "--tokens", "4"]
    args += ["--repeats", "2", "--threads", "1", "--out", str(out), "--cache-dir", str(tmp_path)]
    args += ["--decoders", "auto,static"]
    returned = rollout.main(args)

    report = json.loads(out.read_text())
    assert report == json.loads(json.dumps(returned))
    assert report["config"]["threads"] == 1
    (result,) = report["results"]
    assert result["preset"] == "micro" and result["parameters"] > 0
    for system in ("engine", "engine_static", "generate"):
        stats = result[system]
        # Both systems are forced to the same work: 2 prompts x 2 samples x 4 tokens = 16.
        assert stats["tokens"] == [16, 16]
        assert len(stats["seconds"]) == 2 and min(stats["seconds"]) > 0
        assert stats["tokens_per_s_best"] >= stats["tokens_per_s_median"] > 0
    assert result["ratio_best"] > 0 and result["ratio_median"] > 0
    assert set(result["ratios_median"]) == {"engine", "engine_static"}
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == report["summary"] and "micro" in printed[-1]
