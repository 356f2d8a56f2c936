"""The studio's form, read from the config schema, and the values it edits.

``form_definitions()`` walks the pydantic models of ``Config``: every section, field, default,
allowed value and doc line the page shows comes from there, so a field declared in a
``schema_*.py`` appears on the page without touching the studio; which values run comes from
the checks' own ``SUPPORTED`` table.

The page edits *raw* values: only what the user set, nested like the YAML, each leaf as its
input holds it (text for numbers, YAML text for lists and mappings, JSON text for a choice).
``parse_values`` turns them into the YAML data ``trinity run`` reads; ``raw_values`` is the
inverse, for a loaded file. Keys a section does not declare (aliases such as ``taskset:``)
travel as YAML text under ``EXTRA`` so that a loaded file is saved unchanged.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Dict, List, Literal, Tuple

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from trinity.common.config.base import join_path
from trinity.common.config.config import Config
from trinity.preflight.support import SUPPORTED, runnable_values

EXTRA = "__extra__"  # raw key of a section's undeclared keys, as YAML text


def form_definitions(root: type = Config) -> Dict[str, Any]:
    """``{"root": name, "defs": {model name: {"doc", "fields": [field spec, ...]}},
    "supported": {key pattern: [JSON of each value that runs]}}``.

    ``supported`` is the one "not supported yet" rule (``trinity.preflight.support``): the
    page offers a choice outside it disabled, marked "not supported yet". A pattern's ``*``
    stands for a list index; inside ``stages`` the page looks up the key without its
    ``stages.N.`` prefix.
    """
    defs: Dict[str, Any] = {}
    _define(root, defs)
    supported = {p: [json.dumps(v) for v in runnable_values(p)] for p in SUPPORTED}
    return {"root": root.__name__, "defs": defs, "supported": supported}


def _define(model: type, defs: Dict[str, Any]) -> None:
    if model.__name__ in defs:
        if defs[model.__name__]["module"] != model.__module__:
            raise TypeError(f"two config sections are named {model.__name__}")
        return
    doc = (model.__doc__ or "").strip().splitlines()
    entry: Dict[str, Any] = {"doc": doc[0] if doc else "", "module": model.__module__}
    defs[model.__name__] = entry
    entry["fields"] = [_field_spec(name, field) for name, field in model.model_fields.items()]
    for spec in entry["fields"]:
        if "model" in spec:
            _define(_model_of(model.model_fields[spec["key"]].annotation), defs)


def _field_spec(name: str, field: FieldInfo) -> Dict[str, Any]:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    spec: Dict[str, Any] = {"key": name, "doc": field.description or ""}
    if extra.get("inert"):
        spec["inert"] = extra["inert"]
    spec.update(field_kind(field.annotation))
    if spec["kind"] not in ("section", "list"):
        spec["default"] = _shown_default(spec["kind"], field)
    return spec


def field_kind(annotation: Any) -> Dict[str, Any]:
    """How a field is edited: ``section`` / ``list`` (of sections), ``bool``, ``choice``,
    ``number``, ``text``, or ``yaml`` (anything else, typed as YAML)."""
    nullable, tp = _split_optional(annotation)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_model(tp):
        return {"kind": "section", "model": tp.__name__}
    if origin is list and args and _is_model(args[0]):
        return {"kind": "list", "model": args[0].__name__}
    if origin is Literal or (tp is bool and nullable):
        choices = list(args) if origin is Literal else [True, False]
        choices += [None] if nullable else []
        return {"kind": "choice", "choices": [json.dumps(c) for c in choices]}
    if tp is bool:
        return {"kind": "bool"}
    if tp in (int, float):
        return {"kind": "number", "type": tp.__name__, "nullable": nullable}
    if tp is str:
        return {"kind": "text", "nullable": nullable}
    return {"kind": "yaml"}


def _split_optional(annotation: Any) -> Tuple[bool, Any]:
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return False, annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    nullable = len(args) < len(typing.get_args(annotation))
    return nullable, args[0] if len(args) == 1 else annotation


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _model_of(annotation: Any) -> type:
    tp = _split_optional(annotation)[1]
    return tp if _is_model(tp) else typing.get_args(tp)[0]


def _shown_default(kind: str, field: FieldInfo) -> str:
    """The default as the field's input would hold it (its placeholder on the page)."""
    if field.is_required():
        return "(required)"
    value = to_jsonable_python(field.get_default(call_default_factory=True))
    if kind == "choice":
        return json.dumps(value)
    if kind == "bool":
        return "true" if value else "false"
    if kind == "text" and isinstance(value, str):
        return value
    return yaml_text(value)


def yaml_text(value: Any) -> str:
    """One-line YAML of ``value`` (``null``, ``1.0e-06``, ``[0.9, 0.999]``, ``{}``)."""
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10**6)
    return text.strip().removesuffix("...").strip()


def parse_values(model: type, raw: Any, prefix: str = "") -> Tuple[Any, List[str]]:
    """Raw page values of section ``model`` -> YAML data, and the leaves that do not parse.

    Keys come out in the schema's order; unset (empty) leaves and empty sections are left
    out, so the data holds exactly what the user set.
    """
    if not isinstance(raw, dict):
        return raw, []
    data: Dict[str, Any] = {}
    problems: List[str] = []
    for name, field in model.model_fields.items():
        if name in raw:
            path = join_path(prefix, name)
            value, found = _parse_field(field, raw[name], path)
            problems += found
            if value is not _UNSET:
                data[name] = value
    extra, found = _parse_extra(raw, prefix)
    problems += found
    for name, value in raw.items():
        if name not in model.model_fields and name != EXTRA:
            extra.setdefault(name, value)
    data.update(extra)
    return data, problems


_UNSET = object()


def _parse_field(field: FieldInfo, raw: Any, path: str) -> Tuple[Any, List[str]]:
    spec = field_kind(field.annotation)
    kind = spec["kind"]
    if kind == "section":
        data, problems = parse_values(_model_of(field.annotation), raw, path)
        return (_UNSET if data == {} else data), problems
    if kind == "list" and isinstance(raw, list):
        model = _model_of(field.annotation)
        items = [parse_values(model, item, join_path(path, i)) for i, item in enumerate(raw)]
        return [d for d, _ in items], [p for _, found in items for p in found]
    if not isinstance(raw, str):
        return raw, []  # a bool, or a value pydantic will name
    if raw.strip() == "":
        return _UNSET, []
    if kind == "choice":
        try:
            return json.loads(raw), []
        except json.JSONDecodeError:
            return raw, []
    if kind == "number":
        return _number(raw, path)
    if kind == "yaml":
        return _load_yaml(raw, path)
    return raw, []


def _number(text: str, path: str) -> Tuple[Any, List[str]]:
    # float() first: YAML 1.1 reads 3e-5 (no dot) as a string, Python as the number it is.
    for kind in (int, float):
        try:
            return kind(text.strip()), []
        except ValueError:
            pass
    return _load_yaml(text, path)  # null, ${...}, or a wrong value pydantic will name


def _load_yaml(text: str, path: str) -> Tuple[Any, List[str]]:
    try:
        return yaml.safe_load(text), []
    except yaml.YAMLError as exc:
        reason = str(exc).splitlines()[0]
        return _UNSET, [f"{path}: not valid YAML: {reason}"]


def _parse_extra(raw: Dict[str, Any], prefix: str) -> Tuple[Dict[str, Any], List[str]]:
    text = raw.get(EXTRA)
    if not isinstance(text, str) or not text.strip():
        return {}, []
    label = join_path(prefix, "(other keys)")
    value, problems = _load_yaml(text, label)
    if problems or isinstance(value, dict):
        return (value if isinstance(value, dict) else {}), problems
    return {}, [f"{label}: expected a mapping of keys, got {yaml_text(value)}"]


def raw_values(model: type, data: Any) -> Any:
    """YAML data of section ``model`` -> the page's raw values (inverse of ``parse_values``)."""
    if not isinstance(data, dict):
        return data
    raw: Dict[str, Any] = {}
    extra: Dict[str, Any] = {}
    for name, value in data.items():
        field = model.model_fields.get(name)
        if field is None:
            extra[name] = value
        else:
            raw[name] = _raw_field(field, value)
    if extra:
        raw[EXTRA] = yaml.safe_dump(extra, sort_keys=False, allow_unicode=True)
    return raw


def _raw_field(field: FieldInfo, value: Any) -> Any:
    spec = field_kind(field.annotation)
    kind = spec["kind"]
    if kind == "section" and isinstance(value, dict):
        return raw_values(_model_of(field.annotation), value)
    if kind == "list" and isinstance(value, list):
        return [raw_values(_model_of(field.annotation), item) for item in value]
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "choice" and json.dumps(value) in spec["choices"]:
        return json.dumps(value)
    if kind == "text" and isinstance(value, str):
        return value
    return yaml_text(value)  # numbers, YAML, and wrongly typed values shown as written
