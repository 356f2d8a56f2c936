"""What the studio tells about the values on the page: the YAML, the problems ``trinity run``
would report before starting, and the values ``finalize`` derives."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trinity.common.config.base import ConfigError, validate_model
from trinity.common.config.config import Config
from trinity.preflight.before_start import check_before_start
from trinity.preflight.derive import derive
from trinity.preflight.unsupported import check_supported
from trinity.studio.form import parse_values, raw_values


def check(raw: Dict[str, Any]) -> Dict[str, Any]:
    """``{"yaml", "problems", "derived"}`` for the page's raw values.

    The problems are those of ``trinity run``: the schema (``load_config``), then every
    stage finalized and checked before Ray (``check_before_start``). ``derived`` maps each
    stage to ``[path, value]`` pairs ``finalize`` filled in (keys the user did not write).
    """
    data, problems = parse_values(Config, raw)
    result: Dict[str, Any] = {"yaml": to_yaml(data), "problems": problems, "derived": {}}
    if problems:
        return result
    try:
        config = validate_model(Config, _resolved(data))
        result["derived"] = derived_values(config)
        check_before_start(config, download=False)  # a hub id is looked up in the cache only
    except ConfigError as exc:
        result["problems"] = exc.problems
    return result


def _resolved(data: Dict[str, Any]) -> Any:
    """``${...}`` interpolations resolved as ``load_config`` resolves them."""
    try:
        return OmegaConf.to_container(OmegaConf.create(data), resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        reason = str(exc).splitlines()[0]
        raise ConfigError(f"{key}: cannot resolve interpolation: {reason}") from None


def derived_values(config: Config) -> Dict[str, List[Tuple[str, Any]]]:
    """Per stage, the values ``derive`` changed: ``[path, value]`` pairs."""
    labels = [stage.stage_name for stage in config.stages] or ["main"]
    found: Dict[str, List[Tuple[str, Any]]] = {}
    for label, stage in zip(labels, config.stage_configs(), strict=True):
        if check_supported(stage):
            continue  # derive would replace what it does not support: reported as problems
        final, _ = derive(stage)
        found[label] = _changes(stage.model_dump(mode="json"), final.model_dump(mode="json"))
    return found


def _changes(before: Any, after: Any, prefix: str = "") -> List[Tuple[str, Any]]:
    """``[path, value]`` where ``after`` differs; a section derived whole is one entry."""
    if isinstance(before, dict) and isinstance(after, dict):
        changes: List[Tuple[str, Any]] = []
        for key, value in after.items():
            changes += _changes(before.get(key), value, f"{prefix}.{key}" if prefix else key)
        return changes
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        changes = []
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            changes += _changes(old, new, f"{prefix}[{index}]")
        return changes
    return [] if before == after else [(prefix, after)]


def to_yaml(data: Dict[str, Any]) -> str:
    """The YAML the studio saves: what the user set, in the schema's order."""
    if not data:
        return ""
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def opening(path: Optional[str]) -> Dict[str, Any]:
    """What the page shows first, in one answer: the raw values of the YAML file at ``path``
    (none: the defaults), why it could not be loaded (``load_problems``), and their ``check``.
    """
    values: Dict[str, Any] = {}
    load_problems: List[str] = []
    if path:
        try:
            values = load(path)
        except ConfigError as exc:
            load_problems = exc.problems
    return {"values": values, "load_problems": load_problems, "check": check(values)}


def load(path: str) -> Dict[str, Any]:
    """The raw page values of a YAML file, interpolations kept as written."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except (OmegaConfBaseException, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return raw_values(Config, raw)


def save(raw: Dict[str, Any], path: str) -> str:
    """Write the page's values to ``path`` as YAML; raises ``ConfigError`` if a value does
    not parse (nothing is written then)."""
    data, problems = parse_values(Config, raw)
    if problems:
        raise ConfigError(problems, f"{path} not written")
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_yaml(data))
    return os.path.abspath(path)
