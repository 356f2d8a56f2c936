"""``service.data_juicer``: the Data-Juicer service started by the operator and used over HTTP
(skipped where Data-Juicer is not installed: ``pip install 'trinity-rft[data_juicer]'``)."""

import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("data_juicer")

from trinity.buffer.operators import DataJuicerOperator, TaskContext  # noqa: E402
from trinity.buffer.operators.dj_service import DataJuicerClient  # noqa: E402
from trinity.common.config.schema_misc import DataJuicerServiceConfig  # noqa: E402
from trinity.common.experience import Experience  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_auto_started_service_filters_and_scores_then_stops():
    port = free_port()
    service = DataJuicerServiceConfig(auto_start=True, port=port)
    op = DataJuicerOperator(
        operators=[{"text_length_filter": {"min_len": 0, "max_len": 4}}], service=service
    )
    assert op.client is None  # constructing (as the checks before Ray do) starts nothing
    try:
        rows = [{"q": "abc"}, {"q": "abcdefg"}]
        kept, _ = op.process_tasks(rows, TaskContext(["q"]))
        assert kept == [{"q": "abc"}]
        exps = [
            Experience(tokens=[1, 2], prompt_length=1, group_id="g", response_text=t, reward=0.0)
            for t in ("ok", "too long")
        ]
        out, _ = op.process_experiences(exps, whole_groups=False)
        assert [(e.response_text, e.info["text_len"]) for e in out] == [("ok", 2)]
        client = op.client
        assert client.healthy()
    finally:
        op.close()
    assert not client.healthy() and op.client is None


def test_a_server_whose_owner_died_exits():
    """An auto-started server outlives no owner (e.g. a killed explorer actor)."""
    port = free_port()
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trinity.buffer.operators.dj_service",
            "--port",
            str(port),
            "--owner-pid",
            str(owner.pid),
        ]
    )
    try:
        client = DataJuicerClient(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 120
        while not client.healthy():
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        owner.kill()
        owner.wait()
        assert server.wait(timeout=30) == 0
    finally:
        owner.kill()
        server.kill()


def test_service_reports_a_bad_recipe():
    port = free_port()
    client = DataJuicerClient(f"http://127.0.0.1:{port}")
    client.start(port)
    try:
        with pytest.raises(RuntimeError, match="Data-Juicer has no operator 'no_such_op'"):
            client.process([("no_such_op", {})], 1, [{"text": "x"}])
    finally:
        client.stop()
