"""Building blocks shared by every config section: the base model, field helpers, errors.

A field is declared once, as ``name: type = Field(default, description=...)``. Fields whose
value is accepted but not used by this build are declared with :func:`inert`, which records
why in the field's metadata; :func:`explicit_inert_values` later lists the ones a user set.
"""

from __future__ import annotations

import copy
import re
import shlex
import types
import typing
from typing import Annotated, Any, ClassVar, Dict, List, Optional, Sequence, Tuple

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trinity.utils.suggest import did_you_mean

# The last line of a ConfigError whose problems kept some checks from running.
MORE_MAY_FOLLOW = (
    "More problems may follow once these are fixed: some checks could not run on these values."
)


class ConfigError(ValueError):
    """A configuration a user must fix; the message says where and how.

    ``overrides``: command-line overrides that make the config run on this machine (its
    hardware's problems, ``preflight/hardware.py``), said after the problems on one line: the
    whole ``command`` with them when the caller knows it (``trinity run --config ...``).
    ``incomplete``: some checks could not run on the values these problems name (they ran
    without them, or not at all), so the message ends saying more may follow.
    """

    def __init__(
        self,
        problems: List[str] | str,
        header: str = "Invalid configuration",
        overrides: Sequence[str] = (),
        command: str = "",
        incomplete: bool = False,
    ) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.header, self.overrides, self.incomplete = header, list(overrides), incomplete
        lines = "\n".join(f"  - {p}" for p in self.problems)
        if self.overrides:
            how = f"to run it here: {command}" if command else "to run it here, add:"
            lines += f"\n{how} {' '.join(shlex.quote(o) for o in self.overrides)}"
        end = f"\n{MORE_MAY_FOLLOW}" if incomplete else ""
        super().__init__(f"{header} ({len(self.problems)} problem(s)):\n{lines}{end}")


class ConfigModel(BaseModel):
    """Base of every config section: unknown keys are errors, numbers may fill string fields."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    # Keys users bring from elsewhere (old Trinity versions, veRL) -> where they live now.
    # Only used to make the unknown-key error point at the right place.
    MOVED_KEYS: ClassVar[Dict[str, str]] = {}

    # Another spelling of a field -> the field, which it is read as (a list field takes one
    # item there: ``taskset`` for ``tasksets``). Setting both is an error.
    ALIASES: ClassVar[Dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _read_nulls(cls, data: Any) -> Any:
        # The guide's own examples write `custom_chat_template: None`, which YAML reads as the
        # string "None"; for a field that may be null that can only mean null. And they write
        # `trainer_config: null` (YAML reads an emptied `section:` as null too): for a section
        # that cannot be null, that means "nothing set", its defaults.
        if not isinstance(data, dict):
            return data
        data = _unaliased(cls, data)
        fields, out = cls.model_fields, {}
        for key, value in data.items():
            annotation = fields[key].annotation if key in fields else None
            if value is None and _is_section(annotation):
                continue
            nullable = key in fields and _allows_none(annotation)
            out[key] = None if value == "None" and nullable else value
        return out

    @field_validator("*", mode="before")
    @classmethod
    def _no_bools_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads YAML's true/false as 1/0 for number fields (`save_interval: true`
        # would save every step); a bool where a number is expected is always a mistake.
        field = cls.model_fields.get(info.field_name or "")
        kind = _number_kind(field.annotation) if field is not None else None
        items = value if isinstance(value, (list, tuple)) else [value]
        if kind and any(isinstance(item, bool) for item in items):
            shown = str(value).lower() if isinstance(value, bool) else str(value)
            raise ValueError(f"expected {kind}, got {shown} (true/false is not a number)")
        return value


# Names that become folder, file or Ray actor names: no path separators, no leading dot.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def check_name(value: str) -> str:
    """``value`` if it is safe as a folder or file name, else ``ValueError`` saying why."""
    if not _SAFE_NAME.fullmatch(value):
        raise ValueError(
            f"'{value}' is not a valid name: use only letters, digits, '.', '_' and '-', not "
            "starting with '.' (it becomes a folder or file name)"
        )
    return value


# A str field checked by :func:`check_name` (project, name, stage_name, actor and buffer names).
Name = Annotated[str, AfterValidator(check_name)]


def _unaliased(cls: type, data: Dict[str, Any]) -> Dict[str, Any]:
    """``data`` (a section of class ``cls``) with each of its ``ALIASES`` renamed to the field."""
    for alias, key in cls.ALIASES.items():
        if alias not in data:
            continue
        if key in data:
            raise ValueError(f"set either `{key}` or its alias `{alias}`, not both")
        data = dict(data)
        value = data.pop(alias)
        if typing.get_origin(_unwrap(cls.model_fields[key].annotation)) is list:
            value = value if isinstance(value, list) else [] if value is None else [value]
        data[key] = value
    return data


def inert(default: Any = None, *, description: str, reason: str, **kwargs: Any) -> Any:
    """A field that is accepted (so configs written for other backends load) but has no effect.

    ``reason`` says why, or which key to use instead; it is printed in a warning whenever a
    user sets the field (or anything below it) explicitly. Pass ``default_factory=`` for
    mutable defaults.
    """
    extra = {"inert": reason}
    if "default_factory" in kwargs:
        return Field(description=description, json_schema_extra=extra, **kwargs)
    return Field(default, description=description, json_schema_extra=extra, **kwargs)


def assign(model: BaseModel, name: str, value: Any) -> None:
    """Set a derived value without marking it as user-set.

    ``model_fields_set`` then keeps meaning "what the user wrote", which stage merging and the
    never-override rule rely on.
    """
    was_set = name in model.model_fields_set
    setattr(model, name, value)
    if not was_set:
        model.model_fields_set.discard(name)


def unset(model: BaseModel, name: str) -> None:
    """Put ``name`` back to its declared default, as if the user had not written it."""
    setattr(model, name, type(model).model_fields[name].get_default(call_default_factory=True))
    model.model_fields_set.discard(name)


def set_default(model: BaseModel, name: str, value: Any) -> None:
    """Derive ``name`` unless the user set it explicitly."""
    if name not in model.model_fields_set:
        assign(model, name, value)


def is_set(model: BaseModel, name: str) -> bool:
    """True when the user wrote ``name`` in this section."""
    return name in model.model_fields_set


def join_path(prefix: str, part: Any) -> str:
    """``buffer`` + ``tasksets`` -> ``buffer.tasksets``; list indices render as ``[0]``."""
    if isinstance(part, int):
        return f"{prefix}[{part}]"
    return f"{prefix}.{part}" if prefix else str(part)


def explicit_inert_values(model: BaseModel, prefix: str = "") -> List[Tuple[str, Any, str]]:
    """(path, value, reason) for every user-set field declared with :func:`inert`.

    A user-set section under an inert field reports each of its own user-set leaves.
    """
    found: List[Tuple[str, Any, str]] = []
    _collect_inert(model, prefix, None, found)
    return found


def _collect_inert(model: BaseModel, prefix: str, reason: Optional[str], out: list) -> None:
    for name, field in type(model).model_fields.items():
        if name not in model.model_fields_set:
            continue
        path = join_path(prefix, name)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        why = reason or extra.get("inert")
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            _collect_inert(value, path, why, out)
        elif why:
            out.append((path, value, why))


# pydantic's error type for a bound a field declares -> (its ctx key, the bound in words)
BOUND_ERRORS = {
    "greater_than_equal": ("ge", ">="),
    "greater_than": ("gt", ">"),
    "less_than_equal": ("le", "<="),
    "less_than": ("lt", "<"),
}


def repeated(names: List[str]) -> List[str]:
    """The names that occur more than once in ``names``, sorted."""
    return sorted({name for name in names if names.count(name) > 1})


def validate_model(cls: type, data: Any, prefix: str = "") -> Any:
    """``cls.model_validate(data)``, turning pydantic's errors into one :class:`ConfigError`."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_describe_error(cls, err, prefix) for err in exc.errors()]) from None


def validate_known(cls: type, data: Dict[str, Any]) -> Tuple[Any, List[str], List[str]]:
    """``cls`` built from what of ``data`` (a mapping) is valid, for the checks that follow
    the schema's: (the instance, the schema's problems, the keys whose values did not parse).

    A key ``cls`` does not have is left out: nothing reads it. A value that does not parse is
    left out too, so its key takes its default; the checks after this one run on that
    default, which is why its key is returned. Raises ``ConfigError`` where nothing can be
    built: a problem of the whole config, or of an item of a list of sections (leaving the
    item out would renumber the rest).
    """
    problems: List[str] = []
    unread: List[str] = []
    data = _unaliased_tree(cls, copy.deepcopy(data))
    while True:  # each pass leaves out at least one entry, so this ends
        try:
            return cls.model_validate(data), problems, unread
        except ValidationError as exc:
            errors = exc.errors()
        dropped: Dict[Tuple[int, Any], Tuple[Any, Any]] = {}
        for err in errors:
            loc = tuple(err["loc"])
            if not (err["type"] == "missing" and _path(loc) in unread):  # not one left out here
                line = _describe_error(cls, err, "")
                problems += [] if line in problems else [line]
            found = _entries(data, loc)
            if not found:
                raise ConfigError(problems, incomplete=True)
            container, key = found[-1]
            dropped[(id(container), key)] = (container, key)
            path = _path(loc[: len(found)])
            if err["type"] != "extra_forbidden" and path not in unread:
                unread.append(path)
        for container, key in dropped.values():
            del container[key]


def _path(loc: tuple, prefix: str = "") -> str:
    """The YAML path of pydantic's error location ``loc`` (below ``prefix``)."""
    path = prefix
    for part in loc:
        path = join_path(path, part)
    return path


def _entries(data: Any, loc: tuple) -> List[Tuple[Any, Any]]:
    """(container, key) of each element on the way to ``loc`` that ``data`` holds, ending at
    the one to leave out: the element at ``loc`` (or the deepest present, for a missing
    key), else the list that holds it; none where that would leave out sections of a list."""
    found: List[Tuple[Any, Any]] = []
    node = data
    for part in loc:
        present = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        )
        if not present:
            break
        found.append((node, part))
        node = node[part]
    while found and isinstance(found[-1][0], list):
        if _holds_sections(found[-1][0]):
            return []  # leaving a section out of a list would renumber the others
        found.pop()
    if found and _holds_sections(found[-1][0][found[-1][1]]):
        return []  # without the list (stages, tasksets) the rest would mean something else
    return found


def _holds_sections(value: Any) -> bool:
    return isinstance(value, list) and any(isinstance(item, dict) for item in value)


def _unaliased_tree(cls: type, data: Any) -> Any:
    """``data`` with the ``ALIASES`` of every section in it renamed, as validation reads
    them, so that an error's location names a place in ``data``."""
    if not isinstance(data, dict) or not _is_section(cls):
        return data
    try:
        data = _unaliased(cls, data)
    except ValueError:  # both spellings set: validation reports it
        return data
    for key, value in data.items():
        field = cls.model_fields.get(key)
        if field is None:
            continue
        tp = _unwrap(field.annotation)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is list and args and isinstance(value, list):
            data[key] = [_unaliased_tree(args[0], item) for item in value]
        elif origin is dict and len(args) == 2 and isinstance(value, dict):
            data[key] = {k: _unaliased_tree(args[1], v) for k, v in value.items()}
        else:
            data[key] = _unaliased_tree(tp, value)
    return data


def _describe_error(root: type, err: dict, prefix: str) -> str:
    loc = tuple(err["loc"])
    path = _path(loc, prefix)
    if err["type"] == "missing":
        return f"{path}: required key is missing"
    if err["type"] == "extra_forbidden":
        return _unknown_key_message(root, loc, path)
    if err["type"] == "value_error":
        return f"{path or '<root>'}: {err['msg'].removeprefix('Value error, ')}"
    if err["type"] in BOUND_ERRORS:  # the field's own bound: Field(ge=...), gt, le, lt
        kind, symbol = BOUND_ERRORS[err["type"]]
        return f"{path} = {err.get('input')!r} must be {symbol} {err['ctx'][kind]}"
    annotation = _annotation_at(root, loc)
    expected = _type_name(annotation)
    if err["type"] == "literal_error":  # a misspelled choice gets the nearest one, as keys do
        hint = did_you_mean(err.get("input"), _choices(annotation))
        return f"{path}: expected {expected}, got {err.get('input')!r}{hint}"
    return f"{path}: expected {expected}, got {err.get('input')!r} ({err['msg']})"


def _choices(tp: Any) -> Tuple[Any, ...]:
    """The values of a ``Literal`` (also inside ``Optional``), else none."""
    tp = _unwrap(tp)
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else ()


def _unknown_key_message(root: type, loc: tuple, path: str) -> str:
    key = str(loc[-1])
    parent = _unwrap(_annotation_at(root, loc[:-1]))
    message = f"{path}: unknown key"
    if not (isinstance(parent, type) and issubclass(parent, ConfigModel)):
        return message
    if key in parent.MOVED_KEYS:
        return f"{message}; set '{parent.MOVED_KEYS[key]}' instead"
    return message + did_you_mean(key, list(parent.model_fields))


def _annotation_at(root: type, loc: tuple) -> Any:
    """The declared type found by following ``loc`` (field names, list indices, dict keys)."""
    tp: Any = root
    for part in loc:
        tp = _unwrap(tp)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(part))
            if field is None:
                return None
            tp = field.annotation
        elif origin in (list, tuple) and args and isinstance(part, int):
            tp = args[min(part, len(args) - 1)] if origin is tuple else args[0]
        elif origin is dict and len(args) == 2:
            tp = args[1]
        else:
            return None
    return tp


def _optional_args(tp: Any) -> Tuple[Any, ...]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return ()


def _number_kind(tp: Any) -> Optional[str]:
    """What ``tp`` holds in words ("an integer", "a number", ...) when only numbers, else None."""
    tp = _unwrap(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple) and args:
        kinds = {_number_kind(a) for a in args if a is not Ellipsis}
        return "a list of numbers" if None not in kinds else None
    if tp is int:
        return "an integer"
    return "a number" if tp is float else None


def _is_section(tp: Any) -> bool:
    """A config section that may not be null (a ``ConfigModel``, not ``Optional``)."""
    return isinstance(tp, type) and issubclass(tp, ConfigModel)


def _allows_none(tp: Any) -> bool:
    return tp is None or type(None) in _optional_args(tp)


def _unwrap(tp: Any) -> Any:
    """``Optional[X]`` -> ``X``."""
    args = [a for a in _optional_args(tp) if a is not type(None)]
    return args[0] if len(args) == 1 else tp


def _type_name(tp: Any) -> str:
    if tp is None:
        return "a valid value"
    if _allows_none(tp) and _unwrap(tp) is not tp:
        return f"{_type_name(_unwrap(tp))} or null"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is list:
        return f"a list of {_type_name(args[0])}" if args else "a list"
    if origin is tuple:
        return f"a list of {len(args)} numbers" if args else "a list"
    if origin is dict or (isinstance(tp, type) and issubclass(tp, BaseModel)):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))
