"""Command-line overrides (``a.b.c=value``) and how they reach the stages of a config.

The rule, chosen so that nothing a user types is dropped without a word:

- ``stages.N.a.b=value`` changes stage N only, and wins over the global form.
- A global ``a.b=value`` changes the global config and reaches every stage. The command
  line is the most recent statement of intent, so it also replaces a value a stage set
  itself (in ``algorithm``, ``buffer``, ``explorer``, ``trainer``), and one line per stage
  says so: ``buffer.total_steps=2`` shortens every stage. Where a stage sets its own list
  on the way to the key (its own ``eval_tasksets``), a line says the override missed it.
- Where two keys set one setting (``buffer.total_steps`` and ``trainer.total_steps``, a veRL
  key and its algorithm key, an earlier release's name and the current one: ``aliases.py``),
  an override of one replaces the file's other, with one line saying which value won.
- A global ``mode=M`` says which halves this process runs. A stage with its own mode runs
  what both allow: ``mode=explore`` on a train-only stage leaves it nothing, so the stage is
  skipped (said in one line); ``mode=both`` keeps a train-only stage training.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, FrozenSet, List, Sequence, Tuple

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trinity.common.config.aliases import prefer_command_line
from trinity.common.config.base import ConfigError
from trinity.common.config.config import StageConfig
from trinity.common.config.schema_algorithm import AlgorithmConfig

logger = logging.getLogger("trinity.config")

# What each mode runs; a stage's own mode and the command line's meet on the intersection.
MODE_PARTS: Dict[str, FrozenSet[str]] = {
    "both": frozenset({"explore", "train"}),
    "colocate": frozenset({"explore", "train"}),
    "explore": frozenset({"explore"}),
    "train": frozenset({"train"}),
    "bench": frozenset({"bench"}),
    "serve": frozenset({"serve"}),
}
_ABSENT = object()


def apply_overrides(raw: DictConfig, overrides: Sequence[str]) -> List[str]:
    """Apply ``overrides`` to ``raw`` in place by the rule above; log and return the notes.

    The notes are the stage values the command line replaced and the stages it skipped.
    """
    parsed = prefer_command_line(raw, [_parse(item) for item in overrides])
    staged = [(key, value) for key, value in parsed if key.split(".")[0] == "stages"]
    stage_notes: List[Tuple[str, str]] = []  # (stage name, note)
    for key, value in parsed:
        if key.split(".")[0] == "stages":
            continue
        _update(raw, key, value, key)
        if key != "mode":
            stage_notes += _reach_stages(raw, key, value, [k for k, _ in staged])
    for key, value in staged:
        _update(raw, key, value, key)
    names = {name for _, name in _stages(raw)}
    mode = [value for key, value in parsed if key == "mode"]
    mode_notes = _meet_modes(raw, str(mode[-1])) if mode and raw.get("stages") else []
    gone = names - {name for _, name in _stages(raw)}  # skipped: their values do not matter
    notes = [note for name, note in stage_notes if name not in gone] + mode_notes
    for note in notes:
        logger.warning("%s", note)
    return notes


def _parse(item: str) -> Tuple[str, Any]:
    """``a.b.c=value`` -> (``a.b.c``, value parsed as YAML: numbers, lists, null)."""
    key, sep, value = item.partition("=")
    if key.strip().startswith(("+", "~")):
        raise ConfigError(_hydra_message(item, key.strip(), value))
    if not sep or not key.strip():
        raise ConfigError(f"override '{item}' must look like section.key=value")
    key = key.strip()
    try:
        # from_dotlist parses the value the same way the YAML file is parsed.
        value = OmegaConf.select(OmegaConf.from_dotlist([item]), key)
    except (OmegaConfBaseException, yaml.YAMLError, ValueError, TypeError) as exc:
        reason = str(exc).splitlines()[0]
        raise ConfigError(f"override '{item}': cannot parse it: {reason}") from None
    return key, value


def _hydra_message(item: str, key: str, value: str) -> str:
    """Hydra's ``+key=value`` (add), ``++key=value`` (force) and ``~key`` (delete) are not
    this command line's: every key of the schema is set as ``key=value``."""
    plain = key.lstrip("+~")
    if key.startswith("~"):
        return (
            f"override '{item}': Hydra's ~key syntax is not used here; write {plain}=null "
            "to unset a key"
        )
    return (
        f"override '{item}': Hydra's +key=value syntax is not used here; write "
        f"{plain}={value} (any key of the config is set as section.key=value)"
    )


def _update(raw: DictConfig, key: str, value: Any, item: str) -> None:
    try:
        OmegaConf.update(raw, key, value, merge=True)
    except (OmegaConfBaseException, ValueError, TypeError) as exc:
        reason = str(exc).splitlines()[0]
        raise ConfigError(f"override '{item}': cannot apply it: {reason}") from None


def _stages(raw: DictConfig) -> List[Tuple[int, str]]:
    """(index, stage_name) of every stage entry that is a mapping."""
    stages = raw.get("stages")
    if not isinstance(stages, ListConfig):
        return []
    return [
        (i, str(s.get("stage_name", i))) for i, s in enumerate(stages) if isinstance(s, DictConfig)
    ]


def _own(raw: DictConfig, path: str) -> Any:
    value = OmegaConf.select(raw, path, default=_ABSENT, throw_on_resolution_failure=False)
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _reach_stages(
    raw: DictConfig, key: str, value: Any, staged: List[str]
) -> List[Tuple[str, str]]:
    """Carry a global override into every stage that would not inherit it; (stage name,
    note) per stage value it replaced or could not reach."""
    if key.split(".")[0] not in StageConfig.model_fields:
        return []
    plain = OmegaConf.to_container(value) if isinstance(value, DictConfig) else value
    notes = []
    for index, name in _stages(raw):
        if f"stages.{index}.{key}" in staged:
            continue  # set for this stage on the command line too: that one wins
        own = _own(raw, f"stages.{index}.{key}")
        if own is _ABSENT:
            blocked = _own_list_above(raw, index, key)
            if blocked:  # the stage's own list replaces the global one whole
                text = (
                    f"{key}={_show(plain)} (command line) does not reach stage '{name}', which "
                    f"sets its own {blocked}; stages.{index}.{key}=... sets it there"
                )
                notes.append((name, text))
                continue
            if not _resets_algorithm(raw, index, key):
                continue  # the stage inherits the new global value
        elif own != plain:
            text = (
                f"{key}={_show(plain)} (command line) replaces {_show(own)}, the value stage "
                f"'{name}' sets; stages.{index}.{key}=... sets one stage alone"
            )
            notes.append((name, text))
        _update(raw, f"stages.{index}.{key}", value, f"{key}={_show(plain)}")
    return notes


def _own_list_above(raw: DictConfig, index: int, key: str) -> str:
    """The path of a list the stage sets on the way to ``key`` ('' if none)."""
    parts = key.split(".")
    for end in range(1, len(parts)):
        prefix = ".".join(parts[:end])
        if isinstance(_own(raw, f"stages.{index}.{prefix}"), list):
            return prefix
    return ""


def _resets_algorithm(raw: DictConfig, index: int, key: str) -> bool:
    """A stage that picks another algorithm_type starts from that algorithm's defaults
    (``merge_stage``), so a global ``algorithm.*`` override must be set in it."""
    if key.split(".")[0] != "algorithm":
        return False
    own_type = _own(raw, f"stages.{index}.algorithm.algorithm_type")
    global_type = _own(raw, "algorithm.algorithm_type")
    if global_type in (_ABSENT, None):
        global_type = AlgorithmConfig.model_fields["algorithm_type"].default
    return own_type not in (_ABSENT, None, global_type)


def _meet_modes(raw: DictConfig, mode: str) -> List[str]:
    """Each stage with its own mode runs what it and ``mode`` both allow, or is skipped."""
    if mode not in MODE_PARTS or mode == "bench":  # bench: every stage is benchmarked
        return []
    notes, skipped = [], []
    for index, name in _stages(raw):
        own = _own(raw, f"stages.{index}.mode")
        if own is _ABSENT or own is None or own == mode or own not in MODE_PARTS:
            continue
        if MODE_PARTS[mode] <= MODE_PARTS[own]:
            raw.stages[index].mode = mode
            notes.append(f"mode={mode} (command line) replaces mode {own} of stage '{name}'")
        elif MODE_PARTS[own] <= MODE_PARTS[mode]:
            notes.append(f"mode={mode} (command line): stage '{name}' keeps its own mode {own}")
        else:
            skipped.append(index)
            notes.append(
                f"mode={mode} (command line): stage '{name}' is skipped, it runs mode {own} "
                "only (a later stage starts from model.model_path, not from its weights)"
            )
    if skipped and len(skipped) == len(raw.stages):
        raise ConfigError(f"mode={mode} (command line) leaves no stage to run: " + "; ".join(notes))
    for index in reversed(skipped):
        del raw.stages[index]
    return notes


def _show(value: Any) -> str:
    return "null" if value is None else str(value)
