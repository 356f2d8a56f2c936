"""YAML in (through OmegaConf), typed ``Config`` out; and the resolved YAML back to disk."""

from __future__ import annotations

import os
import re
from datetime import datetime
from typing import Any, Dict, Iterator, List, Mapping, Sequence, Tuple, Union

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trinity.common.config.base import ConfigError, validate_known
from trinity.common.config.config import Config
from trinity.common.config.overrides import apply_overrides

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
        apply_overrides(raw, overrides)
        for prefix in _verl_trees(raw):
            _interpolate_within(raw, prefix)
        data = _resolved(raw)
    except ConfigError as exc:
        raise ConfigError(exc.problems, incomplete=True) from None
    return validate_known(Config, data)


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
    try:
        raw = OmegaConf.load(path)
    except (OmegaConfBaseException, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return raw


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
