"""Persistent experience stores: what makes the experience queue survive a crash.

A store keeps every experience put into the queue with its explore step and the train step
that consumed it; on restart the queue reloads the unconsumed ones, in the order they were
written. Rows hold data only (``codec``): reading a store never runs code from it.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Iterator, List, Sequence, Tuple

import sqlalchemy as sa

from trinity.buffer.codec import decode_experience, encode_experience
from trinity.common.experience import Experience


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


def sqlite_url(path: str) -> str:
    """SQLAlchemy URL for ``sqlite:///file.db`` or a plain file path (parent dirs created)."""
    if path.startswith("sqlite:///"):
        file_path = path[len("sqlite:///") :]
    elif "://" in path:
        raise ValueError(f"experience store path '{path}': only sqlite:/// URLs are supported")
    else:
        file_path = path
    if os.path.splitext(file_path)[1].lower() in (".json", ".jsonl"):
        raise ValueError(
            f"experience store path '{path}': backing the queue with a JSON file is not "
            "supported yet; use a SQLite file such as 'sqlite:///buffer.db'"
        )
    file_path = os.path.abspath(os.path.expanduser(file_path))
    os.makedirs(os.path.dirname(file_path), exist_ok=True)
    return f"sqlite:///{file_path}"


class SQLiteExperienceStore(ExperienceStore):
    """Experiences in one SQLite table (via SQLAlchemy), one row per experience, and the
    finished explore steps in a second table."""

    def __init__(self, path: str, table_name: str = "experiences") -> None:
        self.url = sqlite_url(path)
        self.engine = sa.create_engine(self.url, connect_args={"check_same_thread": False})
        _refuse_old_layout(self.engine, table_name, path)
        metadata = sa.MetaData()
        self.table = sa.Table(
            table_name,
            metadata,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("eid", sa.String(64), index=True),
            sa.Column("group_id", sa.String(256)),
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
        metadata.create_all(self.engine)

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
        with self._writing(f"explore step {step}"), self.engine.begin() as conn:
            ids = [row.id for row in conn.execute(insert, rows)] if rows else []
            conn.execute(self.steps.insert().values(step=step, count=len(rows), created_at=now))
        return ids

    @contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """Database errors as one line (SQLAlchemy's repeat the statement and its data)."""
        try:
            yield
        except sa.exc.DBAPIError as exc:
            raise StoreError(
                f"cannot write {what} to the experience buffer {self.url}: {exc.orig}"
            ) from None

    def mark_consumed(self, ids: Sequence[int], by_step: int) -> None:
        if not ids:
            return
        with self._writing(f"what train step {by_step} read"), self.engine.begin() as conn:
            conn.execute(
                self.table.update()
                .where(self.table.c.id.in_(list(ids)))
                .values(consumed_by=by_step)
            )

    def unconsume_after(self, step: int) -> int:
        with self.engine.begin() as conn:
            result = conn.execute(
                self.table.update().where(self.table.c.consumed_by > step).values(consumed_by=None)
            )
        return result.rowcount

    def unconsumed(self) -> List[Tuple[int, int, Experience]]:
        query = (
            sa.select(self.table.c.id, self.table.c.step, self.table.c.data)
            .where(self.table.c.consumed_by.is_(None))
            .order_by(self.table.c.id)
        )
        with self.engine.connect() as conn:
            return [(row.id, row.step, decode_experience(row.data)) for row in conn.execute(query)]

    def finished_steps(self) -> List[int]:
        with self.engine.connect() as conn:
            return [row.step for row in conn.execute(sa.select(self.steps.c.step))]

    def close(self) -> None:
        self.engine.dispose()


def _refuse_old_layout(engine: sa.Engine, table_name: str, path: str) -> None:
    """Stores written before steps were accounted hold pickled rows without step tags."""
    inspector = sa.inspect(engine)
    if not inspector.has_table(table_name):
        return
    columns = {c["name"] for c in inspector.get_columns(table_name)}
    if columns and "consumed_by" not in columns:
        raise ValueError(
            f"experience buffer {path} was written by an older Trinity version (rows without "
            "explore steps); start a new run (continue_from_checkpoint: false) or move the file"
        )
