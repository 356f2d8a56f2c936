"""``synchronizer.sync_style`` explorer_driven, trainer_driven and fully_async: whole GRPO runs on
the micro model. Which train steps published weights, which versions the explorer used, step by
step, and the staleness bound (``synchronizer.max_staleness``) in every style: what is written
is trained on or dropped as stale and counted, nothing else.
"""

import os
import sqlite3

import pytest

from tests.integration.conftest import HERE, base_overrides
from tests.integration.test_run import records, staged_config
from trinity.runtime.launcher import run

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")


def _run(tmp_path, micro_model, arithmetic_data, style, *extra):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        f"synchronizer.sync_style={style}",
        "synchronizer.sync_interval=2",
        "buffer.total_steps=6",
        "explorer.eval_interval=100",  # step 0 and the final weights only
        "trainer.save_interval=0",
        # the explorer may run far ahead of the trainer here: no experience is dropped as
        # stale, so each train step reads one explore step (the bound has its own tests)
        "synchronizer.max_staleness=12",
        *extra,
    ]
    (result,) = run(CONFIG, overrides, [])
    trainer, explorer = records(result.job_dir, "trainer"), records(result.job_dir, "explorer")
    published = [r["step"] for r in trainer if "time/sync_weights" in r]
    versions = [int(r["rollout/model_version"]) for r in explorer if "rollout/model_version" in r]
    evals = [r["step"] for r in explorer if "eval/arith_test/accuracy/mean" in r]
    return trainer, published, versions, evals


def test_explorer_driven_publishes_only_when_asked(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    trainer, published, versions, evals = _run(
        tmp_path, micro_model, arithmetic_data, "explorer_driven"
    )
    # each train step reads one explore step's 16 experiences, from any explore step
    assert [r["step"] for r in trainer] == [1, 2, 3, 4, 5, 6]
    # the explorer asked before explore steps 3 and 5; the trainer answered each ask at the
    # end of a step (two asks before one answer are answered once), never otherwise
    assert 1 <= len(published) <= 2 and published == sorted(published)
    assert len(versions) == 6 and versions[:2] == [0, 0]  # no ask before step 3
    assert versions == sorted(versions) and set(versions) <= {0, *published}
    assert evals == [0, 6]  # the last evaluation: the trainer's final weights


def test_trainer_driven_publishes_every_interval(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    trainer, published, versions, evals = _run(
        tmp_path, micro_model, arithmetic_data, "trainer_driven"
    )
    assert [r["step"] for r in trainer] == [1, 2, 3, 4, 5, 6]
    assert published == [2, 4, 6]  # every sync_interval train steps, whatever the explorer does
    # the explorer loads whatever is newest at each step boundary, never waiting
    assert len(versions) == 6 and versions == sorted(versions)
    assert set(versions) <= {0, 2, 4, 6} and versions[0] == 0
    assert evals == [0, 6]


def test_fully_async_writes_every_step_once_on_the_newest_weights(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    trainer, published, versions, evals = _run(
        tmp_path, micro_model, arithmetic_data, "fully_async"
    )
    assert [r["step"] for r in trainer] == [1, 2, 3, 4, 5, 6]
    assert published == [2, 4, 6]  # as trainer_driven: every sync_interval train steps
    assert len(versions) == 6 and versions[0] == 0 and set(versions) <= {0, 2, 4, 6}
    assert evals == [0, 6]
    assert all(r["staleness/dropped"] == 0 for r in trainer)  # a bound it never reaches
    # a trained experience's age: the versions between its weights and the updated ones
    assert max(r["staleness/max"] for r in trainer) <= 5


@pytest.mark.parametrize(
    "style, bound",
    [("fixed", 0), ("explorer_driven", 0), ("trainer_driven", 0), ("fully_async", 0)],
)
def test_the_staleness_bound_holds_and_every_experience_is_trained_or_counted(
    tmp_path, micro_model, arithmetic_data, ray_cluster, style, bound
):
    """Bound 0 (on-policy only): in the dynamic styles the explorer waits for the weights
    each step needs instead of exploring ahead on older ones, so nothing is explored only to
    be dropped; whatever is dropped all the same is counted on a trainer.jsonl row."""
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        f"synchronizer.sync_style={style}",
        f"synchronizer.max_staleness={bound}",
        "buffer.total_steps=4",
        "explorer.eval_interval=100",
        "buffer.explorer_input.eval_tasksets=[]",
        "trainer.save_interval=0",
    ]
    (result,) = run(CONFIG, overrides, [])
    trainer = records(result.job_dir, "trainer")
    assert trainer, "no train step"
    assert all(r.get("staleness/max", 0) <= bound for r in trainer)
    last = trainer[-1]["step"]
    with sqlite3.connect(os.path.join(result.job_dir, "buffer", "experience_buffer.db")) as db:
        (written,) = db.execute("SELECT COUNT(*) FROM experience_buffer").fetchone()
        (unread,) = db.execute(
            "SELECT COUNT(*) FROM experience_buffer WHERE consumed_by IS NULL"
        ).fetchone()
        (by_trained_steps,) = db.execute(
            "SELECT COUNT(*) FROM experience_buffer WHERE consumed_by <= ?", (last,)
        ).fetchone()
    trained = sum(r.get("sample/experience_count", 0) for r in trainer)
    dropped = sum(r["staleness/dropped"] for r in trainer)
    assert written == 4 * 16 and unread == 0 and by_trained_steps == written
    # every experience written is trained on or counted as dropped, the end included
    assert trained + dropped == written
    assert dropped == 0 and last == 4 and trained == written


def test_a_staged_run_trains_fully_async_after_its_sft_stage(
    tmp_path, micro_model, arithmetic_data, ray_cluster, caplog
):
    """The quickstart's pipeline: SFT warm-up, then asynchronous GRPO. The global
    ``sync_style`` applies to the stage that explores and trains; the sft stage says it
    ignores it."""
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "synchronizer.sync_style=fully_async",
        "stages.1.buffer.total_steps=2",
        "buffer.explorer_input.eval_tasksets=[]",
    ]
    with caplog.at_level("WARNING", logger="trinity.config"):
        sft, rl = run(staged_config(tmp_path, arithmetic_data), overrides, [])
    assert [r["step"] for r in records(sft.job_dir, "trainer")] == [1, 2]
    assert [r["step"] for r in records(rl.job_dir, "trainer")] == [1, 2]
    with open(os.path.join(rl.job_dir, "config.yaml")) as f:
        assert "sync_style: fully_async" in f.read()
    with open(os.path.join(sft.job_dir, "config.yaml")) as f:
        assert "sync_style: fixed" in f.read()
    notes = [r.getMessage() for r in caplog.records]
    assert any(
        n.startswith("stage 'sft' (mode train) ignores synchronizer.sync_style") for n in notes
    )
