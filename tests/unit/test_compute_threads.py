"""How compute actors share the machine's cores."""

from types import SimpleNamespace

import pytest

from trinity.runtime import roles


def _config(mode: str, engines: int = 1, offset: int = 0, ranks: int = 1, style: str = "fixed"):
    return SimpleNamespace(
        mode=mode,
        explorer=SimpleNamespace(rollout_model=SimpleNamespace(engine_num=engines)),
        synchronizer=SimpleNamespace(sync_offset=offset, sync_style=style),
        trainer=SimpleNamespace(cpu_ranks=ranks),
    )


@pytest.mark.parametrize(
    "mode, engines, offset, engine_threads, trainer_threads",
    [
        ("both", 1, 0, 8, 8),  # on-policy: engine and trainer take turns, each gets every core
        ("both", 2, 0, 4, 8),  # the two engines run together and split the cores
        ("both", 1, 1, 4, 4),  # one step ahead: engine and trainer overlap and split
        ("both", 3, 1, 2, 2),
        ("train", 1, 0, 8, 8),  # no engine in this stage
        ("explore", 2, 0, 4, 4),  # no trainer in this stage
    ],
)
def test_threads_follow_what_runs_at_the_same_time(
    monkeypatch, mode, engines, offset, engine_threads, trainer_threads
):
    monkeypatch.setattr(roles.os, "cpu_count", lambda: 8)
    config = _config(mode, engines, offset)
    assert roles.compute_threads(config, "engine") == engine_threads
    assert roles.compute_threads(config, "trainer") == trainer_threads


@pytest.mark.parametrize("style", ["explorer_driven", "trainer_driven"])
def test_dynamic_sync_styles_overlap_even_with_offset_0(monkeypatch, style):
    # the explorer never waits for an update: engine and trainer run at the same time
    monkeypatch.setattr(roles.os, "cpu_count", lambda: 8)
    config = _config("both", 1, 0, style=style)
    assert roles.compute_threads(config, "engine") == 4
    assert roles.compute_threads(config, "trainer") == 4


@pytest.mark.parametrize(
    "mode, offset, engine_threads, trainer_threads",
    [
        ("both", 0, 8, 4),  # taking turns with the engine, the two ranks split every core
        ("both", 1, 2, 2),  # engine and two ranks all overlap
        ("train", 0, 4, 4),
    ],
)
def test_trainer_ranks_split_the_cores(monkeypatch, mode, offset, engine_threads, trainer_threads):
    monkeypatch.setattr(roles.os, "cpu_count", lambda: 8)
    config = _config(mode, 1, offset, ranks=2)
    assert roles.compute_threads(config, "engine") == engine_threads
    assert roles.compute_threads(config, "trainer") == trainer_threads


def test_an_evaluation_is_one_engine_batch_not_a_training_batch():
    from types import SimpleNamespace

    from trinity.runtime.explorer_role import EVAL_ROWS_PER_ENGINE, runner_slots

    def config(mode: str, evals: list, engines: int = 1):
        return SimpleNamespace(
            explorer=SimpleNamespace(
                concurrent_mode=mode, rollout_model=SimpleNamespace(engine_num=engines)
            ),
            buffer=SimpleNamespace(
                batch_size=2, explorer_input=SimpleNamespace(eval_tasksets=evals, tasksets=[])
            ),
            algorithm=SimpleNamespace(repeat_times=4),
        )

    assert runner_slots(config("multi-threading", []), 2) == 4  # 2 tasks x 4 samples / 2
    # with a held-out set: an engine batch of eval tasks per engine, over the runners
    assert runner_slots(config("multi-threading", ["test"]), 2) == EVAL_ROWS_PER_ENGINE // 2
    assert runner_slots(config("asynchronous", ["test"], engines=2), 4) == EVAL_ROWS_PER_ENGINE // 2
    assert runner_slots(config("sequential", ["test"]), 2) == 1
