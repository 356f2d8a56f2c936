"""Which stages run in the launcher's process (``runtime/local_stage.py``) and which on Ray."""

from types import SimpleNamespace

import pytest

from trinity.runtime.local_stage import runs_in_process


def stage(mode="train", storage_type="file", cpu_ranks=1, node_num=1, timeline=False):
    buffer = SimpleNamespace(storage_type=storage_type)
    return SimpleNamespace(
        mode=mode,
        buffer=SimpleNamespace(trainer_input=SimpleNamespace(experience_buffer=buffer)),
        trainer=SimpleNamespace(cpu_ranks=cpu_ranks),
        cluster=SimpleNamespace(node_num=node_num),
        monitor=SimpleNamespace(enable_ray_timeline=timeline),
    )


def test_a_train_stage_on_files_with_one_rank_runs_here(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert runs_in_process(stage())


@pytest.mark.parametrize(
    "why, config",
    [
        ("an explorer", stage(mode="both", storage_type="queue")),
        ("a separate explore run's store", stage(storage_type="queue")),
        ("several trainer ranks", stage(cpu_ranks=2)),
        ("several nodes", stage(node_num=2)),
        ("the Ray timeline", stage(timeline=True)),
    ],
)
def test_other_stages_run_on_ray(monkeypatch, why, config):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not runs_in_process(config), why


def test_a_cluster_the_user_names_is_used(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert not runs_in_process(stage())
