"""A short ``bench/serve_load.py``: concurrent ``openai`` clients chat, reward and commit
against a ``mode: serve`` run while it trains; nothing fails, and every committed reply is
written once and trained once."""

import json

from bench import serve_load


def test_concurrent_clients_while_the_run_trains_commit_every_reply_exactly_once(tmp_path):
    out = tmp_path / "serve_load.json"
    serve_load.main(
        ["--model", "micro", "--clients", "4", "--seconds", "6", "--batch", "16"]
        + ["--out", str(out)]
    )
    report = json.loads(out.read_text())
    assert report["errors"] == {}
    assert report["train_steps_during_load"] >= 1  # the run trained under the load
    committed = report["replies_committed"]
    assert committed == report["replies_committed_seen_by_clients"] + report["topped_up"]
    assert committed == report["written"] == report["trained"] > 0
    assert report["lost"] == report["twice"] == report["train_steps_logged_twice"] == 0
    assert report["requests_per_s"] > 0
    chat = report["latency"]["chat"]
    assert chat["count"] + report["topped_up"] == report["replies_served"]  # all answered
    assert chat["p50_ms"] <= chat["p99_ms"]
    assert report["rss_mb_start"] > 0 and report["rss_mb_end"] > 0
