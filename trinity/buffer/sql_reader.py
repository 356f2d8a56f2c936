"""Rows of a `sql` storage: one table of a SQL database, each row a task (or SFT row).

``path`` is a SQLite file or any SQLAlchemy URL; the table is the storage's ``name``. Its
columns are the row's columns, as a file's keys are: ``format.prompt_key`` names one, and so
on. Rows come in primary-key order (SQLite: insertion order when there is no key). Columns
declared ``JSON`` (``JSON``/``JSONB`` on PostgreSQL) hold lists and objects, such as a
``messages`` column; their text is parsed here, so a row that is not JSON is named like any
other bad row. The rows then go through the same row checks as a file's (``file_reader``).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Tuple

import sqlalchemy as sa

from trinity.buffer.file_parsers import FileRows
from trinity.utils.database import (
    DatabaseError,
    create_engine,
    database_url,
    error_text,
    masked_url,
    sqlite_file,
)

logger = logging.getLogger("trinity.buffer")


class TableError(ValueError):
    """A table that cannot be read; the message names the database (password masked)."""


def table_label(storage: Any) -> str:
    """``table 'tasks' of sqlite:///data/tasks.db``: where a `sql` storage's rows are."""
    return f"table '{storage.name}' of {masked_url(storage.path or '')}"


def read_table(storage: Any, label: str) -> FileRows:
    """Every row of table ``storage.name`` at ``storage.path``, oldest first, as ``FileRows``
    whose rows are numbered by their integer primary key (``row id 7``) when the table has
    one, else by position (``row 7``). ``label`` starts every message."""
    try:
        url = database_url(storage.path)
    except ValueError as exc:
        raise TableError(f"{label}: {exc}") from None
    file = sqlite_file(url)
    if file is not None and not os.path.exists(file):
        raise FileNotFoundError(f"{label}: the SQLite file '{file}' does not exist")
    try:
        engine = create_engine(url)
    except DatabaseError as exc:
        raise TableError(f"{label}: {exc}") from None
    try:
        with engine.connect() as conn:
            return _read(conn, storage, label)
    except sa.exc.SQLAlchemyError as exc:
        raise TableError(f"{label}: {error_text(exc)}") from None
    finally:
        engine.dispose()


def _read(conn: sa.Connection, storage: Any, label: str) -> FileRows:
    inspector = sa.inspect(conn)
    if not inspector.has_table(storage.name):
        tables = ", ".join(inspector.get_table_names()) or "(none)"
        raise TableError(
            f"{label}: the database has no table '{storage.name}' (the storage's `name` is "
            f"its table); tables there: {tables}"
        )
    table = sa.Table(storage.name, sa.MetaData(), autoload_with=conn)
    # psycopg hands PostgreSQL's json/jsonb over decoded (and the server checked them);
    # other drivers hand over the text
    decoded = conn.dialect.name == "postgresql"
    json_columns = [c.name for c in table.columns if isinstance(c.type, sa.JSON) and not decoded]
    # JSON columns are fetched as the stored text, so a malformed value fails its row only.
    selected = [
        sa.type_coerce(c, sa.Text).label(c.name) if c.name in json_columns else c
        for c in table.columns
    ]
    query = sa.select(*selected)
    key = list(table.primary_key.columns)
    if key:
        query = query.order_by(*key)
    elif conn.dialect.name == "sqlite":
        query = query.order_by(sa.literal_column("rowid"))
    else:
        logger.warning(
            "%s: the table has no primary key, so its rows come in the order the database "
            "returns them; give it one (e.g. id SERIAL PRIMARY KEY) for a fixed order",
            label,
        )
    rows = [dict(row._mapping) for row in conn.execute(query)]
    unit, numbers = _numbering(rows, key)
    part = FileRows(masked_url(storage.path), unit, numbers, rows=rows)
    part.mark_bad(_parse_json(rows, json_columns))
    return part


def _numbering(rows: List[Dict[str, Any]], key: List[sa.Column]) -> Tuple[str, List[int]]:
    """Rows are named by an integer primary key when there is one (what a user can look up)."""
    if len(key) == 1 and all(isinstance(r[key[0].name], int) for r in rows):
        return "row id", [r[key[0].name] for r in rows]
    return "row", list(range(1, len(rows) + 1))


def _parse_json(rows: List[Dict[str, Any]], columns: List[str]) -> Dict[int, str]:
    """Parse the JSON columns' text in place; the rows where it is not JSON, with why."""
    bad: Dict[int, str] = {}
    for index, row in enumerate(rows):
        for column in columns:
            value = row[column]
            if not isinstance(value, str):  # NULL, or already decoded by the driver
                continue
            try:
                row[column] = json.loads(value)
            except json.JSONDecodeError as exc:
                bad.setdefault(index, f"'{column}' is not valid JSON ({exc})")
    return bad
