"""``trinity view``: what a run's experience buffer holds, read-only.

The buffer is found from the run's resolved ``config.yaml`` (``train_config.yaml`` or
``explore_config.yaml`` for a decoupled run: the experience buffer's ``path`` and ``name``,
as the run used them), else from ``<job_dir>/buffer/*.db`` (table: the file's
name). Rows are listed with their explore step, task (group id), reward, model version and the
train step that read them (and, for a ``mode: serve`` run, the reply they were served as),
filtered by step (``latest``: the newest step), task and reward, oldest first; one row can
be shown whole. A task id is ``<train|eval>-<explore step>-<taskset>-<task index>``
(``explorer.Explorer._expand``; a serve run's is the client's ``task_id``): ``--task`` takes a
whole id or its start up to a ``-`` (``train-3``: every training task of step 3).
Nothing is created or written: a missing database or table is an error that says where it
looked; a stage that trains from a dataset (SFT, DPO) has no experiences, and says so.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple, Union

import sqlalchemy as sa
import yaml
from rich.table import Table

from trinity.buffer.codec import decode_experience
from trinity.buffer.storages import store_kinds
from trinity.buffer.store import SQLExperienceStore
from trinity.common.experience import Experience
from trinity.utils.database import database_url, masked_url

# The run's resolved config: ``config.yaml``, or for each side of a decoupled run (and a
# bench of a run) ``<mode>_config.yaml`` (``preflight.decoupled.resolved_config_name``); the
# trainer's first, since it records which train step read each row.
CONFIG_NAMES = ("config.yaml", "train_config.yaml", "explore_config.yaml", "bench_config.yaml")
LATEST = "latest"  # --step latest: the newest explore step holding a matching row


class ViewError(Exception):
    """What ``trinity view`` cannot show, said in one line."""


@dataclass
class Filters:
    step: Union[int, str, None] = None  # explore step, or LATEST
    task: Optional[str] = None  # group id, whole or its start up to a "-" (train-3-...)
    min_reward: Optional[float] = None
    max_reward: Optional[float] = None
    limit: int = 20


def parse_step(text: Optional[str]) -> Union[int, str, None]:
    """``--step``'s value: an explore step, ``latest`` or None (every step)."""
    if text is None or text == LATEST:
        return text
    try:
        return int(text)
    except ValueError:
        raise ViewError(f"--step {text}: give an explore step (a number) or {LATEST}") from None


def locate(job_dir: str) -> Tuple[str, str, Optional[str]]:
    """(database URL, table, model path for the tokenizer) of a run's experience buffer."""
    for name in CONFIG_NAMES:
        path = os.path.join(job_dir, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                config = yaml.safe_load(f) or {}
            storage = (config.get("buffer", {}).get("trainer_input") or {}).get(
                "experience_buffer"
            ) or {}
            _explored(job_dir, storage)
            table = storage.get("name") or "experience_buffer"
            where = storage.get("path") or os.path.join(job_dir, "buffer", f"{table}.db")
            return database_url(where), table, (config.get("model") or {}).get("model_path")
    found = sorted(glob.glob(os.path.join(glob.escape(job_dir), "buffer", "*.db")))
    if not found:
        raise FileNotFoundError(
            f"{job_dir}: no {', '.join(CONFIG_NAMES)} and no buffer/*.db: not a run folder"
        )
    return database_url(found[0]), os.path.splitext(os.path.basename(found[0]))[0], None


def _explored(job_dir: str, storage: dict) -> None:
    """Raise unless the experience buffer holds experiences: a stage whose trainer reads a
    dataset (``storage_type: file``, or a plugin's source of rows) wrote none."""
    kind = storage.get("storage_type")
    if kind is None or kind in store_kinds():
        return
    where = storage.get("path") or "no path"
    raise ViewError(
        f"{job_dir}: this stage trains from a dataset, not from explored experiences: "
        f"'{storage.get('name')}' ({kind}, {where}); there is no experience buffer to view"
    )


def open_store(url: str, table: str) -> SQLExperienceStore:
    """The store, only if its database and table exist (a viewer never creates them)."""
    if url.startswith("sqlite:///") and not os.path.isfile(url[len("sqlite:///") :]):
        raise FileNotFoundError(f"no experience buffer database at {url[len('sqlite:///') :]}")
    engine = sa.create_engine(url)
    try:
        if not sa.inspect(engine).has_table(table):
            raise FileNotFoundError(f"{masked_url(url)} has no table '{table}'")
    finally:
        engine.dispose()
    return SQLExperienceStore(url, table)


def list_rows(store: SQLExperienceStore, filters: Filters) -> Tuple[int, List[Any]]:
    """(rows matching ``filters``, the first ``limit`` of them, oldest first)."""
    t = store.table
    where = []
    if filters.task is not None:  # the whole id, or a start of it that ends at a "-"
        prefix = t.c.group_id.startswith(f"{filters.task}-", autoescape=True)
        where.append(sa.or_(t.c.group_id == filters.task, prefix))
    if filters.min_reward is not None:
        where.append(t.c.reward >= filters.min_reward)
    if filters.max_reward is not None:
        where.append(t.c.reward <= filters.max_reward)
    columns = [t.c.id, t.c.step, t.c.group_id, t.c.reward, t.c.model_version, t.c.consumed_by]
    columns.append(t.c.data)  # a served reply's id is in the experience (replies below)
    with store.engine.connect() as conn:
        step = filters.step
        if step == LATEST:  # None when no row matches: the step filter then matches none
            step = conn.execute(sa.select(sa.func.max(t.c.step)).where(*where)).scalar()
            where.append(sa.false() if step is None else t.c.step == step)
        elif step is not None:
            where.append(t.c.step == step)
        total = conn.execute(sa.select(sa.func.count()).select_from(t).where(*where)).scalar()
        rows = conn.execute(sa.select(*columns).where(*where).order_by(t.c.id).limit(filters.limit))
        return int(total or 0), list(rows)


def rows_table(rows: List[Any]) -> Table:
    """The listed rows as a table; a ``reply`` column when any was served."""
    served = replies(rows)
    headers = ["id", "step", "task", "reward", "version", "read by train step"]
    table = Table(*headers, *(["reply"] if any(served) else []))
    for row, reply in zip(rows, served, strict=True):
        read_by = "-" if row.consumed_by is None else str(row.consumed_by)
        cells = [str(row.id), str(row.step), row.group_id, f"{row.reward}"]
        cells += [str(row.model_version), read_by] + ([reply or "-"] if any(served) else [])
        table.add_row(*cells)
    return table


def replies(rows: List[Any]) -> List[Optional[str]]:
    """The served reply each row was committed from (``mode: serve``: its ``id``, and the
    choice's index after ``#`` when the reply had several), else None."""
    found = []
    for row in rows:
        info = decode_experience(row.data).info
        reply, choice = info.get("response_id"), info.get("choice", 0)
        found.append(None if reply is None else f"{reply}#{choice}" if choice else reply)
    return found


def one(store: SQLExperienceStore, row_id: int) -> Experience:
    found = store.experiences([row_id])
    if row_id not in found:
        raise ViewError(f"no row {row_id} in {store.where}")
    return found[row_id]


def show_row(row_id: int, exp: Experience, model_path: Optional[str], console: Any) -> None:
    """Row ``row_id`` as ``trinity debug`` prints an experience, headed with the row's id (the
    one ``--show`` took); tokens need the run's tokenizer."""
    from transformers import AutoTokenizer

    from trinity.cli.debug import show_experience

    # the run's own model folder only (never a hub lookup); gone: the stored texts instead
    here = model_path and os.path.isdir(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path) if here else None
    if tokenizer is None:
        console.print(f"[bold]experience {row_id}[/bold] (task {exp.group_id})")
        console.print(f"prompt: {exp.prompt_text!r}\nresponse: {exp.response_text!r}")
        console.print(f"reward: {exp.reward}  info: {exp.info}")
        return
    show_experience(row_id, exp, tokenizer, console)
