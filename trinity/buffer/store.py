"""Persistent experience stores: what makes the experience queue survive a crash.

A store keeps every experience put into the queue with its explore step and the train step
that consumed it; on restart the queue reloads the unconsumed ones, in the order they were
written. Rows hold data only (``codec``): reading a store never runs code from it.

``SQLExperienceStore`` keeps them in any database SQLAlchemy reaches: a SQLite file or a
server such as PostgreSQL (``postgresql+psycopg://user:password@host/db``), which several
processes may write and read at once.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from functools import cached_property
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import sqlalchemy as sa

from trinity.buffer.codec import decode_experience, encode_experience
from trinity.common.experience import Experience
from trinity.utils.database import (
    DatabaseError,
    create_engine,
    database_url,
    error_text,
    masked_url,
)

# Ids per UPDATE ... WHERE id IN (...): SQLite allows 32766 bound parameters per statement.
_IDS_PER_STATEMENT = 10000


class StoreError(OSError):
    """The experience buffer could not be written (disk full, database error)."""


class ExperienceStore(ABC):
    """Durable log of experiences tagged with their explore step, and who consumed them.

    Ids increase in write order. A row is unconsumed until a train step reads it; the
    finished explore steps are recorded even when they produced nothing.
    """

    @abstractmethod
    def add(self, exps: Sequence[Experience], step: int) -> List[int]:
        """Write explore step ``step`` (its experiences, and that it finished) durably and
        atomically; return the rows' ids, in order."""

    @abstractmethod
    def mark_consumed(self, ids: Sequence[int], by_step: int) -> None:
        """Record that train step ``by_step`` read rows ``ids``."""

    @abstractmethod
    def unconsume_after(self, step: int) -> int:
        """Make rows consumed by train steps after ``step`` unconsumed again; how many."""

    @abstractmethod
    def unconsumed(self) -> List[Tuple[int, int, Experience]]:
        """All (id, explore step, experience) rows not consumed, oldest first."""

    @abstractmethod
    def finished_steps(self) -> List[int]:
        """Every explore step written so far."""

    @abstractmethod
    def close(self) -> None:
        """Release resources (connections, files)."""


def buffer_database(storage: Any, job_dir: str) -> str:
    """The database URL of experience buffer ``storage``: its ``path`` (a SQLite file or any
    SQLAlchemy URL), else ``<job_dir>/buffer/<name>.db``. Resolved by the caller's process, so
    a relative file means the same file to every actor."""
    path = storage.path or os.path.join(job_dir, "buffer", f"{storage.name}.db")
    return database_url(path)


class SQLExperienceStore(ExperienceStore):
    """Experiences in one table of a SQL database (via SQLAlchemy), one row per experience,
    and the finished explore steps in a second table, ``<table>_steps``.

    ``path`` is a SQLite file path or any SQLAlchemy URL. Several processes may use one
    store: each explore step is written in one transaction, and writers take turns (SQLite's
    database lock; on PostgreSQL a lock on the steps table), so ids increase in the order
    steps are committed and a reader that has seen id ``n`` never finds a new row below it.
    """

    def __init__(self, path: str, table_name: str = "experiences") -> None:
        if os.path.splitext(path)[1].lower() in (".json", ".jsonl"):
            raise ValueError(
                f"experience store path '{path}': backing the queue with a JSON file is not "
                "supported yet; use a SQLite file such as 'sqlite:///buffer.db'"
            )
        self.url = database_url(path)
        self.where = f"{masked_url(self.url)} (table '{table_name}')"
        try:
            self.engine = create_engine(self.url)
        except DatabaseError as exc:
            raise StoreError(f"experience buffer: {exc}") from None
        metadata = sa.MetaData()
        self.table = sa.Table(
            table_name,
            metadata,
            # BIGINT on servers; SQLite needs INTEGER for its rowid primary key
            sa.Column("id", _ID, primary_key=True, autoincrement=True),
            sa.Column("eid", sa.Text, index=True),
            sa.Column("group_id", sa.Text),
            sa.Column("step", sa.Integer, index=True),  # the explore step that produced it
            sa.Column("model_version", sa.Integer),
            sa.Column("reward", sa.Float, nullable=True),
            sa.Column("created_at", sa.Float),  # unix time of the write
            sa.Column("consumed_by", sa.Integer, nullable=True, index=True),  # train step
            sa.Column("data", sa.LargeBinary),  # codec.encode_experience: data, never code
            sqlite_autoincrement=True,  # never reuse ids, so order = write order
        )
        self.steps = sa.Table(
            f"{table_name}_steps",
            metadata,
            sa.Column("step", sa.Integer, primary_key=True),
            sa.Column("count", sa.Integer),
            sa.Column("created_at", sa.Float),
        )
        with self._errors("open"):
            self._create(metadata)

    def _create(self, metadata: sa.MetaData) -> None:
        """Create the tables unless they exist with the right columns."""
        _check_columns(self.engine, self.table, self.where, main=True)
        _check_columns(self.engine, self.steps, self.where, main=False)
        _refuse_legacy_table(self.engine, self.table.name, self.where)
        for attempt in range(3):
            try:
                metadata.create_all(self.engine)  # only what does not exist yet
                return
            except sa.exc.DBAPIError:
                # another process of the run created one between the check and the create
                if attempt == 2:
                    raise

    def add(self, exps: Sequence[Experience], step: int) -> List[int]:
        now = time.time()
        rows = [
            dict(
                eid=exp.eid,
                group_id=exp.group_id,
                step=step,
                model_version=exp.model_version,
                reward=None if exp.reward is None else float(exp.reward),
                created_at=now,
                consumed_by=None,
                data=encode_experience(exp),
            )
            for exp in exps
        ]
        # One transaction: the step's rows and its "finished" record, all or none.
        insert = self.table.insert().returning(self.table.c.id, sort_by_parameter_order=True)
        with self._errors(f"write explore step {step} to"), self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Writers take turns, so ids are handed out in commit order. EXCLUSIVE mode
                # still lets readers read.
                name = conn.dialect.identifier_preparer.format_table(self.steps)
                conn.execute(sa.text(f"LOCK TABLE {name} IN EXCLUSIVE MODE"))
            ids = [row.id for row in conn.execute(insert, rows)] if rows else []
            conn.execute(self.steps.insert().values(step=step, count=len(rows), created_at=now))
        return ids

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Database errors as one line naming the database and table."""
        try:
            yield
        except sa.exc.IntegrityError as exc:
            raise StoreError(
                f"cannot {what} the experience buffer {self.where}: {error_text(exc)} (was "
                "this step written already, by another explorer using the same table?)"
            ) from None
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(
                f"cannot {what} the experience buffer {self.where}: {error_text(exc)}"
            ) from None

    def mark_consumed(self, ids: Sequence[int], by_step: int) -> None:
        ids = list(ids)
        if not ids:
            return
        with self._errors(f"record what train step {by_step} read in"):
            with self.engine.begin() as conn:
                for start in range(0, len(ids), _IDS_PER_STATEMENT):
                    chunk = ids[start : start + _IDS_PER_STATEMENT]
                    conn.execute(
                        self.table.update()
                        .where(self.table.c.id.in_(chunk))
                        .values(consumed_by=by_step)
                    )

    def unconsume_after(self, step: int) -> int:
        with self._errors(f"put back what train steps after {step} read in"):
            with self.engine.begin() as conn:
                result = conn.execute(
                    self.table.update()
                    .where(self.table.c.consumed_by > step)
                    .values(consumed_by=None)
                )
        return result.rowcount

    def unconsumed(self) -> List[Tuple[int, int, Experience]]:
        query = (
            sa.select(self.table.c.id, self.table.c.step, self.table.c.data)
            .where(self.table.c.consumed_by.is_(None))
            .order_by(self.table.c.id)
        )
        with self._errors("read"), self.engine.connect() as conn:
            rows = list(conn.execute(query))
        return [(row.id, row.step, self._decode(row.id, row.data)) for row in rows]

    def _decode(self, row_id: int, data: bytes) -> Experience:
        try:
            return decode_experience(data)
        except ValueError as exc:
            raise ValueError(f"experience buffer {self.where}, row id {row_id}: {exc}") from None

    def finished_steps(self) -> List[int]:
        with self._errors("read"), self.engine.connect() as conn:
            return [row.step for row in conn.execute(sa.select(self.steps.c.step))]

    def close(self) -> None:
        self.engine.dispose()

    # ---- replay bookkeeping (trinity/buffer/replay.py) --------------------------------------
    @cached_property
    def uses(self) -> sa.Table:
        """``<table>_uses``: one row per use of an experience by a train step, written only
        with replay on (the table is created on first use)."""
        table = sa.Table(
            f"{self.table.name}_uses",
            self.table.metadata,
            sa.Column("id", _ID, primary_key=True, autoincrement=True),
            sa.Column("row_id", sa.BigInteger, index=True),  # id in the experiences table
            sa.Column("by_step", sa.Integer, index=True),  # the train step that used it
            sa.Column("used_at", sa.Float),  # unix time of the use
        )
        with self._errors("open"):
            table.create(self.engine, checkfirst=True)
        return table

    def record_uses(self, ids: Sequence[int], by_step: int, at: float) -> None:
        """Record that train step ``by_step`` used rows ``ids`` (fresh or replayed) at ``at``."""
        if not ids:
            return
        rows = [dict(row_id=i, by_step=by_step, used_at=at) for i in ids]
        with self._errors(f"record what train step {by_step} reused in"):
            with self.engine.begin() as conn:
                conn.execute(self.uses.insert(), rows)

    def forget_uses_after(self, step: int) -> int:
        """Delete the uses by train steps after ``step``; how many."""
        with self._errors(f"forget what train steps after {step} reused in"):
            with self.engine.begin() as conn:
                result = conn.execute(self.uses.delete().where(self.uses.c.by_step > step))
        return result.rowcount

    def replay_candidates(self) -> List[Tuple[int, int, str, int, int, Optional[float]]]:
        """(id, explore step, group id, model version, uses, last use time) of every consumed
        row, oldest first; uses 0 and time None for a row consumed without replay on."""
        t, u = self.table, self.uses
        query = (
            sa.select(
                t.c.id,
                t.c.step,
                t.c.group_id,
                t.c.model_version,
                sa.func.count(u.c.id),
                sa.func.max(u.c.used_at),
            )
            .select_from(t.outerjoin(u, u.c.row_id == t.c.id))
            .where(t.c.consumed_by.is_not(None))
            .group_by(t.c.id, t.c.step, t.c.group_id, t.c.model_version)
            .order_by(t.c.id)
        )
        with self._errors("read"), self.engine.connect() as conn:
            return [tuple(row) for row in conn.execute(query)]

    def experiences(self, ids: Sequence[int]) -> Dict[int, Experience]:
        """The experiences of rows ``ids``, by id."""
        ids, found = list(ids), {}
        with self._errors("read"), self.engine.connect() as conn:
            for start in range(0, len(ids), _IDS_PER_STATEMENT):
                chunk = ids[start : start + _IDS_PER_STATEMENT]
                query = sa.select(self.table.c.id, self.table.c.data).where(
                    self.table.c.id.in_(chunk)
                )
                found.update(
                    {row.id: self._decode(row.id, row.data) for row in conn.execute(query)}
                )
        return found

    # ---- decoupled runs: a reader in another process (trinity/buffer/store_follower.py) ------
    def unconsumed_after(self, last_id: int) -> List[Tuple[int, int, Experience]]:
        """The unconsumed (id, explore step, experience) rows with ids above ``last_id``,
        oldest first: what a reader that has seen up to ``last_id`` has not seen yet."""
        t = self.table
        query = (
            sa.select(t.c.id, t.c.step, t.c.data)
            .where(t.c.consumed_by.is_(None), t.c.id > last_id)
            .order_by(t.c.id)
        )
        with self._errors("read"), self.engine.connect() as conn:
            rows = list(conn.execute(query))
        return [(row.id, row.step, self._decode(row.id, row.data)) for row in rows]

    @cached_property
    def marks(self) -> sa.Table:
        """``<table>_marks``: named flags of the run, such as the explorer's end mark (the
        table is created on first use)."""
        table = sa.Table(
            f"{self.table.name}_marks",
            self.table.metadata,
            sa.Column("name", sa.String(64), primary_key=True),
            sa.Column("at", sa.Float),  # unix time it was set
        )
        with self._errors("open"):
            try:
                table.create(self.engine, checkfirst=True)
            except sa.exc.DBAPIError:  # the other process created it first
                if not sa.inspect(self.engine).has_table(table.name):
                    raise
        return table

    def set_explorer_finished(self, finished: bool) -> None:
        """Set (the explorer wrote its last step) or clear (it starts) the end mark."""
        marks = self.marks
        with self._errors("mark the explorer's end in"), self.engine.begin() as conn:
            conn.execute(marks.delete().where(marks.c.name == _EXPLORER_FINISHED))
            if finished:
                conn.execute(marks.insert().values(name=_EXPLORER_FINISHED, at=time.time()))

    def explorer_finished(self) -> bool:
        """Whether the explorer's end mark is set: no more steps will be written."""
        marks = self.marks
        query = sa.select(marks.c.name).where(marks.c.name == _EXPLORER_FINISHED)
        with self._errors("read"), self.engine.connect() as conn:
            return conn.execute(query).first() is not None


_EXPLORER_FINISHED = "explorer_finished"
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _check_columns(engine: sa.Engine, table: sa.Table, where: str, main: bool) -> None:
    """An existing table must have the store's columns. Stores written before steps were
    accounted hold pickled rows without step tags: they are named as such."""
    inspector = sa.inspect(engine)
    if not inspector.has_table(table.name):
        return
    found = [c["name"] for c in inspector.get_columns(table.name)]
    missing = [c.name for c in table.columns if c.name not in found]
    if not missing:
        return
    if main and "consumed" in found and "consumed_by" in missing:  # the pre-step layout
        raise ValueError(
            f"experience buffer {where} was written by an older Trinity version (rows without "
            "explore steps); start a new run (continue_from_checkpoint: false) or move the file"
        )
    raise ValueError(
        f"experience buffer {where}: table '{table.name}' exists without the column(s) "
        f"{missing} (it has {found}); it is not an experience buffer: name another table "
        "(the storage's `name`) or database"
    )


def _refuse_legacy_table(engine: sa.Engine, table_name: str, where: str) -> None:
    """Buffers used to be one table named ``experiences`` whatever the buffer's name; a run
    resumed from one would start from an empty table and never read the rows left there."""
    inspector = sa.inspect(engine)
    if table_name == "experiences" or inspector.has_table(table_name):
        return
    if not inspector.has_table("experiences"):
        return
    if "consumed_by" in {c["name"] for c in inspector.get_columns("experiences")}:
        raise ValueError(
            f"experience buffer {where}: the database holds the table 'experiences' written "
            f"by an older Trinity version, which named every buffer's table so; rename it "
            f"(ALTER TABLE experiences RENAME TO {table_name}, and experiences_steps to "
            f"{table_name}_steps) to resume from it"
        )
