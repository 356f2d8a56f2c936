"""kill -9 of a ``mode: serve`` run and its outside client, twice, then both again to the
end (``bench/kill_matrix.py``'s serve style); and of a run under the load of concurrent
clients, who go on through the restart (``bench/serve_load.py``): every committed reply is
written once and trained on once (or, committed after the last train step took its batch,
left unread in the store for a continued run); none is lost, none trained twice."""

import json

import pytest

from bench import kill_matrix, serve_load


@pytest.mark.slow
def test_serve_killed_twice_trains_every_committed_reply_once(tmp_path):
    out = tmp_path / "kill.json"
    kill_matrix.main(["--kills", "2", "--steps", "4", "--styles", "serve", "--out", str(out)])
    (serve,) = json.loads(out.read_text())["styles"]
    assert serve["final_returncode"] == 0, serve.get("final_output")
    assert serve["train_steps"] == 4
    assert serve["written"] == serve["replies_committed"] > 0  # each committed reply once
    # the client goes on committing while the last step trains: those stay unread
    assert serve["trained"] + serve["dropped_as_stale"] + serve["unread"] == serve["written"]
    assert serve["lost"] == serve["twice"] == 0
    assert serve["train_steps_logged_twice"] == 0


@pytest.mark.slow
def test_serve_killed_under_concurrent_load_loses_and_repeats_nothing(tmp_path):
    out = tmp_path / "serve_load.json"
    args = ["--model", "micro", "--clients", "4", "--seconds", "12", "--kill-at", "4"]
    serve_load.main(args + ["--batch", "16", "--save", "2", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["kill"]["at_s"] >= 4
    assert set(report["errors"]) <= {"chat connection", "feedback connection"} | {
        "commit connection",
        "commit 409",  # a commit sent again after the restart had been recorded before it
    }
    committed = report["replies_committed"]
    assert committed == report["written"] == report["trained"] > 0
    assert report["lost"] == report["twice"] == report["train_steps_logged_twice"] == 0
    assert report["train_steps"] * 16 == committed
