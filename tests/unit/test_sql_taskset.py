"""`sql` tasksets on SQLite and a real PostgreSQL server: rows in key order, JSON columns, bad
rows named by table and row id, and the checks before start (tables, columns, servers)."""

import textwrap

import pytest
import sqlalchemy as sa

from tests.pg import PASSWORD
from trinity.buffer import TaskReader, load_rows
from trinity.common.config import ConfigError, load_config
from trinity.common.config.schema_buffer import StorageConfig
from trinity.preflight.before_start import check_before_start


def make_table(url: str, rows, name: str = "tasks") -> None:
    """Table ``name`` (id, question, answer, messages JSON) holding ``rows``, inserted in the
    order given (ids need not be)."""
    engine = sa.create_engine(url)
    table = sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("question", sa.Text),
        sa.Column("answer", sa.Text),
        sa.Column("messages", sa.JSON),
    )
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), rows)
    engine.dispose()


def row(i: int, **changes) -> dict:
    values = {"id": i, "question": f"{i}+1", "answer": str(i + 1), "messages": None}
    return {**values, **changes}


def taskset(url: str, **changes) -> StorageConfig:
    values = dict(
        name="tasks",
        storage_type="sql",
        path=url,
        format={"prompt_key": "question", "response_key": "answer"},
    )
    return StorageConfig(**{**values, **changes})


def test_rows_come_in_key_order_with_json_columns_decoded(database):
    chat = [{"role": "user", "content": "hi"}]
    make_table(database, [row(3), row(1, messages=chat), row(2)])
    reader = TaskReader(taskset(database))
    tasks = reader.read_all()
    assert [t.raw_task["question"] for t in tasks] == ["1+1", "2+1", "3+1"]
    assert tasks[0].raw_task["messages"] == chat and tasks[0].taskset_name == "tasks"
    assert [t.raw_task["question"] for t in reader.read(2)] == ["1+1", "2+1"]


def test_bad_rows_are_named_by_table_and_row_id(database):
    make_table(database, [row(1), row(2, question=None), row(3), row(7, answer=None)])
    with pytest.raises(ValueError) as info:
        load_rows(taskset(database), path_label="buffer.explorer_input.tasksets[0]")
    text = str(info.value)
    assert text.startswith("buffer.explorer_input.tasksets[0] (table 'tasks' of ")
    assert "2 malformed rows of 4: row id 2: 'question' is null" in text
    assert "row id 7: 'answer' is null" in text
    assert PASSWORD not in text
    skipped = TaskReader(taskset(database, skip_bad_rows=True))
    assert len(skipped) == 2 and skipped.num_skipped == 2


def test_text_that_is_not_json_fails_its_row_only(tmp_path):
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    make_table(url, [row(1, messages=[{"role": "user", "content": "x"}])])
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO tasks VALUES (2, '2+1', '3', '[{\"role\": ')"))
    engine.dispose()
    with pytest.raises(ValueError, match=r"row id 2: 'messages' is not valid JSON"):
        load_rows(taskset(url))
    assert len(load_rows(taskset(url, skip_bad_rows=True))) == 1


def test_a_missing_table_or_column_is_named(database):
    make_table(database, [row(1)], name="other")
    with pytest.raises(ValueError, match=r"has no table 'tasks' .*; tables there: other"):
        load_rows(taskset(database))
    wrong = taskset(database, name="other", format={"prompt_key": "q", "response_key": "answer"})
    with pytest.raises(ValueError, match=r"column\(s\) \['q'\] named in `format` are missing"):
        load_rows(wrong)


def test_a_missing_sqlite_file_is_not_created(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rows(taskset(str(tmp_path / "none.db")))
    assert not (tmp_path / "none.db").exists()


CONFIG = """
checkpoint_root_dir: {root}
model: {{model_path: {model}, max_prompt_tokens: 40, max_response_tokens: 4}}
algorithm: {{algorithm_type: grpo, repeat_times: 2}}
buffer:
  batch_size: 2
  explorer_input:
    default_workflow_type: math_workflow
    taskset:
      name: tasks
      storage_type: sql
      path: '{tasks}'
      format: {{prompt_key: question, response_key: answer}}
  trainer_input:
    experience_buffer: {{name: exps, storage_type: {buffer_type}, path: '{buffer}'}}
"""


def config_with(tmp_path, micro_model, tasks: str, buffer: str, buffer_type: str = "sql"):
    text = CONFIG.format(
        root=tmp_path / "ck", model=micro_model, tasks=tasks, buffer=buffer, buffer_type=buffer_type
    )
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(text))
    return load_config(str(path))


@pytest.mark.parametrize("buffer_type", ["sql", "queue"])
def test_a_run_on_postgres_passes_the_checks_before_start(
    tmp_path, micro_model, postgres_server, buffer_type
):
    url = postgres_server.new_database()
    make_table(url, [row(i) for i in range(4)])
    config = config_with(tmp_path, micro_model, url, url, buffer_type)
    (stage,) = check_before_start(config)
    assert stage.buffer.explorer_input.tasksets[0].storage_type == "sql"
    assert stage.buffer.trainer_input.experience_buffer.storage_type == buffer_type


def test_unreachable_server_and_bad_rows_are_reported_before_start(
    tmp_path, micro_model, postgres_server
):
    tasks = postgres_server.new_database()
    make_table(tasks, [row(0), row(1, question=None), row(2), row(3)])
    dead = postgres_server.url().replace(f":{postgres_server.port}/", ":1/")
    with pytest.raises(ConfigError) as info:
        check_before_start(config_with(tmp_path, micro_model, tasks, dead))
    problems = info.value.problems
    assert any(
        p.startswith("buffer.explorer_input.tasksets[0] (table 'tasks' of postgresql+psycopg:")
        and "row id 1: 'question' is null" in p
        for p in problems
    ), problems
    assert any(
        p.startswith(
            "buffer.trainer_input.experience_buffer.path: cannot connect to database "
            "postgresql+psycopg://trinity:***@127.0.0.1:1/postgres"
        )
        for p in problems
    ), problems
    assert PASSWORD not in str(info.value)


def test_a_json_file_or_a_url_that_is_none_are_config_errors(tmp_path, micro_model):
    tasks = f"sqlite:///{tmp_path / 'tasks.db'}"
    make_table(tasks, [row(i) for i in range(4)])
    for buffer, expected in [
        (str(tmp_path / "b.json"), "backing the queue with a JSON file is not supported yet"),
        ("sqlite://", "in-memory SQLite database"),
        ("postgresql+psycopg://u:pw@host:port/x", "is not a database URL"),
    ]:
        with pytest.raises(ConfigError) as info:
            check_before_start(config_with(tmp_path, micro_model, tasks, buffer))
        assert any(
            p.startswith("buffer.trainer_input.experience_buffer") and expected in p
            for p in info.value.problems
        ), info.value.problems
