"""YAML in (through OmegaConf), typed ``Config`` out; and the resolved YAML back to disk."""

from __future__ import annotations

import logging
import os
import re
from datetime import datetime
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trinity.common.config.base import ConfigError, validate_known
from trinity.common.config.config import Config
from trinity.common.config.legacy_read import read_earlier_names
from trinity.common.config.overrides import apply_overrides

logger = logging.getLogger("trinity.config")

# A config as a run takes it: a YAML file's path, or the file's sections as a dict.
ConfigSource = Union[str, "os.PathLike[str]", Mapping[str, Any]]


def load_config(source: ConfigSource, overrides: Sequence[str] = ()) -> Config:
    """Load a YAML config (a file, or its sections as a dict), apply ``a.b.c=value``
    overrides, resolve interpolation, validate.

    Overrides reach the stages as ``trinity.common.config.overrides`` describes.

    ``${oc.env:VAR,default}`` and ``${other.key}`` are resolved by OmegaConf. Nothing is
    derived and the filesystem is not touched beyond reading the file; call
    ``trinity.preflight.derive.finalize`` for that. Raises ``ConfigError`` listing every
    problem of the schema (``read_config`` returns them with what could be read instead).
    """
    config, problems, _ = read_config(source, overrides)
    if problems:
        raise ConfigError(problems)
    return config


def read_config(
    source: ConfigSource, overrides: Sequence[str] = ()
) -> Tuple[Config, List[str], List[str]]:
    """``load_config`` for the checks that follow it: (the config built from the valid part
    of the file, the schema's problems, the keys whose values did not parse), as
    ``base.validate_known`` describes. Raises ``ConfigError`` only where nothing can be
    built (no file, not YAML, a malformed override, an interpolation that does not resolve);
    it then says that more problems may follow.
    """
    try:
        raw = _read(source)
        base = os.path.dirname(os.path.abspath(os.fspath(source))) if _is_path(source) else None
        _read_trainer_config_files(raw, base)
        apply_overrides(raw, overrides)
        for prefix in _verl_trees(raw):
            _interpolate_within(raw, prefix)
        data = _resolved(raw)
    except ConfigError as exc:
        raise ConfigError(exc.problems, incomplete=True) from None
    data, refused = read_earlier_names(data)  # earlier releases' names (legacy.py)
    config, problems, unread = validate_known(Config, data)
    return config, refused + problems, unread


def _resolved(raw: DictConfig) -> Any:
    try:
        return OmegaConf.to_container(raw, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        reason = str(exc).splitlines()[0]
        raise ConfigError(f"{key}: cannot resolve interpolation: {reason}") from None


# ${oc.env:VAR,default}/...: a path under a folder an environment variable names
_ENV_FOLDER = re.compile(r"\$\{oc\.env:([A-Za-z_]\w*),\s*['\"]?([^${}'\"]+)['\"]?\}/")


def env_folder_defaults(source: ConfigSource, overrides: Sequence[str] = ()) -> Dict[str, str]:
    """``{VAR: default}`` of the config's ``${oc.env:VAR,default}/...`` paths (after the
    overrides): folders a variable names, such as the examples' ``TRINITY_QUICKSTART_DIR``
    (``preflight/env_folders.py`` says once that one is missing)."""
    raw = _read(source)
    apply_overrides(raw, overrides)
    found = {}
    for value in _strings(OmegaConf.to_container(raw, resolve=False)):
        found.update({m.group(1): m.group(2).strip() for m in _ENV_FOLDER.finditer(value)})
    return found


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def _is_path(source: ConfigSource) -> bool:
    return not isinstance(source, Mapping)


def _read_trainer_config_files(raw: DictConfig, base: Optional[str]) -> None:
    """``trainer.trainer_config_path`` (Trinity-RFT 0.2.0 and earlier; in each stage too):
    a veRL YAML file read as ``trainer.trainer_config``, as the original read it when
    ``trainer_config`` was empty. A relative path is looked up from the working directory,
    then from the config file's folder and each folder above it."""
    sections = ["trainer"]
    stages = raw.get("stages")
    if OmegaConf.is_list(stages):
        sections += [f"stages.{i}.trainer" for i in range(len(stages))]
    for section in sections:
        node = OmegaConf.select(raw, section)
        if not OmegaConf.is_dict(node) or "trainer_config_path" not in node:
            continue
        path = node.pop("trainer_config_path")
        key = f"{section}.trainer_config_path"
        if not path:
            continue
        if node.get("trainer_config"):
            logger.warning(
                "%s = %s (Trinity-RFT 0.2.0 and earlier) is not read: %s.trainer_config is "
                "set, which the original read instead",
                key,
                path,
                section,
            )
            continue
        node.trainer_config = _verl_file(key, str(path), base)
        logger.warning(
            "%s = %s (Trinity-RFT 0.2.0 and earlier) is read as %s.trainer_config (the "
            "file's veRL keys)",
            key,
            path,
            section,
        )


def _verl_file(key: str, path: str, base: Optional[str]) -> DictConfig:
    candidates = [path]
    while base and not os.path.isabs(path):  # the original's examples name it from the repo root
        candidates.append(os.path.join(base, path))
        base = None if os.path.dirname(base) == base else os.path.dirname(base)
    found = next((p for p in candidates if os.path.isfile(p)), None)
    if found is None:
        raise ConfigError(f"{key} = {path}: file not found ({os.path.abspath(path)})")
    return _load_mapping(found, f"{key} = {path}", "the file must hold a mapping of veRL sections")


def _load_mapping(path: str, label: str, otherwise: str) -> DictConfig:
    """The YAML file at ``path`` as OmegaConf reads it; errors start with ``label``, and
    ``otherwise`` says what a file that is not a mapping should hold."""
    try:
        tree = OmegaConf.load(path)
    except (OmegaConfBaseException, yaml.YAMLError) as exc:
        raise ConfigError(f"{label}: not valid YAML: {exc}") from None
    if not isinstance(tree, DictConfig):
        raise ConfigError(f"{label}: {otherwise}")
    return tree


def _read(source: ConfigSource) -> DictConfig:
    """The config's sections as OmegaConf reads them, from a YAML file or a mapping."""
    if isinstance(source, Mapping):
        try:
            return OmegaConf.create(dict(source))
        except OmegaConfBaseException as exc:
            raise ConfigError(f"the config dict cannot be read: {exc}") from None
    path = os.fspath(source)
    if not os.path.isfile(path):
        shown = path if os.path.isabs(path) else f"{path} ({os.path.abspath(path)})"
        raise ConfigError(f"config file not found: {shown}")
    return _load_mapping(path, path, "the top level must be a mapping of sections")


_KEY_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")  # ${a.b.c}, not ${resolver:...}
_MISSING = object()


def _verl_trees(raw: DictConfig) -> List[str]:
    """Where ``trainer.trainer_config`` sits: at the top and in each stage."""
    prefixes = ["trainer.trainer_config"]
    stages = raw.get("stages")
    if OmegaConf.is_list(stages):
        prefixes += [f"stages.{i}.trainer.trainer_config" for i in range(len(stages))]
    return [p for p in prefixes if OmegaConf.is_dict(OmegaConf.select(raw, p))]


def _interpolate_within(raw: DictConfig, prefix: str) -> None:
    """veRL keys pasted under ``prefix`` keep their meaning: a veRL file's
    ``${actor_rollout_ref.actor.use_dynamic_bsz}`` names a key of that file, so a reference
    found inside the tree is pointed there; any other resolves from the top as usual."""
    tree = OmegaConf.select(raw, prefix)

    def point(match: re.Match) -> str:
        inside = OmegaConf.select(tree, match.group(1), default=_MISSING)
        return f"${{{prefix}.{match.group(1)}}}" if inside is not _MISSING else match.group(0)

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return _KEY_REFERENCE.sub(point, value) if isinstance(value, str) else value

    OmegaConf.update(raw, prefix, walk(OmegaConf.to_container(tree, resolve=False)), merge=False)


def apply_run_name(config: Config) -> Config:
    """With ``continue_from_checkpoint: false``, rename the run to ``<name>_<timestamp>``.

    The launcher calls this once, before anything reads ``name``, so every component of
    the run (and every stage) sees the same new name. ``mode: bench`` starts no new run: it
    evaluates the checkpoints of the run ``name`` is, so it keeps the name.
    """
    if config.continue_from_checkpoint or config.mode == "bench":
        return config
    stamp = datetime.now().strftime("%Y%m%d%H%M%S")
    return config.model_copy(update={"name": f"{config.name}_{stamp}"}, deep=True)


def save_resolved_config(config: Config, path: str) -> None:
    """Write every field of ``config`` (derived values included) as YAML.

    Stages are written as the user gave them (they only mean something as overrides). Of the
    veRL ``trainer_config`` tree, hundreds of keys, the file holds what the user wrote and
    every value that differs from its default, derived ones included (the trainer's
    ``param_dtype``): the rest are the tree's defaults.
    """
    data: Any = config.model_dump(mode="json")
    data["stages"] = [s.model_dump(mode="json", exclude_unset=True) for s in config.stages]
    verl = config.trainer.trainer_config
    data["trainer"]["trainer_config"] = _merged(
        verl.model_dump(mode="json", exclude_unset=True),
        verl.model_dump(mode="json", exclude_defaults=True),
    )
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False, allow_unicode=True)


def _merged(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """The keys of both nested dicts; where both hold a dict, merged likewise."""
    out = dict(a)
    for key, value in b.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out
