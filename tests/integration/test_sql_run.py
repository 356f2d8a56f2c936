"""A GRPO run whose tasks come from SQL tables (PostgreSQL and SQLite) and whose experience
buffer is a PostgreSQL table: every experience written is read once, by the step it fed."""

import json
import os

import sqlalchemy as sa

from tests.integration.conftest import base_overrides
from tests.integration.test_run import CONFIG, records
from trinity.buffer import SQLExperienceStore
from trinity.runtime.launcher import run


def copy_to_table(jsonl: str, url: str, table_name: str) -> int:
    """The rows of ``jsonl`` as table ``table_name`` (id, question, answer); how many."""
    with open(jsonl) as f:
        rows = [json.loads(line) for line in f]
    engine = sa.create_engine(url)
    table = sa.Table(
        table_name,
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("question", sa.Text),
        sa.Column("answer", sa.Text),
    )
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(
            table.insert(),
            [
                {"id": i, "question": r["question"], "answer": r["answer"]}
                for i, r in enumerate(rows)
            ],
        )
    engine.dispose()
    return len(rows)


def test_tasks_and_experiences_in_sql(
    tmp_path, micro_model, arithmetic_data, postgres_server, ray_cluster
):
    pg = postgres_server.new_database()
    lite = f"sqlite:///{tmp_path / 'eval.db'}"
    copy_to_table(os.path.join(arithmetic_data["rl"], "train.jsonl"), pg, "arith_train")
    n_eval = copy_to_table(os.path.join(arithmetic_data["rl"], "test.jsonl"), lite, "arith_test")
    overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
        "buffer.total_steps=2",
        "explorer.eval_on_startup=false",
        "buffer.explorer_input.taskset.storage_type=sql",
        f"buffer.explorer_input.taskset.path='{pg}'",
        "buffer.explorer_input.eval_tasksets.0.storage_type=sql",
        f"buffer.explorer_input.eval_tasksets.0.path='{lite}'",
        f"buffer.trainer_input.experience_buffer={{name: exps, storage_type: sql, path: '{pg}'}}",
    ]
    (result,) = run(CONFIG, overrides, [])

    explorer = records(result.job_dir, "explorer")
    evals = [r for r in explorer if "eval/arith_test/accuracy/mean" in r]
    assert [r["step"] for r in evals] == [2]  # the eval taskset, read from SQLite
    assert [r["step"] for r in records(result.job_dir, "trainer")] == [1, 2]

    store = SQLExperienceStore(pg, "exps")
    assert store.unconsumed() == []  # every experience was read
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(store.table.c.step, store.table.c.consumed_by)).all()
    store.close()
    # 2 steps x batch_size 4 x repeat_times 4, each read by the train step of its explore step
    assert sorted(rows) == [(1, 1)] * 16 + [(2, 2)] * 16
    assert n_eval == 16


def test_two_runs_share_one_sqlite_buffer_file(tmp_path, micro_model, arithmetic_data, ray_cluster):
    """An existing SQLite file (a resumed or shared buffer) is written in place, each run in its
    own table; it was refused before start as a file blocking the folders below it."""
    shared = tmp_path / "shared" / "buffer.db"
    url = f"sqlite:///{shared}"
    for name in ("first", "second"):
        overrides = base_overrides(tmp_path, micro_model, arithmetic_data) + [
            "buffer.total_steps=1",
            "explorer.eval_on_startup=false",
            f"name={name}",
            f"buffer.trainer_input.experience_buffer={{name: exps_{name}, storage_type: sql, "
            f"path: '{url}'}}",
        ]
        (result,) = run(CONFIG, overrides, [])
        assert [r["step"] for r in records(result.job_dir, "trainer")] == [1]
    for name in ("first", "second"):
        store = SQLExperienceStore(url, f"exps_{name}")
        with store.engine.connect() as conn:
            steps = conn.execute(sa.select(store.table.c.consumed_by)).scalars().all()
        store.close()
        assert steps == [1] * 16  # batch_size 4 x repeat_times 4, read by step 1
