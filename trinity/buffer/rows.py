"""``Rows``: the checked rows of a storage, over a pyarrow Table.

What the readers and checks use of a dataset: its length, a row by index (a dict), a column
by name (a list), the column names and every row as a list. Plain pyarrow, so reading a
taskset or SFT file does not import ``datasets`` (over half a second at start-up); only a
Hugging Face directory layout, whose splits and features ``datasets`` resolves, does.
"""

from __future__ import annotations

from typing import Any, Dict, List, Union

import pyarrow as pa


class Rows:
    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, key: Union[int, str]) -> Any:
        """Row ``key`` as a dict (an int), or column ``key`` as a list (a str)."""
        if isinstance(key, str):
            return self.table.column(key).to_pylist()
        index = key + len(self) if key < 0 else key
        if not 0 <= index < len(self):
            raise IndexError(f"row {key} of {len(self)}")
        return self.table.slice(index, 1).to_pylist()[0]

    @property
    def column_names(self) -> List[str]:
        return list(self.table.column_names)

    def to_list(self) -> List[Dict[str, Any]]:
        return self.table.to_pylist()

    @classmethod
    def from_list(cls, rows: List[Dict[str, Any]], like: Any = None) -> Rows:
        """``rows`` as ``Rows``, with ``like``'s column types where they still fit (an
        operator may have changed a field's type: then they are inferred again)."""
        schema = getattr(like, "table", None)
        if schema is not None:
            try:
                return cls(pa.Table.from_pylist(rows, schema=like.table.schema))
            except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError):
                pass
        return cls(pa.Table.from_pylist(rows))
