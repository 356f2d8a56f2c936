"""kill -9 of a ``mode: serve`` run and its outside client, twice, then both again to the
end (``bench/kill_matrix.py``'s serve style): every committed reply is written once and
trained on once; none is lost, none trained twice."""

import json

from bench import kill_matrix


def test_serve_killed_twice_trains_every_committed_reply_once(tmp_path):
    out = tmp_path / "kill.json"
    kill_matrix.main(["--kills", "2", "--steps", "4", "--styles", "serve", "--out", str(out)])
    (serve,) = json.loads(out.read_text())["styles"]
    assert serve["final_returncode"] == 0, serve.get("final_output")
    assert serve["train_steps"] == 4
    assert serve["written"] == serve["replies_committed"] > 0  # each committed reply once
    assert serve["trained"] + serve["dropped_as_stale"] == serve["written"]
    assert serve["lost"] == serve["twice"] == 0
    assert serve["train_steps_logged_twice"] == 0
