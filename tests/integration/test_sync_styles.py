"""``synchronizer.sync_style`` explorer_driven and trainer_driven: whole GRPO runs on the micro
model. Which train steps published weights, and which versions the explorer used, step by step.
"""

import os

from tests.integration.conftest import HERE, base_overrides
from tests.integration.test_run import records
from trinity.runtime.launcher import run

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")


def _run(tmp_path, micro_model, arithmetic_data, style):
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        f"synchronizer.sync_style={style}",
        "synchronizer.sync_interval=2",
        "buffer.total_steps=6",
        "explorer.eval_interval=100",  # step 0 and the final weights only
        "trainer.save_interval=0",
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
