"""Monitors without a server: the wandb sink in offline mode (its run files read back),
how a resumed job continues a tracker run, and the monitor checks made before Ray starts."""

import glob
import importlib.util
import json
import os
import struct

import pytest

from trinity.monitor import Monitor, read_metrics
from trinity.monitor.tracked_run import TrackedRun
from trinity.preflight.monitor_checks import monitor_problems

# A wandb run file is LevelDB's log format: a 7-byte file header, then 32 KiB blocks of
# records (crc32, length, kind) whose payloads, joined, are `Record` protobufs.
BLOCK = 32 * 1024
FULL, LAST = 1, 4


def wandb_records(path: str) -> list:
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B"
    records, pos, payload = [], 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # block padding
            pos += left
            continue
        payload += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            records.append(record)
            payload = b""
    return records


def history_row(record) -> dict:
    """A history record's metrics by name, with its step as ``step``."""
    items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
    row = {k: v for k, v in items.items() if not k.startswith("_")}
    return row | {"step": items["_step"]}


def wandb_attempts(job_dir: str) -> list:
    """(run id, run name, project, history rows) of each offline run, oldest first."""
    attempts = []
    pattern = os.path.join(job_dir, "monitor", "wandb", "offline-run-*", "run-*.wandb")
    for path in glob.glob(pattern):
        records = wandb_records(path)
        kinds = [r.WhichOneof("record_type") for r in records]
        run = records[kinds.index("run")].run
        rows = [history_row(r) for r, kind in zip(records, kinds, strict=True) if kind == "history"]
        start = run.start_time.ToNanoseconds()  # folder names repeat within a second
        attempts.append((start, (run.run_id, run.display_name, run.project, rows)))
    return [attempt for _, attempt in sorted(attempts, key=lambda a: a[0])]


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home"))


def log_steps(job_dir: str, steps: range, keep_until: int, scale: float = 1.0) -> None:
    monitor = Monitor(job_dir, "proj", "exp", "trainer", "wandb", {}, keep_until=keep_until)
    for step in steps:
        monitor.log({"loss": scale * step / 2, "tokens": 10 * step}, step)
    monitor.close()


def test_wandb_offline_run_holds_every_logged_step(tmp_path, wandb_offline):
    job_dir = str(tmp_path / "job")
    log_steps(job_dir, range(1, 4), keep_until=0)
    ((run_id, name, project, rows),) = wandb_attempts(job_dir)
    assert (name, project) == ("exp_trainer", "proj")
    assert rows == [
        {"loss": 0.5, "tokens": 10, "step": 1},
        {"loss": 1.0, "tokens": 20, "step": 2},
        {"loss": 1.5, "tokens": 30, "step": 3},
    ]
    assert [r["step"] for r in read_metrics(os.path.join(job_dir, "monitor", "trainer.jsonl"))] == [
        1,
        2,
        3,
    ]


def test_resumed_job_continues_the_wandb_run_without_resending_steps(tmp_path, wandb_offline):
    job_dir = str(tmp_path / "job")
    log_steps(job_dir, range(1, 4), keep_until=0)  # killed after step 3, checkpoint at 2
    log_steps(job_dir, range(3, 6), keep_until=2, scale=10.0)  # redoes 3, goes on to 5
    (first_id, _, _, first), (second_id, _, _, second) = wandb_attempts(job_dir)
    assert second_id == first_id  # one run across the restart
    assert [r["step"] for r in first] == [1, 2, 3]
    # step 3 is in the run already (with the first attempt's value): not sent again
    assert second == [
        {"loss": 20.0, "tokens": 40, "step": 4},
        {"loss": 25.0, "tokens": 50, "step": 5},
    ]
    # the JSON lines drop the killed attempt's step 3 and hold the redone one
    jsonl = read_metrics(os.path.join(job_dir, "monitor", "trainer.jsonl"))
    assert [(r["step"], r["loss"]) for r in jsonl] == [
        (1, 0.5),
        (2, 1.0),
        (3, 15.0),
        (4, 20.0),
        (5, 25.0),
    ]
    log_steps(job_dir, range(1, 2), keep_until=0)  # started over from scratch: a new run
    assert wandb_attempts(job_dir)[-1][0] != first_id


def test_tracked_run_repeats_a_step_of_this_attempt_but_not_of_the_killed_one(tmp_path):
    job_dir = str(tmp_path)
    fresh = TrackedRun(job_dir, "exp_explorer", "mlflow", keep_until=0)
    assert not fresh.resumed and fresh.wants(0)
    fresh.started("run-a")
    for step in (0, 1, 2, 2):  # the explorer logs an evaluation after a step's rollouts
        assert fresh.wants(step)
        fresh.sent(step)
    resumed = TrackedRun(job_dir, "exp_explorer", "mlflow", keep_until=1)
    assert resumed.resumed and resumed.run_id == "run-a"
    assert [resumed.wants(s) for s in (1, 2, 3)] == [False, False, True]
    other_role = TrackedRun(job_dir, "exp_trainer", "mlflow", keep_until=1)
    assert not other_role.resumed  # no state of its own: a new run


def config_of(monitor_type: str, **monitor_args):
    from trinity.common.config.schema_misc import MonitorConfig

    return type(
        "C", (), {"monitor": MonitorConfig(monitor_type=monitor_type, monitor_args=monitor_args)}
    )


def test_a_missing_extra_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    assert monitor_problems(config_of("mlflow")) == [
        "monitor.monitor_type = mlflow: the mlflow package is not installed; "
        "pip install 'trinity-rft[mlflow]'"
    ]


def test_monitor_args_are_held_to_the_sink_parameters():
    assert monitor_problems(config_of("wandb", api_keys="k", base_url="http://h")) == [
        "monitor.monitor_args.api_keys: monitor 'wandb' has no argument 'api_keys'; did you "
        "mean 'api_key'? (takes: base_url, api_key, entity, group, tags, notes, job_type)"
    ]
    assert monitor_problems(config_of("tensorboard", log_dir="x")) == [
        "monitor.monitor_args.log_dir: monitor 'tensorboard' has no argument 'log_dir' "
        "(takes: no arguments)"
    ]


def test_an_mlflow_uri_without_a_server_is_reported(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (problem,) = monitor_problems(config_of("mlflow", uri=f"http://127.0.0.1:{port}"))
    assert problem.startswith(f"monitor.monitor_args.uri = http://127.0.0.1:{port}: no MLflow")
    assert "mlflow server" in problem
    # a database store is opened by MLflow itself: nothing to probe
    assert monitor_problems(config_of("mlflow", uri=f"sqlite:///{tmp_path}/mlflow.db")) == []


@pytest.mark.parametrize("store", ["file://{}/mlruns", "{}/mlruns"])
def test_an_mlflow_file_store_is_refused_where_mlflow_refuses_it(tmp_path, monkeypatch, store):
    """MLflow 3 refuses its filesystem store unless MLFLOW_ALLOW_FILE_STORE is true; every
    role would die on it after Ray started."""
    from mlflow import environment_variables

    if not hasattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE"):
        pytest.skip("this MLflow still opens file stores")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri = store.format(tmp_path)
    (problem,) = monitor_problems(config_of("mlflow", uri=uri))
    assert problem.startswith(f"monitor.monitor_args.uri = {uri}: MLflow 3.")
    assert f"sqlite:///{tmp_path}/mlflow.db" in problem and "MLFLOW_ALLOW_FILE_STORE" in problem
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert monitor_problems(config_of("mlflow", uri=uri)) == []


@pytest.fixture
def no_wandb_login(tmp_path, monkeypatch):
    """No W&B key anywhere: environment, settings file or netrc."""
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    return tmp_path / "netrc"


def test_wandb_without_an_api_key_is_refused_before_start(no_wandb_login, monkeypatch):
    (problem,) = monitor_problems(config_of("wandb", base_url="http://wandb.local:8080"))
    assert problem.startswith("monitor.monitor_type = wandb: no W&B API key for http://wandb")
    assert "WANDB_API_KEY" in problem and "WANDB_MODE=offline" in problem
    key = "k" * 40
    no_wandb_login.write_text(f"machine wandb.local:8080\n  login user\n  password {key}\n")
    assert monitor_problems(config_of("wandb", base_url="http://wandb.local:8080")) == []
    assert len(monitor_problems(config_of("wandb", base_url="http://other.local"))) == 1
    assert monitor_problems(config_of("wandb", api_key=key)) == []
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert monitor_problems(config_of("wandb")) == []
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", key)
    assert monitor_problems(config_of("wandb")) == []


@pytest.mark.parametrize("name", ["grpo_example.yaml", "ppo_example.yaml"])
def test_the_verl_examples_pass_the_monitor_check(name, monkeypatch):
    """align-with-verl.md's examples log to wandb, as written (offline: no key here)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    from trinity.common.config import load_config

    config = load_config(os.path.join(os.path.dirname(__file__), "configs", name))
    assert config.monitor.monitor_type == "wandb"
    assert monitor_problems(config) == []


def test_the_trackers_environment_goes_to_the_role_actors(monkeypatch):
    from trinity.monitor import monitor_env

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ann")
    wandb_env, mlflow_env = monitor_env("wandb"), monitor_env("mlflow")
    assert wandb_env["WANDB_MODE"] == "offline" and all(k.startswith("WANDB_") for k in wandb_env)
    assert mlflow_env["MLFLOW_TRACKING_USERNAME"] == "ann" and "WANDB_MODE" not in mlflow_env
    assert monitor_env("tensorboard") == {}


def test_metric_names_mlflow_refuses_are_made_acceptable():
    pytest.importorskip("mlflow")
    from mlflow.utils.validation import _validate_metric_name

    from trinity.monitor.mlflow import metric_name

    name = metric_name("eval/gsm8k@test (hard)/accuracy/mean")
    assert name == "eval/gsm8k_test _hard_/accuracy/mean"
    _validate_metric_name(name)  # raises if MLflow would refuse it
    assert metric_name("rollout/time: step-1.5") == "rollout/time: step-1.5"


def test_wandb_init_takes_entity_group_tags_notes_and_job_type(tmp_path, wandb_offline):
    """What users set most on a W&B run reaches ``wandb.init``: read back from the run file."""
    job_dir = str(tmp_path / "job")
    args = {
        "entity": "my-team",
        "group": "ablation-1",
        "tags": ["grpo", "tiny"],
        "notes": "lr sweep",
        "job_type": "train",
    }
    assert monitor_problems(config_of("wandb", **args)) == []  # checked before start too
    monitor = Monitor(job_dir, "proj", "exp", "trainer", "wandb", args, keep_until=0)
    monitor.log({"loss": 1.0}, 1)
    monitor.close()
    (path,) = glob.glob(os.path.join(job_dir, "monitor", "wandb", "offline-run-*", "run-*.wandb"))
    records = wandb_records(path)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.entity, run.run_group, list(run.tags)) == (
        "my-team",
        "ablation-1",
        ["grpo", "tiny"],
    )
    assert (run.notes, run.job_type, run.display_name) == ("lr sweep", "train", "exp_trainer")
