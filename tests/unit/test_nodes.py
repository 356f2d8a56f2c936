"""``cluster.node_num``: config checks, node counts, placement of roles, threads, log paths."""

import os
import textwrap
from types import SimpleNamespace

import pytest

import trinity.common.config.gpus as gpus_module
from trinity.common.config import ConfigError, load_config
from trinity.preflight.derive import finalize
from trinity.runtime import placement
from trinity.runtime.failures import log_file
from trinity.runtime.placement import Node, Placement
from trinity.runtime.roles import compute_threads

BASE = """
project: proj
name: exp
checkpoint_root_dir: /ck
model:
  model_path: /models/tiny
  max_prompt_tokens: 100
  max_response_tokens: 28
algorithm:
  algorithm_type: grpo
  repeat_times: 2
buffer:
  batch_size: 4
  explorer_input:
    taskset: {name: train, path: /data}
"""

HEAD, WORKER = Node("a" * 56, "10.0.0.1", 8), Node("b" * 56, "10.0.0.2", 4)
THIRD = Node("c" * 56, "10.0.0.3", 2)


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    monkeypatch.setattr(gpus_module, "detect_gpu_count", lambda: 0)
    # a cluster to join: without one, several nodes are this machine's lack (hardware.py)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")


def finalized(tmp_path, overrides):
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(BASE))
    return finalize(load_config(str(path), list(overrides)))


def problems(tmp_path, overrides):
    with pytest.raises(ConfigError) as excinfo:
        finalized(tmp_path, overrides)
    return excinfo.value.problems


def test_two_nodes_on_cpus_are_accepted(tmp_path):
    assert finalized(tmp_path, ["cluster.node_num=2"]).cluster.node_num == 2


def test_nodes_with_gpus_are_not_supported_yet(tmp_path):
    found = problems(tmp_path, ["cluster.node_num=2", "cluster.gpu_per_node=8"])
    (found,) = [p for p in found if p.startswith("cluster.node_num = 2 with cluster.gpu_")]
    assert "not supported yet" in found


def test_a_train_stage_on_several_nodes_is_refused(tmp_path):
    overrides = [
        "cluster.node_num=2",
        "mode=train",
        "buffer.trainer_input.experience_buffer.path=/d",
    ]
    found = [p for p in problems(tmp_path, overrides) if "node_num" in p]
    assert found == [
        "cluster.node_num = 2 with mode train: the trainer runs on one node (its ranks share a "
        "loopback process group), so the other nodes would stay idle; set cluster.node_num: 1"
    ]


def test_every_engine_node_needs_an_engine(tmp_path):
    (found,) = problems(tmp_path, ["cluster.node_num=3"])  # 1 engine, 2 engine nodes
    assert found.startswith("explorer.rollout_model.engine_num = 1 with cluster.node_num = 3")
    assert "set engine_num >= 2" in found
    ok = finalized(tmp_path, ["cluster.node_num=3", "explorer.rollout_model.engine_num=2"])
    assert ok.cluster.node_num == 3


def _stage(mode="both", nodes=2, engines=1, ranks=1, name="exp"):
    return SimpleNamespace(
        name=name,
        mode=mode,
        cluster=SimpleNamespace(node_num=nodes),
        explorer=SimpleNamespace(rollout_model=SimpleNamespace(engine_num=engines)),
        synchronizer=SimpleNamespace(sync_offset=0, sync_style="fixed"),
        trainer=SimpleNamespace(cpu_ranks=ranks),
    )


def test_one_node_pins_nothing():
    plan = Placement.plan(_stage(nodes=1), [HEAD, WORKER])
    assert plan == Placement() and plan.engine_node(0) is None and plan.explorer_node is None
    assert placement.pinned(None) == {}


def test_both_mode_puts_the_trainer_on_the_first_node_and_engines_on_the_others():
    plan = Placement.plan(_stage(nodes=3, engines=3), [HEAD, WORKER, THIRD])
    assert plan.trainer_node == HEAD and plan.explorer_node == WORKER
    assert [plan.engine_node(i) for i in range(4)] == [WORKER, THIRD, WORKER, THIRD]
    assert plan.engines_on(WORKER, 3) == 2 and plan.engines_on(THIRD, 3) == 1
    strategy = placement.pinned(WORKER)["scheduling_strategy"]
    assert strategy.node_id == WORKER.node_id and strategy.soft is False


def test_explore_mode_spreads_engines_over_every_node():
    plan = Placement.plan(_stage(mode="explore", nodes=2, engines=2), [HEAD, WORKER, THIRD])
    assert plan.trainer_node is None
    assert [plan.engine_node(i) for i in range(2)] == [HEAD, WORKER]


def test_threads_split_the_cpus_of_the_actors_own_node(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the driver's machine: not used
    stage = _stage(nodes=3, engines=3, ranks=2)
    plan = Placement.plan(stage, [HEAD, WORKER, THIRD])
    # engines 0 and 2 share WORKER's 4 CPUs, engine 1 has THIRD's 2 to itself
    assert [plan.engine_threads(stage, i) for i in range(3)] == [2, 2, 2]
    assert compute_threads(stage, "trainer", HEAD.cpus) == 4  # 8 CPUs over 2 ranks
    assert Placement().engine_threads(_stage(nodes=1), 0) == 64  # one node: as before


def test_node_num_above_the_cluster_is_an_error(monkeypatch):
    monkeypatch.setattr(placement, "alive_nodes", lambda: [HEAD, WORKER])
    assert placement.check_node_count([_stage(nodes=2)]) == [HEAD, WORKER]
    with pytest.raises(ConfigError) as excinfo:
        placement.check_node_count([_stage(nodes=2, name="a"), _stage(nodes=3, name="b")])
    assert excinfo.value.problems == [
        "cluster.node_num = 3 (stage b) but the Ray cluster this run joined has 2 alive "
        "node(s): add nodes (`ray start --address=<head ip>:6379` on each) or lower "
        "cluster.node_num"
    ]


def test_several_nodes_without_a_cluster_to_join_are_this_machines_lack(tmp_path, monkeypatch):
    import sys

    from trinity.preflight.hardware import hardware_fixes

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray = sys.modules.get("ray")
    if ray is not None:
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(BASE))
    fixed, (fix,) = hardware_fixes(load_config(str(path), ["cluster.node_num=3"]))
    assert fix.problem.startswith("cluster.node_num = 3 needs a Ray cluster of 3 nodes, but ")
    assert (fix.override(), fixed.cluster.node_num) == ("cluster.node_num=1", 1)
    assert hardware_fixes(load_config(str(path)))[1] == []  # one node: a local Ray does
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a cluster: its nodes are counted
    assert hardware_fixes(load_config(str(path), ["cluster.node_num=3"]))[1] == []


def test_log_file_of_an_actor_grouped_by_node(tmp_path):
    config = SimpleNamespace(checkpoint_job_dir=str(tmp_path), log=SimpleNamespace())
    config.log.group_by_node = False
    assert log_file(config, "trainer") == os.path.join(tmp_path, "log", "trainer.log")
    config.log.group_by_node = True
    missing = log_file(config, "trainer")
    assert missing == os.path.join(tmp_path, "log", "<node ip>", "trainer.log")
    older, newer = tmp_path / "log" / "10.0.0.1", tmp_path / "log" / "10.0.0.2"
    for folder, mtime in ((older, 1_000), (newer, 2_000)):
        folder.mkdir(parents=True)
        (folder / "trainer.log").write_text("x")
        os.utime(folder / "trainer.log", (mtime, mtime))
    (older / "trainer_rank_1.log").write_text("x")
    assert log_file(config, "trainer") == str(newer / "trainer.log")
    assert log_file(config, "trainer_rank_1") == str(older / "trainer_rank_1.log")


def test_a_failure_names_the_log_in_its_node_folder(tmp_path):
    from trinity.runtime.failures import failure_message

    config = SimpleNamespace(
        name="exp",
        checkpoint_job_dir=str(tmp_path),
        log=SimpleNamespace(group_by_node=True),
        trainer=SimpleNamespace(name="trainer"),
        explorer=SimpleNamespace(name="explorer"),
    )
    (tmp_path / "log" / "127.0.0.2").mkdir(parents=True)
    (tmp_path / "log" / "127.0.0.2" / "trainer_rank_1.log").write_text("x")
    message = failure_message(RuntimeError("gloo timed out"), "trainer rank 1", config)
    assert message.splitlines()[:2] == [
        "stage 'exp': the trainer rank 1 failed: RuntimeError: gloo timed out",
        f"full log: {tmp_path / 'log' / '127.0.0.2' / 'trainer_rank_1.log'}",
    ]


def test_one_node_counts_nothing(monkeypatch):
    def no_ray():
        raise AssertionError("one node must not ask Ray for its nodes")

    monkeypatch.setattr(placement, "alive_nodes", no_ray)
    assert placement.check_node_count([_stage(nodes=1)]) == []
