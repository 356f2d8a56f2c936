"""Storage kinds: what each ``storage_type`` means, asked of one registry.

A storage (a taskset, the experience buffer or an auxiliary buffer: ``StorageConfig``) names
its kind with ``storage_type``; ``STORAGES`` maps that name to a ``Storage`` subclass, and
the readers, the runtime and the checks before start ask it, never the name:

- rows: ``reads_rows`` (tasks and SFT/DPO data can be read from it: ``load_rows``,
  ``TaskReader``, ``SFTReader``), ``load`` (every row, checked), ``where`` (for messages);
- experiences: ``holds_experiences`` (as the experience buffer it is the explorer-to-trainer
  queue, kept in the database at its ``path``: ``store.buffer_database``), ``replays``
  (``replay_buffer`` reuses its experiences);
- checks: ``needs_path`` (``path`` must be set when its rows are read), ``database_path``
  (``path`` is a SQLite file or a database URL, reached before start), ``hub_datasets``
  (``path`` may name a dataset on the Hugging Face hub, resolved to its local snapshot folder
  before start: ``preflight/hub_ids.py``).

Built in: ``file`` (local files), ``sql`` (a table of a database, or the queue kept there)
and ``queue``. A plugin adds a source of rows: subclass ``Storage``, implement ``rows``,
register it with ``@STORAGES.register_module("name")`` (docs/extending.md). The checks
before start then accept ``storage_type: name`` wherever rows are read (tasksets, SFT data).

This module imports nothing heavy: the checks read the kinds' flags without loading
``datasets`` or SQLAlchemy; ``load`` imports its reader when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional

from trinity.common.registry import Registry
from trinity.utils.hub import cached_repo_of

if TYPE_CHECKING:
    from trinity.buffer.file_reader import LoadedRows

STORAGES: Registry = Registry("storages")


class Storage:
    """One kind of storage, registered in ``STORAGES`` under its ``storage_type``.

    A plugin implements ``rows`` (and sets ``needs_path = False`` when its rows do not come
    from ``path``); its rows then go through the same row checks as a file's.
    """

    reads_rows: ClassVar[bool] = True
    holds_experiences: ClassVar[bool] = False
    replays: ClassVar[bool] = False
    needs_path: ClassVar[bool] = True
    database_path: ClassVar[bool] = False
    hub_datasets: ClassVar[bool] = False

    def rows(self, storage: Any) -> List[Dict[str, Any]]:
        """Every row of ``storage`` (its ``StorageConfig``), one dict per row, in order."""
        raise NotImplementedError(f"{type(self).__name__} does not implement rows()")

    def where(self, storage: Any) -> str:
        """Where the rows are, for messages: ``path 'data/train.jsonl'``; a hub dataset's
        snapshot folder names its repository too."""
        repo = cached_repo_of(storage.path)
        if repo is not None:
            return f"dataset {repo}, path '{storage.path}'"
        if storage.path:
            return f"path '{storage.path}'"
        return f"storage_type '{storage.storage_type}'"

    def selection(self, storage: Any) -> str:
        """The part of the source that is read, for messages (`` (split 'train')``)."""
        return ""

    def load(
        self, storage: Any, schema: Dict[str, str], skip: bool, path_label: Optional[str]
    ) -> LoadedRows:
        """The rows ``rows`` returns, through the row checks of ``schema`` (``row_checks``);
        read again each time (a plugin caches what it wants to)."""
        from trinity.buffer.file_reader import checked_rows

        return checked_rows(storage, self.rows(storage), schema, skip, path_label)


@STORAGES.register_module("file")
class FileStorage(Storage):
    """jsonl/json/parquet/csv files or a dataset directory at ``path`` (``file_reader``), or
    a hub dataset's snapshot folder."""

    hub_datasets = True

    def selection(self, storage: Any) -> str:
        return f" (split '{storage.split}')"

    def load(
        self, storage: Any, schema: Dict[str, str], skip: bool, path_label: Optional[str]
    ) -> LoadedRows:
        from trinity.buffer.file_reader import load_files

        return load_files(storage, schema, skip, path_label)


@STORAGES.register_module("sql")
class SqlStorage(Storage):
    """A table of a database (rows: ``sql_reader``); as the experience buffer, the queue kept
    in that database."""

    holds_experiences = True
    database_path = True

    def where(self, storage: Any) -> str:
        from trinity.buffer.sql_reader import table_label  # SQLAlchemy: only for a table

        return table_label(storage)

    def load(
        self, storage: Any, schema: Dict[str, str], skip: bool, path_label: Optional[str]
    ) -> LoadedRows:
        from trinity.buffer.file_reader import load_table

        return load_table(storage, schema, skip, path_label)


@STORAGES.register_module("queue")
class QueueStorage(Storage):
    """The explorer-to-trainer queue (``queue.py``), kept in a database: ``path``, else a
    SQLite file in the job dir."""

    reads_rows = False
    holds_experiences = True
    replays = True
    needs_path = False
    database_path = True


def storage_kind(storage: Any) -> Storage:
    """The kind of ``storage`` (a ``StorageConfig``) its ``storage_type`` names."""
    return STORAGES.get(storage.storage_type)()


def row_kinds() -> List[str]:
    """The registered names rows can be read from."""
    return [name for name in STORAGES.names() if STORAGES.get(name).reads_rows]


def store_kinds() -> List[str]:
    """The registered names an experience buffer can be kept in."""
    return [name for name in STORAGES.names() if STORAGES.get(name).holds_experiences]


def data_kinds() -> List[str]:
    """The registered names SFT/DPO data (a ``train`` run's experience buffer, the auxiliary
    buffers) is read from: those that read rows and are not, there, a store."""
    return [name for name in row_kinds() if not STORAGES.get(name).holds_experiences]


def path_missing(storage: Any) -> bool:
    """``storage``'s kind reads its rows from ``path``, and ``path`` is not set."""
    return storage_kind(storage).needs_path and not storage.path


def read_as_rows(storage: Any, experience_buffer: bool = False) -> bool:
    """Whether rows are read from ``storage``: it reads rows, and it is not the experience
    buffer kept as a queue (``experience_buffer``: it is the experience buffer)."""
    kind = storage_kind(storage)
    return kind.reads_rows and not (experience_buffer and kind.holds_experiences)
