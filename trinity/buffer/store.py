"""Persistent experience stores: what makes the experience queue survive a crash.

A store keeps every experience put into the queue together with a ``consumed`` flag; on
restart the queue reloads the unconsumed ones, in the order they were written.
"""

from __future__ import annotations

import io
import os
import pickle
import time
from abc import ABC, abstractmethod
from typing import List, Sequence, Tuple

import sqlalchemy as sa
import torch

from trinity.common.experience import Experience


def serialize_experience(exp: Experience) -> bytes:
    """Bytes of every ``Experience`` field (tensors bit-exact, dtype included; a view's
    values only, never its whole underlying storage)."""
    return pickle.dumps(exp, protocol=pickle.HIGHEST_PROTOCOL)


def deserialize_experience(data: bytes) -> Experience:
    """Inverse of ``serialize_experience``; also reads rows written with ``torch.save``."""
    # Both formats may hold arbitrary Python objects in ``info``: the database is written
    # by this run itself, trusted like its checkpoints.
    if data[:2] == b"PK":  # a torch.save zip archive (stores written before pickling)
        return Experience(**torch.load(io.BytesIO(data), weights_only=False))
    return pickle.loads(data)


class ExperienceStore(ABC):
    """Durable log of experiences with a consumed flag; ids increase in write order."""

    @abstractmethod
    def add(self, exps: Sequence[Experience]) -> List[int]:
        """Write ``exps`` durably and return their ids, in order."""

    @abstractmethod
    def mark_consumed(self, ids: Sequence[int]) -> None:
        """Flag rows ``ids`` as read, so they are not reloaded after a restart."""

    @abstractmethod
    def unconsumed(self) -> List[Tuple[int, Experience]]:
        """All (id, experience) rows not yet consumed, oldest first."""

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
    """Experiences in one SQLite table (via SQLAlchemy), one row per experience."""

    def __init__(self, path: str, table_name: str = "experiences") -> None:
        self.url = sqlite_url(path)
        self.engine = sa.create_engine(self.url, connect_args={"check_same_thread": False})
        self.table = sa.Table(
            table_name,
            sa.MetaData(),
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("eid", sa.String(64), index=True),
            sa.Column("group_id", sa.String(256)),
            sa.Column("model_version", sa.Integer),
            sa.Column("reward", sa.Float, nullable=True),
            sa.Column("created_at", sa.Float),  # unix time of the write
            sa.Column("consumed", sa.Boolean, default=False, index=True),
            sa.Column("data", sa.LargeBinary),  # serialize_experience(...)
            sqlite_autoincrement=True,  # never reuse ids, so order = write order
        )
        self.table.metadata.create_all(self.engine)

    def add(self, exps: Sequence[Experience]) -> List[int]:
        if not exps:
            return []
        now = time.time()
        rows = [
            dict(
                eid=exp.eid,
                group_id=exp.group_id,
                model_version=exp.model_version,
                reward=None if exp.reward is None else float(exp.reward),
                created_at=now,
                consumed=False,
                data=serialize_experience(exp),
            )
            for exp in exps
        ]
        # One multi-row INSERT ... RETURNING in one transaction: all of the batch or none.
        insert = self.table.insert().returning(self.table.c.id, sort_by_parameter_order=True)
        with self.engine.begin() as conn:
            return [row.id for row in conn.execute(insert, rows)]

    def mark_consumed(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        with self.engine.begin() as conn:
            conn.execute(
                self.table.update().where(self.table.c.id.in_(list(ids))).values(consumed=True)
            )

    def unconsumed(self) -> List[Tuple[int, Experience]]:
        query = (
            sa.select(self.table.c.id, self.table.c.data)
            .where(self.table.c.consumed.is_(False))
            .order_by(self.table.c.id)
        )
        with self.engine.connect() as conn:
            return [(row.id, deserialize_experience(row.data)) for row in conn.execute(query)]

    def close(self) -> None:
        self.engine.dispose()
