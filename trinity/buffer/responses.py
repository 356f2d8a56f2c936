"""The responses a ``mode: serve`` run served, until clients reward and commit them.

Each reply the OpenAI-compatible endpoint sends is recorded here first, one row per choice,
with the engine's exact prompt and sampled tokens and logprobs (``codec``: data, never code),
under the reply's ``id``. ``POST /feedback`` sets a reward on replies named by id (with the
client's ``task_id``, which groups responses for group algorithms such as GRPO);
``POST /commit`` takes the rewarded, uncommitted ones (of one task, or all) as the next
explore step of the experience buffer the trainer reads.

The rows live in table ``<buffer name>_responses`` of the experience buffer's database, so a
served response and its reward survive a restart of the run, and a commit is recorded with
the step it became: a step marked committed here but missing from the buffer (the run died
between the two writes) is written again on restart (``committed``), never twice.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence

import sqlalchemy as sa

from trinity.buffer.codec import decode_experience, encode_experience
from trinity.buffer.store import StoreError
from trinity.common.experience import Experience, grouped
from trinity.utils.database import create_engine, error_text, masked_url

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


@dataclass
class FeedbackResult:
    """What a feedback did: nothing when any id is ``unknown`` or ``committed`` already."""

    updated: int = 0  # rows (choices) that got the reward
    unknown: List[str] = field(default_factory=list)  # ids never served (or not recorded)
    committed: List[str] = field(default_factory=list)  # ids whose responses were committed


# Ids per IN (...) clause: SQLite takes at most 32766 bound parameters per statement (999
# before 3.32), and a client may name any number of replies.
_SLICE = 500


def _slices(ids: List[Any]) -> Iterator[List[Any]]:
    for start in range(0, len(ids), _SLICE):
        yield ids[start : start + _SLICE]


class ResponseLog:
    """Served responses in table ``<table>_responses`` of the database at ``url``."""

    def __init__(self, url: str, table: str) -> None:
        self.where = f"{masked_url(url)} (table '{table}_responses')"
        self.engine = create_engine(url)
        self.table = sa.Table(
            f"{table}_responses",
            sa.MetaData(),
            sa.Column("id", _ID, primary_key=True, autoincrement=True),
            sa.Column("response_id", sa.Text, index=True),  # the reply's `id`
            sa.Column("choice", sa.Integer),  # its index among the reply's choices
            sa.Column("task_id", sa.Text, nullable=True),
            sa.Column("run_id", sa.Integer),
            sa.Column("reward", sa.Float, nullable=True),
            sa.Column("committed_step", sa.Integer, nullable=True, index=True),
            sa.Column("created_at", sa.Float),
            sa.Column("data", sa.LargeBinary),
            sqlite_autoincrement=True,  # ids in write order: commits keep serving order
        )
        with self._errors("open"):
            self.table.create(self.engine, checkfirst=True)

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Database errors as one ``StoreError`` line naming the table."""
        try:
            yield
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(
                f"cannot {what} the served responses {self.where}: {error_text(exc)}"
            ) from None

    def record(self, response_id: str, exps: Sequence[Experience]) -> None:
        """Record the choices of reply ``response_id``, in order, before the client sees it."""
        now, t = time.time(), self.table
        rows = [
            dict(
                response_id=response_id,
                choice=i,
                run_id=0,
                created_at=now,
                data=encode_experience(exp),
            )
            for i, exp in enumerate(exps)
        ]
        with self._errors(f"record reply {response_id} in"), self.engine.begin() as conn:
            conn.execute(t.insert(), rows)

    def feedback(
        self, response_ids: Sequence[str], reward: float, task_id: Optional[str], run_id: int
    ) -> FeedbackResult:
        """Set ``reward`` (and ``task_id``, ``run_id``) on every choice of the named replies,
        replacing an earlier reward; all or nothing (see ``FeedbackResult``)."""
        t, wanted = self.table, list(dict.fromkeys(response_ids))
        with self._errors("record feedback in"), self.engine.begin() as conn:
            states: Dict[str, bool] = {}
            for ids in _slices(wanted):
                query = sa.select(t.c.response_id, t.c.committed_step)
                for row in conn.execute(query.where(t.c.response_id.in_(ids))):
                    states[row.response_id] = states.get(row.response_id, False) or (
                        row.committed_step is not None
                    )
            result = FeedbackResult(
                unknown=[i for i in wanted if i not in states],
                committed=[i for i in wanted if states.get(i)],
            )
            if result.unknown or result.committed:
                return result
            values = dict(reward=float(reward), task_id=task_id, run_id=run_id)
            for ids in _slices(wanted):
                done = conn.execute(t.update().where(t.c.response_id.in_(ids)).values(**values))
                result.updated += done.rowcount
        return result

    def commit(self, step: int, task_id: Optional[str] = None) -> List[Experience]:
        """Mark the rewarded, uncommitted responses (of ``task_id``, or all) as explore step
        ``step`` and return them as experiences, each task's next to each other."""
        t = self.table
        ready = t.c.reward.is_not(None) & t.c.committed_step.is_(None)
        if task_id is not None:
            ready = ready & (t.c.task_id == task_id)
        with self._errors(f"commit step {step} in"), self.engine.begin() as conn:
            rows = list(conn.execute(sa.select(t).where(ready).order_by(t.c.id)))
            for ids in _slices([row.id for row in rows]):
                conn.execute(t.update().where(t.c.id.in_(ids)).values(committed_step=step))
        return grouped([self._experience(row) for row in rows])

    def committed(self, step: int) -> List[Experience]:
        """The experiences commit ``step`` made (to write them again after a crash)."""
        t = self.table
        query = sa.select(t).where(t.c.committed_step == step).order_by(t.c.id)
        with self._errors("read"), self.engine.connect() as conn:
            return grouped([self._experience(row) for row in conn.execute(query)])

    def committed_steps(self) -> List[int]:
        """Every explore step a commit made, in order."""
        column = self.table.c.committed_step
        query = sa.select(column).where(column.is_not(None)).distinct().order_by(column)
        with self._errors("read"), self.engine.connect() as conn:
            return [row.committed_step for row in conn.execute(query)]

    def counts(self) -> Dict[str, int]:
        """Choices served, rewarded and waiting for a commit, and committed."""
        t = self.table
        query = sa.select(
            sa.func.count(t.c.id),
            sa.func.count(t.c.reward) - sa.func.count(t.c.committed_step),
            sa.func.count(t.c.committed_step),
        )
        with self._errors("read"), self.engine.connect() as conn:
            total, ready, committed = conn.execute(query).one()
        return {"served": total, "ready": ready, "committed": committed}

    def _experience(self, row: Any) -> Experience:
        """A committed row as the trainer reads it: its reward, and its task (else its reply)
        as the group."""
        exp = decode_experience(row.data)
        exp.reward = row.reward
        exp.group_id = row.task_id or row.response_id
        exp.info.update(response_id=row.response_id, choice=row.choice, run_id=row.run_id)
        if row.task_id is not None:
            exp.info["task_id"] = row.task_id
        return exp

    def close(self) -> None:
        self.engine.dispose()
