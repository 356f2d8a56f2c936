"""Load the rows of a `file` storage (taskset, SFT data) with `datasets`, offline.

``path`` is either a directory laid out the Hugging Face way (split files such as
``train.jsonl`` / ``test.jsonl`` or ``data/train-00000-of-00001.parquet``, subsets declared
in the README's ``configs:``) or one ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file.
Only local paths are read: a path that does not exist is an error, never a Hub download.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import datasets

# file extension -> the `datasets` packaged builder that reads it
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def describe(storage: Any) -> str:
    """A short human label for error messages, e.g. ``buffer 'gsm8k' (path '/data/gsm8k')``."""
    return f"buffer '{storage.name}' (path '{storage.path}')"


def load_rows(storage: Any) -> datasets.Dataset:
    """The rows of ``storage`` (``path``, ``subset_name``, ``split``) as a ``datasets.Dataset``.

    A directory is resolved by ``datasets`` itself (HF-standard layout), then the ``split``
    is picked; a single file is the whole dataset and ``split`` does not apply to it.
    """
    if storage.storage_type != "file":
        raise ValueError(
            f"{describe(storage)}: storage_type '{storage.storage_type}' cannot be read as rows; "
            "only storage_type 'file' is supported for tasksets and SFT data"
        )
    if not storage.path:
        raise ValueError(
            f"buffer '{storage.name}': `path` is not set; point it at a data directory "
            "or a .jsonl/.json/.parquet file"
        )
    path = os.path.abspath(os.path.expanduser(storage.path))
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"buffer '{storage.name}': `path` '{storage.path}' does not exist (resolved to "
            f"'{path}'). Only local data is read; datasets are never downloaded from a hub."
        )
    try:
        rows = _load_directory(storage, path) if os.path.isdir(path) else _load_file(storage, path)
    except StopIteration:  # how `datasets` reports a json file without any line
        rows = None
    if rows is None or len(rows) == 0:
        raise ValueError(f"{describe(storage)}: the dataset is empty (split '{storage.split}')")
    return rows


def _load_file(storage: Any, path: str) -> datasets.Dataset:
    ext = os.path.splitext(path)[1].lower()
    if ext not in _BUILDERS:
        raise ValueError(
            f"{describe(storage)}: cannot read '{ext}' files; supported: {', '.join(_BUILDERS)}"
        )
    if storage.subset_name:
        raise ValueError(
            f"{describe(storage)}: `subset_name` '{storage.subset_name}' needs `path` to be a "
            "dataset directory, not a single file"
        )
    return datasets.load_dataset(_BUILDERS[ext], data_files=path, split="train")


def _load_directory(storage: Any, path: str) -> datasets.Dataset:
    try:
        builder = datasets.load_dataset_builder(path, name=storage.subset_name)
    except ValueError as exc:  # an unknown or a missing subset (BuilderConfig) name
        raise ValueError(
            f"{describe(storage)}: `subset_name` is {storage.subset_name!r}, which does not "
            f"select a subset: {exc}"
        ) from exc
    except FileNotFoundError as exc:  # a directory without any data file
        raise FileNotFoundError(f"{describe(storage)}: no data files found: {exc}") from exc
    splits = [str(s) for s in (builder.config.data_files or {})]
    if storage.split not in splits:
        raise ValueError(
            f"{describe(storage)}: `split` '{storage.split}' does not exist; splits found: "
            f"{', '.join(splits) or '(none)'}"
        )
    builder.download_and_prepare()
    return builder.as_dataset(split=storage.split)


def required_columns(format_config: Any, explicit_only: bool) -> List[str]:
    """The columns ``format_config`` says every row must have.

    Taskset readers pass ``explicit_only=True``: only keys the user actually set in the YAML
    count (pydantic's ``model_fields_set``), because custom workflows read ``raw_task``
    directly and their data need not have the default ``prompt``/``response`` columns.
    SFT readers pass ``False``: formatting needs the keys whether defaulted or not.
    """
    if format_config is None:
        return []
    if getattr(format_config, "prompt_type", "plaintext") == "messages":
        keys = ["messages_key"]
    else:
        keys = ["prompt_key", "response_key"]
    explicit = getattr(format_config, "model_fields_set", None)
    if explicit_only and explicit is not None:
        keys = [k for k in keys if k in explicit]
    system_key = getattr(format_config, "system_prompt_key", None)
    columns = [getattr(format_config, k) for k in keys] + ([system_key] if system_key else [])
    return [c for c in columns if c]


def check_columns(rows: datasets.Dataset, columns: List[str], storage: Any) -> None:
    """Raise once at load when a column the format names is absent from the whole dataset."""
    missing = [c for c in columns if c not in rows.column_names]
    if missing:
        raise ValueError(
            f"{describe(storage)} (split '{storage.split}'): column(s) {missing} named in `format` "
            f"are missing; the data has columns {rows.column_names}"
        )


def check_row(row: Dict[str, Any], index: int, columns: List[str], storage: Any) -> None:
    """Raise when row ``index`` has no value for a required column (absent in that row)."""
    for column in columns:
        if row.get(column) is None:
            raise ValueError(
                f"{describe(storage)} (split '{storage.split}'): row {index} has no value for "
                f"key '{column}' that `format` names"
            )
