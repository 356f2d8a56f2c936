"""The configuration reference's tables, generated from the schema.

``python docs/gen_reference.py`` rewrites ``docs/reference/configuration.md`` below its
marker line (the hand-written introduction above it is kept); the page is committed so
that a reader of the repository sees the tables, and a unit test fails when it is out of date.
``reference_markdown()`` returns the tables alone. It rewrites
``docs/reference/earlier-releases.md`` likewise from the tables of earlier releases' names
(``trinity/common/config/legacy.py``): ``earlier_markdown()``.
Each row comes from a pydantic field (type, default, description), from
``trinity/preflight/support.py`` (the values this build runs, ranges) and from ``inert``
(accepted, no effect).
"""

from __future__ import annotations

import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # document the checkout this file is in
    sys.path.insert(0, str(ROOT))

from pydantic import BaseModel  # noqa: E402
from pydantic.fields import FieldInfo  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402

from trinity.common.config import Config  # noqa: E402
from trinity.common.config.legacy import (  # noqa: E402
    DROPPED,
    DROPPED_ARGS,
    REFUSED,
    RENAMED,
    RENAMED_ARGS,
    RENAMED_VALUES,
    VALUES_UNTIL,
)
from trinity.preflight.support import (  # noqa: E402
    SAMPLING,
    STORAGE_PATHS,
    SUPPORTED,
    show,
)

PAGE = ROOT / "docs" / "reference" / "configuration.md"
EARLIER_PAGE = ROOT / "docs" / "reference" / "earlier-releases.md"
NOT_YET = "not supported yet"
SAMPLED = {f"model.{key}" for key in SAMPLING} | {
    f"{storage}.rollout_args.{key}" for storage in STORAGE_PATHS[:2] for key in SAMPLING
}


@dataclass
class Row:
    """One key: ``path`` as users write it (``[i]``, ``<name>``), ``pattern`` as support.py
    writes it (``*``), and the table's cells."""

    path: str
    pattern: str
    type: str
    default: str
    doc: str
    runs: str
    parent: str  # the path of the section the key belongs to ("" for the top level)
    section: Optional[type] = None  # a section key's model class...
    target: str = ""  # ...and the path its own keys hang from


def _args(tp: Any) -> Tuple[Any, ...]:
    return typing.get_args(tp)


def _strip(tp: Any) -> Tuple[Any, bool]:
    """``Annotated[X, ...]`` and ``Optional[X]`` -> X, and whether null is allowed."""
    if typing.get_origin(tp) is typing.Annotated:
        tp = _args(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in _args(tp) if a is not type(None)]
        if len(rest) == 1:
            return _strip(rest[0])[0], True
    return tp, False


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def type_name(annotation: Any) -> str:
    """A field's type in words: ``int``, ``list of str``, ``section``, ``float or null``."""
    tp, nullable = _strip(annotation)
    origin, args = typing.get_origin(tp), _args(tp)
    if _is_model(tp):
        name = "section"
    elif origin is typing.Literal:
        name = " or ".join(sorted({type(a).__name__ for a in args}))
    elif origin is list:
        inner = type_name(args[0]) if args else "any"
        name = f"list of {'sections' if inner == 'section' else inner}"
    elif origin is tuple:
        name = f"list of {len(args)} {type_name(args[0])}s"
    elif origin is dict:
        inner = type_name(args[1]) if len(args) == 2 else "any"
        name = f"mapping of {'sections' if inner == 'section' else inner}"
    else:
        name = "any" if tp is Any else getattr(tp, "__name__", str(tp))
    return f"{name} or null" if nullable else name


def _children(annotation: Any) -> Tuple[Optional[type], str, str]:
    """(model class, path suffix, pattern suffix) of a section, a list or a mapping of them."""
    tp, _ = _strip(annotation)
    origin, args = typing.get_origin(tp), _args(tp)
    if _is_model(tp):
        return tp, "", ""
    if origin is list and args and _is_model(_strip(args[0])[0]):
        return _strip(args[0])[0], "[i]", ".*"
    if origin is dict and len(args) == 2 and _is_model(_strip(args[1])[0]):
        return _strip(args[1])[0], ".<name>", ".*"
    return None, "", ""


def _default(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory else field.default
    return "" if isinstance(value, BaseModel) else '""' if value == "" else show(value)


def _shown(values: Any) -> str:
    return ", ".join("unset" if v is None else f"`{show(v)}`" for v in values)


def _runs(pattern: str, annotation: Any, inert: Optional[str]) -> str:
    """What this build does with the key: yes, no effect (why), or which values run."""
    if inert:
        return f"no effect here: {inert}"
    pattern = pattern.removeprefix("stages.*.")  # a stage is checked as a whole config
    if pattern not in SUPPORTED:
        return "yes"
    allowed = SUPPORTED[pattern]
    if callable(allowed):  # depends on the config: show the values each mode runs
        by_mode: dict = {}
        for mode in SUPPORTED["mode"]:
            values = allowed(Config.model_validate({"mode": mode}))
            by_mode.setdefault(values, []).append(mode)
        if len(by_mode) == 1:
            return f"{_shown(next(iter(by_mode)))}; any other value: {NOT_YET}"
        parts = [f"in mode {', '.join(modes)}: {_shown(v)}" for v, modes in by_mode.items()]
        return f"{'; '.join(parts)}; any other value: {NOT_YET}"
    tp, _ = _strip(annotation)
    if typing.get_origin(tp) is typing.Literal:
        refused = [v for v in _args(tp) if v not in allowed]
        return f"yes, except {_shown(refused)}: {NOT_YET}" if refused else "yes"
    return f"only {_shown(allowed)}; any other value: {NOT_YET}"


# annotated_types' bound classes (Field(ge=...) and the like) -> the bound in words
BOUND_WORDS = {"Ge": ("ge", ">="), "Gt": ("gt", ">"), "Le": ("le", "<="), "Lt": ("lt", "<")}


def _bounds(field: FieldInfo) -> List[str]:
    """The bounds a field declares, on itself or on its list items (``List[Annotated[...]]``)."""
    metadata = list(field.metadata)
    for arg in _args(_strip(field.annotation)[0]):
        metadata += getattr(arg, "__metadata__", ())
        metadata += [
            m for info in getattr(arg, "__metadata__", ()) for m in getattr(info, "metadata", ())
        ]
    words = []
    for item in metadata:
        name = type(item).__name__
        if name in BOUND_WORDS:
            attr, symbol = BOUND_WORDS[name]
            words.append(f"{symbol} {getattr(item, attr)}")
    return words


def _limits(pattern: str, field: FieldInfo) -> List[str]:
    """The allowed values and the bounds the checks enforce, as sentences."""
    tp, notes = _strip(field.annotation)[0], []
    if typing.get_origin(tp) is typing.Literal:
        notes.append(f"One of {_shown(_args(tp))}.")
    bounds = _bounds(field)
    if pattern in SAMPLED:
        bounds.append(SAMPLING[pattern.rsplit(".", 1)[1]][1])
    return notes + ([f"Must be {' and '.join(bounds)}."] if bounds else [])


def rows(
    model: type = Config, path: str = "", pattern: str = "", inert: Optional[str] = None
) -> Iterator[Row]:
    """Every key below ``model``, depth first; sections inside ``stages`` are not expanded
    (a stage's sections take the top-level sections' keys)."""
    for name, field in model.model_fields.items():
        key, pat = f"{path}.{name}" if path else name, f"{pattern}.{name}" if pattern else name
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        why = inert or extra.get("inert")
        child, path_suffix, pattern_suffix = _children(field.annotation)
        doc = " ".join([field.description or "", *_limits(pat, field)]).strip()
        runs, target = _runs(pat, field.annotation, why), key + path_suffix
        if child is not None and pattern.startswith("stages"):
            doc += f" Same keys as the top-level `{name}` section."
            child, target = None, name
        cells = (type_name(field.annotation), _default(field), doc, runs)
        yield Row(key, pat, *cells, parent=path, section=child, target=target)
        if child is not None:
            yield from rows(child, target, pat + pattern_suffix, why)


def _cell(text: str) -> str:
    """Text for a table cell: pipes and angle brackets escaped outside code spans."""
    parts = text.replace("``", "`").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _key(path: str) -> str:
    """A key as HTML code that may wrap after its dots (a long path in a narrow column)."""
    escaped = path.replace("<", "&lt;").replace(">", "&gt;").replace(".", ".<wbr>")
    return f"<code>{escaped}</code>"


def anchor(path: str) -> str:
    """The id of a section's heading, without dots or brackets: ``buffer.explorer_input.
    tasksets[i]`` -> ``buffer-explorer_input-tasksets``."""
    return path.replace("[i]", "").replace(".<name>", "").replace(".", "-") or "top-level"


def reference_markdown() -> str:
    """The tables: one per section, a row per key of the section."""
    sections: dict = {"": (Config, [])}
    for row in rows():
        sections[row.parent][1].append(row)
        if row.section is not None:
            sections[row.target] = (row.section, [])
    out = []
    for path, (model, members) in sections.items():
        level = "##" if "." not in path else "###"
        title = f"`{path}`" if path else "Top-level keys"
        out.append(f"\n{level} {title} {{#{anchor(path)}}}\n")
        summary = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        if path and summary:
            out.append(_cell(summary) + "\n")
        out.append("| Key | Type | Default | Description | Runs here |")
        out.append("| --- | --- | --- | --- | --- |")
        for row in members:
            key = _key(row.path)
            if row.section is not None or row.target != row.path:
                key = f'<a href="#{anchor(row.target)}">{key}</a>'
            cells = [key, _cell(row.type), _code(row.default), _cell(row.doc), _cell(row.runs)]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def page_text(page: Path, script: str, tables: str) -> str:
    """``page`` as committed down to its marker line (the hand-written part), the marker, then
    ``tables``: what ``python docs/<script>`` writes there."""
    marker = f"<!-- Generated below by docs/{script}: change the code it reads, then run it. -->"
    return page.read_text(encoding="utf-8").split(marker)[0] + marker + "\n" + tables


def generated_page() -> str:
    """What ``python docs/gen_reference.py`` writes to ``PAGE``."""
    return page_text(PAGE, "gen_reference.py", reference_markdown())


def _table(header: Tuple[str, ...], rows: List[Tuple[str, ...]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]


def earlier_markdown() -> str:
    """The four tables of ``legacy.py``: renamed keys, renamed values, keys without effect
    here, refused keys."""
    wins = " (both set: the current key is read)"
    renamed = [
        (f"`{old}`", f"`{r.new}`", r.until, r.how + (wins if r.new_wins else ""))
        for old, r in RENAMED.items()
    ]
    renamed += [
        (f"`algorithm.{part}_args.{old}` with `{part}: {name}`", f"`{r.new}`", r.until, r.how)
        for (part, name), table in RENAMED_ARGS.items()
        for old, r in table.items()
    ]
    values = [
        (f"`{key}`", f"`{old}`", f"`{new}`", VALUES_UNTIL.get(old, ""))
        for key, renames in RENAMED_VALUES.items()
        for old, new in renames.items()
    ]
    cased = [f"`{key}`" for key, renames in RENAMED_VALUES.items()]
    dropped = [(f"`{key}`", d.until, d.did, d.why) for key, d in DROPPED.items()]
    dropped += [
        (f"`algorithm.{part}_args.{arg}` with `{part}: {name}`", d.until, d.did, d.why)
        for (part, name), table in DROPPED_ARGS.items()
        for arg, d in table.items()
    ]
    refused = [(f"`{key}`", r.until, r.why) for key, r in REFUSED.items()]
    out = ["\n## Renamed keys\n"]
    out += _table(("Earlier key", "Read as", "Until", "How"), renamed)
    out += ["\n## Renamed values\n"]
    out += _table(("Key", "Earlier value", "Read as", "Until"), values)
    out += [
        "\nThe original read the values of these keys in any case (`FILE`, `Nccl`); a value "
        f"that differs only in case is read in lower case: {', '.join(cased)}.",
        "\n## Keys that do nothing here\n",
    ]
    out += _table(("Key", "Until", "What it did", "Why it does nothing here"), dropped)
    out += ["\n## Keys refused\n"]
    out += _table(("Key", "Until", "Why, and what to write instead"), refused)
    return "\n".join(out) + "\n"


def generated_earlier_page() -> str:
    """What ``python docs/gen_reference.py`` writes to ``EARLIER_PAGE``."""
    return page_text(EARLIER_PAGE, "gen_reference.py", earlier_markdown())


if __name__ == "__main__":
    PAGE.write_text(generated_page(), encoding="utf-8")
    EARLIER_PAGE.write_text(generated_earlier_page(), encoding="utf-8")
