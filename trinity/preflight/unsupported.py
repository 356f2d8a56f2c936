"""Values outside what this build supports (``support.SUPPORTED``): a line each, and a value
it supports in each one's place, so that the checks after this one still run.

A replaced value's key is "set aside": the other checks' lines that mention it would be
about the replacement, not about what the user wrote, so the caller drops them
(``not_naming``) and says more problems may follow. An unknown ``algorithm_type`` is not
replaced (every algorithm changes what the rest of the config means); the checks that need
its class skip it instead (``support.algorithm_class``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple

from trinity.common.config.base import assign, join_path
from trinity.common.config.config import Config
from trinity.common.registry import plugin_hint
from trinity.preflight.support import DOCUMENTED, NOT_BUILT, SUPPORTED, show, values_at
from trinity.utils.suggest import did_you_mean

ALGORITHM_TYPE_KEY = "algorithm.algorithm_type"


@dataclass
class _Outside:
    """A value outside its ``SUPPORTED`` row: where it is and what is allowed there."""

    pattern: str
    path: str
    owner: Any  # the section holding it
    name: str  # its field in that section
    allowed: Tuple[Any, ...]
    why: str  # why the others do not run (``NOT_BUILT``), or ""

    @property
    def value(self) -> Any:
        return getattr(self.owner, self.name)


def _outside_values(config: Config) -> List[_Outside]:
    found = []
    for pattern, allowed in SUPPORTED.items():
        values = allowed(config) if callable(allowed) else allowed
        owner_pattern, _, name = pattern.rpartition(".")
        owners = values_at(config, owner_pattern) if owner_pattern else [("", config)]
        for owner_path, owner in owners:
            if owner is not None and getattr(owner, name) not in values:
                path = join_path(owner_path, name)
                why = NOT_BUILT.get(pattern, "")
                why = why(config) if callable(why) else why
                found.append(_Outside(pattern, path, owner, name, values, why))
    return found


def check_supported(config: Config) -> List[str]:
    """One line per value outside ``SUPPORTED``: "<path> = <value> is not supported yet" for
    what the guide documents, "<path>: unknown <key> '<value>'" for a name it does not."""
    return [_line(outside) for outside in _outside_values(config)]


def set_aside(config: Config) -> Tuple[List[str], List[str]]:
    """``check_supported``'s lines, and the keys set aside (``set_aside_keys``): each value
    outside ``SUPPORTED`` is replaced in ``config`` by its field's default, or else the first
    supported value."""
    found = _outside_values(config)  # all first: a row may depend on another's value
    lines = [_line(outside) for outside in found]
    keys = [_key(outside) for outside in found]
    for outside in found:
        if outside.path == ALGORITHM_TYPE_KEY:
            continue
        field = type(outside.owner).model_fields[outside.name]
        choices = [field.default, *outside.allowed]
        replacement = next((v for v in choices if v in outside.allowed), outside.value)
        assign(outside.owner, outside.name, replacement)
    return lines, keys


def set_aside_keys(config: Config) -> List[str]:
    """The keys ``set_aside`` would set aside, ``config`` left as it is. The key of a
    name-valued field (``DOCUMENTED``: a storage, engine or monitor type) is its section's,
    since the name decides what the whole section means."""
    return [_key(outside) for outside in _outside_values(config)]


def _key(outside: _Outside) -> str:
    named = outside.pattern in DOCUMENTED and outside.path != ALGORITHM_TYPE_KEY
    return outside.path.rsplit(".", 1)[0] if named else outside.path


def not_naming(problems: Sequence[str], keys: Sequence[str]) -> List[str]:
    """``problems`` less the lines that name one of ``keys`` (or a key below one): their
    values were not the user's (set aside here, or left at a default because they did not
    parse), so such a line could be wrong."""
    if not keys:
        return list(problems)
    names = "|".join(re.escape(key) for key in keys)
    named = re.compile(rf"(?<![\w.])(?:{names})(?![\w])")
    return [problem for problem in problems if not named.search(problem)]


def _line(outside: _Outside) -> str:
    value, values, pattern = outside.value, outside.allowed, outside.pattern
    choices = [show(v) for v in values if v is not None]
    choices += ["unset"] if None in values else []
    documented = DOCUMENTED.get(pattern)
    documented = documented() if callable(documented) else documented
    if documented is not None and value not in documented:
        key = pattern.rsplit(".", 1)[-1]
        hint = did_you_mean(value, [v for v in values if v is not None])
        known = f"(known: {', '.join(choices)}); {plugin_hint(dotted=False)}"
        return f"{outside.path}: unknown {key} '{show(value)}'{hint} {known}"
    supported = ", ".join(choices)
    why = f": {outside.why}" if outside.why else ""
    shown = "{...}" if isinstance(value, dict) and value else show(value)
    return f"{outside.path} = {shown} is not supported yet{why} (supported: {supported})"
