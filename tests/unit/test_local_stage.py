"""Which stages run in the launcher's process (``runtime/local_stage.py``) and which on Ray."""

from types import SimpleNamespace

import pytest

from trinity.preflight.hosting import ray_reasons, runs_in_process


def served(engine_type):
    return SimpleNamespace(engine_type=engine_type, engine_num=1, tensor_parallel_size=1)


def stage(
    mode="train",
    storage_type="file",
    cpu_ranks=1,
    node_num=1,
    timeline=False,
    in_process=True,
    engine_type="transformers",
    env_vars=None,
    sync_method="memory",
    by_node=False,
    auxiliary=(),
    gpus=0,
):
    buffer = SimpleNamespace(storage_type=storage_type)
    return SimpleNamespace(
        mode=mode,
        buffer=SimpleNamespace(trainer_input=SimpleNamespace(experience_buffer=buffer)),
        trainer=SimpleNamespace(cpu_ranks=cpu_ranks),
        cluster=SimpleNamespace(node_num=node_num, in_process=in_process, gpu_per_node=gpus),
        monitor=SimpleNamespace(enable_ray_timeline=timeline),
        log=SimpleNamespace(group_by_node=by_node),
        synchronizer=SimpleNamespace(sync_method=sync_method),
        explorer=SimpleNamespace(
            rollout_model=served(engine_type),
            auxiliary_models=[served(t) for t in auxiliary],
            env_vars=env_vars or {},
        ),
    )


@pytest.mark.parametrize(
    "config",
    [
        stage(),  # SFT, DPO... on files
        stage(mode="both", storage_type="queue"),
        stage(mode="explore", storage_type="queue", engine_type="external"),
        stage(mode="bench"),
        stage(mode="both", storage_type="queue", engine_type="tinker"),  # a client of a service
        stage(mode="both", storage_type="queue", sync_method="checkpoint", auxiliary=["external"]),
        stage(mode="both", storage_type="queue", gpus=1),  # trainer and engine share it
        stage(mode="colocate", storage_type="queue", gpus=1),
    ],
)
def test_one_node_stages_with_what_this_process_can_host_run_here(monkeypatch, config):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert runs_in_process(config), ray_reasons(config)


@pytest.mark.parametrize(
    "reason, config",
    [
        ("the trainer reads a separate explore run's store", stage(storage_type="queue")),
        ("trainer.cpu_ranks > 1", stage(cpu_ranks=2)),
        ("cluster.node_num > 1", stage(mode="both", storage_type="queue", node_num=2)),
        ("monitor.enable_ray_timeline", stage(timeline=True)),
        ("cluster.in_process is false", stage(mode="both", in_process=False)),
        ("log.group_by_node", stage(by_node=True)),
        ("engine_type plugin_engine", stage(mode="both", engine_type="plugin_engine")),
        (
            "engine_type plugin_engine",
            stage(mode="both", auxiliary=["transformers", "plugin_engine"]),
        ),
        ("explorer.env_vars (set per runner process)", stage(mode="both", env_vars={"A": "1"})),
        (
            "synchronizer.sync_method nccl on GPUs",
            stage(mode="both", sync_method="nccl", gpus=1),
        ),
        (
            "2 GPUs (cluster.node_num x gpu_per_node), each role on its own",
            stage(mode="both", storage_type="queue", gpus=2),
        ),
    ],
)
def test_other_stages_run_on_ray_and_say_why(monkeypatch, reason, config):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not runs_in_process(config)
    assert ray_reasons(config) == [reason]


def test_a_train_stage_ignores_explorer_settings(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert runs_in_process(stage(engine_type="vllm", env_vars={"A": "1"}))


def test_a_cluster_the_user_names_is_used(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert ray_reasons(stage(mode="both")) == ["RAY_ADDRESS names a cluster"]


def test_a_vllm_engine_runs_in_the_stage_process(monkeypatch):
    """vLLM starts processes of its own from the engine's host: no Ray needed."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert runs_in_process(stage(mode="both", engine_type="vllm", auxiliary=["vllm"]))
