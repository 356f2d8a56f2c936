"""A short GRPO run with the replay buffer: experiences are trained on again after the
cooldown, counted in the trainer's metrics and in the experience buffer's store."""

import json
import os

import sqlalchemy as sa

from tests.integration.conftest import HERE, base_overrides
from trinity.runtime.launcher import run

CONFIG = os.path.join(HERE, "configs", "grpo_small.yaml")
COOLDOWN = 0.05


def test_replay_fills_short_batches_after_the_cooldown(
    tmp_path, micro_model, arithmetic_data, ray_cluster
):
    from trinity.buffer import SQLExperienceStore

    replay = "buffer.trainer_input.experience_buffer.replay_buffer"
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "buffer.explorer_input.default_workflow_type=half_math_workflow",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=3",
        "buffer.trainer_input.experience_buffer.name=exp_buffer",
        "buffer.trainer_input.experience_buffer.storage_type=queue",
        f"{replay}.enable=true",
        f"{replay}.reuse_cooldown_time={COOLDOWN}",
        f"{replay}.priority_fn=linear_decay_use_count_control_randomization",
        f"{replay}.priority_fn_args={{decay: 2.0, use_count_limit: 3}}",
    ]
    (result,) = run(CONFIG, overrides, [os.path.join(HERE, "plugins_replay")])
    with open(os.path.join(result.job_dir, "monitor", "trainer.jsonl")) as f:
        trainer = [json.loads(line) for line in f]
    assert [r["step"] for r in trainer] == [1, 2, 3]
    replayed = [r["buffer/replayed"] for r in trainer]
    # each explore step gives 2 of its 4 tasks' groups (8 rows) of a 16-row batch
    fresh = [r["sample/experience_count"] - r["buffer/replayed"] for r in trainer]
    assert fresh == [8, 8, 8]
    assert replayed[0] == 0  # nothing was consumed before step 1
    assert sum(replayed) > 0 and all(n <= 8 and n % 4 == 0 for n in replayed)  # whole groups
    assert max(r["buffer/use_count/max"] for r in trainer) >= 2

    store = SQLExperienceStore(
        os.path.join(result.job_dir, "buffer", "exp_buffer.db"), "exp_buffer"
    )
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(store.table.c.id, store.table.c.consumed_by)).all()
        uses = conn.execute(
            sa.select(store.uses.c.row_id, store.uses.c.by_step, store.uses.c.used_at)
        ).all()
    store.close()
    # every fresh row was consumed once, by the step of its explore step (exactly once)
    assert len(rows) == 24 and all(step is not None for _, step in rows)
    assert len(uses) == 24 + sum(replayed)  # one use per fresh read, one per replay
    by_row: dict = {}
    for row_id, step, at in sorted(uses, key=lambda u: u[2]):
        by_row.setdefault(row_id, []).append((step, at))
    reused = [times for times in by_row.values() if len(times) > 1]
    assert reused and all(len(times) <= 3 for times in by_row.values())  # use_count_limit
    for times in reused:  # a later train step each time, never before the cooldown passed
        for (s0, t0), (s1, t1) in zip(times, times[1:], strict=False):
            assert s1 > s0 and t1 - t0 >= COOLDOWN
