"""Load the rows of a storage (taskset, SFT/DPO data) offline, checking every row once.

The storage's kind (``storages.py``) reads them: a `file` storage here, a `sql` table with
``sql_reader``, a plugin's with its ``rows``; the checks below are the same for all.

A `file` storage's ``path`` is either a directory laid out the Hugging Face way (split files
such as ``train.jsonl`` / ``test.jsonl`` or ``data/train-00000-of-00001.parquet``, subsets
declared in the README's ``configs:``) or one ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv``
file.
A dataset named by its hub id is read the same way: the checks before start resolve the id to
its snapshot folder in the Hugging Face cache (``preflight/hub_ids.py``) before it gets here.

The files are parsed here (``file_parsers``), not by ``datasets``, so that a malformed line or
row is named by file and 1-based line/row; every row is checked against the columns its reader
needs (``row_checks``). Malformed rows fail the load, listing the first few, unless the
storage sets ``skip_bad_rows``: then they are dropped, counted and logged. File loads are
cached per process (keyed on the files' size and mtime), so checking before the run and
reading in it parse each file once per process.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import pyarrow as pa

from trinity.buffer.file_parsers import BadRow, DataFileError, FileRows, parser_for
from trinity.buffer.row_checks import row_problems, row_schema
from trinity.buffer.rows import Rows
from trinity.buffer.storages import row_kinds, storage_kind

logger = logging.getLogger("trinity.buffer")

PLAIN_SPLITS = ("train", "validation", "test")  # in the order ``datasets`` lists them
LISTED = 5  # bad rows named in an error or warning; the rest are counted
_CACHE: OrderedDict[tuple, LoadedRows] = OrderedDict()
_CACHE_SIZE = 8


class DataError(ValueError):
    """Data that cannot be used as it is; the message names the storage, file and row."""


class BadRowsError(DataError):
    """Malformed rows (not skipped); ``bad_rows`` holds the first few, ``num_bad`` counts all."""

    def __init__(self, message: str, bad_rows: List[BadRow], num_bad: int) -> None:
        super().__init__(message)
        self.bad_rows, self.num_bad = bad_rows, num_bad


@dataclass
class LoadedRows:
    """A loaded storage: its usable ``rows``, the rows skipped (``skip_bad_rows``), and where
    each kept row is in the files (``where``)."""

    rows: Rows
    num_skipped: int = 0
    skipped: List[BadRow] = field(default_factory=list)  # the first LISTED
    _spans: List[Tuple[int, str, str]] = field(default_factory=list)  # (first index, file, unit)
    _numbers: List[int] = field(default_factory=list)

    def where(self, index: int) -> str:
        """Where row ``index`` of ``rows`` is, e.g. ``data/train.jsonl line 17``."""
        if not self._spans:
            return f"row {index + 1}"
        _, file, unit = self._spans[bisect_right([s[0] for s in self._spans], index) - 1]
        return f"{file} {unit} {self._numbers[index]}"


def describe(storage: Any, path_label: Optional[str] = None) -> str:
    """A label for messages: the storage's YAML path (``path_label``) or its name, and where
    its rows are (``Storage.where``), e.g. ``buffer.explorer_input.tasksets[0] (path
    'data/train.jsonl')``, or for a `sql` storage its table and database (password masked)."""
    return f"{path_label or f'buffer {storage.name!r}'} ({storage_kind(storage).where(storage)})"


def load_rows(
    storage: Any,
    *,
    columns: Optional[Dict[str, str]] = None,
    path_label: Optional[str] = None,
) -> Rows:
    """The usable rows of ``storage`` (``path``, ``subset_name``, ``split``).

    ``columns`` maps each column every row must have to its kind (``row_checks.row_schema``);
    unset: the columns the user named in ``format``, as a taskset reads them. ``path_label``
    is the storage's YAML path, used in messages. Raises ``FileNotFoundError`` for a missing
    path and ``DataError`` (a ``ValueError``) for anything malformed; see ``load_checked``.
    """
    return load_checked(storage, columns=columns, path_label=path_label).rows


def load_checked(
    storage: Any,
    *,
    columns: Optional[Dict[str, str]] = None,
    path_label: Optional[str] = None,
) -> LoadedRows:
    """``load_rows`` with what was skipped, read by the storage's kind (``storages.py``)."""
    schema = row_schema(getattr(storage, "format", None), "taskset") if columns is None else columns
    skip = bool(getattr(storage, "skip_bad_rows", False))
    kind = storage_kind(storage)
    if not kind.reads_rows:
        sources = " or ".join(f"'{name}'" for name in row_kinds())
        raise DataError(
            f"{describe(storage, path_label)}: storage_type '{storage.storage_type}' cannot be "
            f"read as rows; tasksets and SFT data are read from storage_type {sources}"
        )
    return kind.load(storage, dict(schema), skip, path_label)


def load_files(
    storage: Any, schema: Dict[str, str], skip: bool, path_label: Optional[str]
) -> LoadedRows:
    """A `file` storage's rows: a directory's ``split`` is picked (``_parse_dir``); a single
    file is the whole dataset. Cached until a file changes."""
    path = _checked_path(storage, path_label)
    key = (path, storage.subset_name, storage.split, tuple(schema.items()), skip, _stamp(path))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    loaded = _load(storage, path, schema, skip, path_label)
    _CACHE[key] = loaded
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return loaded


def _checked_path(storage: Any, path_label: Optional[str]) -> str:
    label = path_label or f"buffer '{storage.name}'"
    if not storage.path:
        raise DataError(
            f"{label}: `path` is not set; point it at a data directory "
            "or a .jsonl/.json/.parquet/.csv file"
        )
    path = os.path.abspath(os.path.expanduser(storage.path))
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{label}: `path` '{storage.path}' does not exist (resolved to '{path}'); give a "
            "data folder or file, or a dataset id on the Hugging Face hub (ORG/NAME)"
        )
    return path


def _stamp(path: str) -> tuple:
    """Size and mtime of every file under ``path``: a cached load is stale once one changes."""
    if not os.path.isdir(path):
        st = os.stat(path)
        return ((path, st.st_size, st.st_mtime_ns),)
    stamps = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            st = os.stat(os.path.join(root, name))
            stamps.append((os.path.join(root, name), st.st_size, st.st_mtime_ns))
    return tuple(stamps)


def _load(
    storage: Any, path: str, schema: Dict[str, str], skip: bool, path_label: Optional[str]
) -> LoadedRows:
    label = describe(storage, path_label)
    single = not os.path.isdir(path)
    parts, features = (
        ([_parse_file(storage, path, label)], None) if single else _parse_dir(storage, path, label)
    )
    if sum(len(p) + len(p.bad) for p in parts) == 0:
        what = "the file" if single else f"split '{storage.split}'"
        raise DataError(f"{label}: {what} is empty: it has no rows")
    return _checked(storage, parts, features, schema, skip, path_label, with_file=not single)


def load_table(
    storage: Any, schema: Dict[str, str], skip: bool, path_label: Optional[str]
) -> LoadedRows:
    """A `sql` storage's table, checked like a file; read every time (a database changes
    unseen)."""
    from trinity.buffer.sql_reader import read_table

    label = describe(storage, path_label)
    part = read_table(storage, label)
    if len(part) + len(part.bad) == 0:
        raise DataError(f"{label}: the table is empty: it has no rows")
    return _checked(storage, [part], None, schema, skip, path_label, with_file=False)


def checked_rows(
    storage: Any,
    rows: List[Dict[str, Any]],
    schema: Dict[str, str],
    skip: bool,
    path_label: Optional[str],
) -> LoadedRows:
    """Rows a plugin storage returned (``Storage.rows``), checked like a file's."""
    label = describe(storage, path_label)
    if not rows:
        raise DataError(f"{label}: storage_type '{storage.storage_type}' returned no rows")
    if not all(isinstance(row, dict) for row in rows):
        raise DataError(
            f"{label}: storage_type '{storage.storage_type}' returned a row that is not a "
            "dict (column -> value)"
        )
    part = FileRows(label, "row", list(range(1, len(rows) + 1)), rows=list(rows))
    return _checked(storage, [part], None, schema, skip, path_label, with_file=False)


def _checked(
    storage: Any,
    parts: List[FileRows],
    features: Any,
    schema: Dict[str, str],
    skip: bool,
    path_label: Optional[str],
    with_file: bool,
) -> LoadedRows:
    """The rows of ``parts`` that pass the row checks, as ``LoadedRows``; bad rows fail the
    load (named) unless ``skip`` drops them."""
    label = describe(storage, path_label)
    if any(len(p) for p in parts):
        _require_columns(parts, schema, storage, path_label)
    for part in parts:
        part.mark_bad(row_problems({c: part.column(c) for c in schema}, schema))
    tables = []
    for part in parts:
        try:
            tables.append(part.to_table())
        except DataFileError as exc:
            raise DataError(f"{label}: {part.file}: {exc}") from exc
    bad = [b for p in parts for b in sorted(p.bad, key=lambda b: b.number)]
    kept = sum(len(p) for p in parts)
    if bad and (not skip or kept == 0):
        message = _bad_rows_message(storage, path_label, bad, kept, skip, with_file)
        raise BadRowsError(message, bad, len(bad))
    table = _concat(tables, storage, label)
    if features is not None:  # a directory's README declares them; datasets is loaded there
        import datasets

        table = datasets.Dataset(table).cast(features).data.table
    rows = Rows(table)
    if bad:
        logger.warning(
            "%s: skipped %d malformed row(s) of %d (skip_bad_rows): %s",
            label,
            len(bad),
            len(bad) + kept,
            _listing(bad, with_file=with_file),
        )
    return LoadedRows(rows, len(bad), bad[:LISTED], *_locations(parts))


def _parse_file(storage: Any, path: str, label: str) -> FileRows:
    ext = os.path.splitext(path)[1].lower()
    parse = parser_for(path)
    if parse is None:
        raise DataError(
            f"{label}: cannot read '{ext}' files; supported: .jsonl, .json, "
            ".parquet, .csv, or a dataset directory"
        )
    if storage.subset_name:
        raise DataError(
            f"{label}: `subset_name` '{storage.subset_name}' needs `path` to be a "
            "dataset directory, not a single file"
        )
    try:
        return parse(path, storage.path)
    except DataFileError as exc:
        raise DataError(f"{label}: {exc}") from exc


def _parse_dir(storage: Any, path: str, label: str) -> Tuple[List[FileRows], Any]:
    """The split's files, parsed one by one (named relative to ``storage.path``), and the
    features the README declares (None for a plain directory)."""
    plain = None if storage.subset_name else _plain_splits(path)
    if plain is None:
        return _parse_hf_dir(storage, path, label)
    if storage.split not in plain:
        raise DataError(
            f"{label}: `split` '{storage.split}' does not exist; splits found: "
            f"{', '.join(plain) or '(none)'}"
        )
    return [_parse_split_file(storage, path, label, plain[storage.split])], None


def _plain_splits(path: str) -> Optional[Dict[str, str]]:
    """``{split: file}`` for a directory holding only ``train``/``validation``/``test`` files of
    one parsed format (the quickstart's layout), else None. ``datasets`` resolves such a
    directory to the same splits and files; reading it here keeps ``datasets`` (0.4 s of
    imports) out of the run's start."""
    entries = [e for e in os.scandir(path) if not e.name.startswith((".", "_"))]
    names = [os.path.splitext(e.name) for e in entries if e.is_file()]
    if len(names) != len(entries) or len({ext.lower() for _, ext in names}) != 1:
        return None
    if not all(stem in PLAIN_SPLITS and parser_for(stem + ext) for stem, ext in names):
        return None
    files = {stem: os.path.join(path, stem + ext) for stem, ext in names}
    return {split: files[split] for split in PLAIN_SPLITS if split in files}


def _parse_split_file(storage: Any, path: str, label: str, file: str) -> FileRows:
    shown = os.path.join(storage.path, os.path.relpath(file, path))
    try:
        return parser_for(file)(file, shown)
    except DataFileError as exc:
        raise DataError(f"{label}: {shown}: {exc}") from exc


def _parse_hf_dir(storage: Any, path: str, label: str) -> Tuple[List[FileRows], Any]:
    """A directory in any other Hugging Face layout (README ``configs:``, ``data/`` shards,
    subsets), resolved by ``datasets``; formats without a parser here are read by it too."""
    import datasets  # resolves the Hugging Face layout: splits, subsets, features

    try:
        builder = datasets.load_dataset_builder(path, name=storage.subset_name)
    except ValueError as exc:  # an unknown or missing subset name, or mixed file formats
        if storage.subset_name is None and "data file format" in str(exc):
            raise DataError(f"{label}: the directory's splits mix file formats: {exc}") from exc
        raise DataError(_subset_problem(storage, path, label, exc)) from exc
    except FileNotFoundError as exc:  # a directory without any data file
        raise FileNotFoundError(f"{label}: no data files found: {exc}") from exc
    splits = [str(s) for s in (builder.config.data_files or {})]
    if storage.split not in splits:
        raise DataError(
            f"{label}: `split` '{storage.split}' does not exist; splits found: "
            f"{', '.join(splits) or '(none)'}"
        )
    files = [str(f) for f in builder.config.data_files[storage.split]]
    if not all(parser_for(f) for f in files):  # e.g. arrow or text files
        builder.download_and_prepare()
        table = builder.as_dataset(split=storage.split).data.table
        numbers = list(range(1, table.num_rows + 1))
        return [FileRows(f"split '{storage.split}'", "row", numbers, table=table)], None
    parts = [_parse_split_file(storage, path, label, file) for file in files]
    return parts, builder.info.features


def _subset_problem(storage: Any, path: str, label: str, exc: ValueError) -> str:
    """Why ``subset_name`` selects no subset of the dataset at ``path``, with its subsets."""
    import datasets

    try:
        names = datasets.get_dataset_config_names(path)
    except Exception:  # the directory's own problem: datasets' message says it
        names = []
    if not names:
        return f"{label}: `subset_name` is {storage.subset_name!r}, which selects no subset: {exc}"
    listed = ", ".join(names)
    if storage.subset_name is None:
        return f"{label}: `subset_name` is not set, and the dataset has subsets {listed}: pick one"
    return f"{label}: `subset_name` {storage.subset_name!r} does not exist; its subsets: {listed}"


def _concat(tables: List[pa.Table], storage: Any, label: str) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(
            f"{label}: the files of split '{storage.split}' disagree on a column's type ({exc})"
        ) from exc


def _locations(parts: List[FileRows]) -> Tuple[List[Tuple[int, str, str]], List[int]]:
    spans, numbers = [], []
    for part in parts:
        spans.append((len(numbers), part.file, part.unit))
        numbers += part.numbers
    return spans, numbers


def _listing(bad: List[BadRow], with_file: bool) -> str:
    shown = "; ".join(f"{b.where(with_file)}: {b.reason}" for b in bad[:LISTED])
    return shown + (f" (and {len(bad) - LISTED} more)" if len(bad) > LISTED else "")


def _bad_rows_message(
    storage: Any,
    path_label: Optional[str],
    bad: List[BadRow],
    kept: int,
    skip: bool,
    with_file: bool,
) -> str:
    """``with_file``: the rows come from several files, so each bad row names its file."""
    label = describe(storage, path_label)
    listing = _listing(bad, with_file)
    if kept == 0:
        note = "skip_bad_rows is set, but " if skip else ""
        return f"{label}: {note}every row is malformed ({len(bad)} rows): {listing}"
    target = (
        f"{path_label}.skip_bad_rows" if path_label else f"skip_bad_rows of buffer '{storage.name}'"
    )
    them = "it" if len(bad) == 1 else "them"
    count = "" if len(bad) == 1 else f"{len(bad)} malformed rows of {len(bad) + kept}: "
    return f"{label}: {count}{listing}; set {target}: true to skip {them}"


# Row checks of the columns a task selector reads; every other column is named in `format`.
_SELECTOR_KINDS = ("number", "rate")


def _require_columns(
    parts: List[FileRows], schema: Dict[str, str], storage: Any, path_label: Optional[str]
) -> None:
    """One error (not one per row) when a required column is absent from every row."""
    present = list(dict.fromkeys(c for p in parts if len(p) for c in p.column_names()))
    missing = [c for c in schema if c not in present]
    if missing:
        split = storage_kind(storage).selection(storage)
        named = sorted(
            {
                "task_selector.feature_keys" if schema[c] in _SELECTOR_KINDS else "format"
                for c in missing
            }
        )
        raise DataError(
            f"{describe(storage, path_label)}{split}: column(s) {missing} "
            f"named in {' and '.join(f'`{k}`' for k in named)} are missing; the data has "
            f"columns {present}"
        )
