"""Apply the tables of ``legacy.py`` to a config as the file wrote it (before validation).

``read_earlier_names`` reads the whole config and each stage (a partial config) alike: the
keys and values of earlier releases become their current form, each with one log line, so
an unknown-key error never fires for them; what is refused is returned as problems.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Dict, Iterator, List, Tuple, Union

from trinity.common.config.base import join_path
from trinity.common.config.legacy import (
    DROPPED,
    REFUSED,
    RENAMED,
    RENAMED_VALUES,
    STORAGE_PLACES,
    VALUES_UNTIL,
    Renamed,
)

logger = logging.getLogger("trinity.config")

Key = Union[str, int]
_ABSENT = object()
_WARMUP = "buffer.trainer_input.sft_warmup_dataset"
_WARMUP_STEPS = "buffer.trainer_input.sft_warmup_steps"
# The auxiliary buffer the mix algorithms read their expert data from (sample_strategy/mix.py)
_EXPERT = "sft_dataset"


def read_earlier_names(data: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """``data`` with earlier releases' keys and values in their current form (a copy; one
    log line per change), and one problem per key that is refused."""
    data = copy.deepcopy(data)
    notes: List[str] = []
    problems: List[str] = []
    original = copy.deepcopy(data)
    for prefix, scope, before in _scopes(data, original):

        def get(path: str, before: Dict[str, Any] = before) -> Any:
            """The value the file wrote at ``path`` (a stage's own, else the whole config's)."""
            value = _get(before, path)
            value = _get(original, path) if value is _ABSENT else value
            return None if value is _ABSENT else value

        problems += _refuse(scope, prefix)
        _rename_keys(scope, prefix, get, notes, problems)
        notes += _drop(scope, prefix)
        _sft_warmup(scope, prefix, notes, problems)
        notes += _rename_values(scope, prefix)
    for note in notes:
        logger.warning("%s", note)
    return data, problems


def _scopes(
    data: Dict[str, Any], original: Dict[str, Any]
) -> Iterator[Tuple[str, Dict[str, Any], Dict[str, Any]]]:
    """(prefix, section, that section as written) of the config and of each stage the file
    wrote (not those the whole config's SFT warm-up becomes, made of names already read)."""
    stages = data.get("stages")
    written = list(stages) if isinstance(stages, list) else []
    yield "", data, original
    for index, stage in enumerate(written):
        if isinstance(stage, dict):
            yield f"stages[{index}]", stage, original["stages"][index]


def expand(pattern: str) -> List[str]:
    """``<storage>.x`` -> ``x`` under every place a dataset is configured; else itself."""
    if pattern.startswith("<storage>."):
        rest = pattern[len("<storage>.") :]
        return [f"{place}.{rest}" for place in STORAGE_PLACES]
    return [pattern]


def find(node: Any, pattern: str) -> Iterator[Tuple[Tuple[Key, ...], Tuple[Key, ...]]]:
    """(concrete path, what each ``*`` matched) of every key ``pattern`` names in ``node``."""
    yield from _find(node, pattern.split("."), ())


def _find(node: Any, parts: List[str], bound: Tuple[Key, ...]) -> Iterator[Tuple[Tuple, Tuple]]:
    if not parts:
        yield (), bound
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        for key, child in _items(node):
            for path, more in _find(child, rest, bound + (key,)):
                yield (key, *path), more
    elif isinstance(node, dict) and head in node:
        for path, more in _find(node[head], rest, bound):
            yield (head, *path), more


def _items(node: Any) -> List[Tuple[Key, Any]]:
    """(key or index, child) of a mapping or a list; nothing for a value."""
    if isinstance(node, dict):
        return list(node.items())
    return list(enumerate(node)) if isinstance(node, list) else []


def _get(node: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _ABSENT
    return node


def _at(node: Any, path: Tuple[Key, ...]) -> Any:
    for part in path:
        node = node[part]
    return node


def _pop(node: Any, path: Tuple[Key, ...]) -> Any:
    return _at(node, path[:-1]).pop(path[-1])


def _bind(pattern: str, bound: Tuple[Key, ...]) -> Tuple[Key, ...]:
    """``pattern``'s parts with each ``*`` replaced by the next matched key."""
    values = iter(bound)
    return tuple(next(values) if part == "*" else part for part in pattern.split("."))


def _put(node: Any, path: Tuple[Key, ...], value: Any) -> None:
    """Set ``value`` at ``path``, making the mappings on the way (a list item must exist)."""
    for part in path[:-1]:
        if isinstance(node, dict) and not isinstance(node.get(part), (dict, list)):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def show_path(prefix: str, path: Tuple[Key, ...]) -> str:
    """A concrete path as messages print it: ``buffer.explorer_input.tasksets[0].name``."""
    text = prefix
    for part in path:
        text = join_path(text, part)
    return text


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if value != "" else "''"


def _refuse(scope: Dict[str, Any], prefix: str) -> List[str]:
    """Remove the refused keys (so no unknown-key error repeats them); one problem per reason."""
    found: Dict[Tuple[str, str], List[str]] = {}
    for pattern, refused in REFUSED.items():
        for path, _ in list(find(scope, pattern)):
            _pop(scope, path)
            found.setdefault((refused.until, refused.why), []).append(show_path(prefix, path))
    return [
        f"{', '.join(keys)} (Trinity-RFT {until}): {why}" for (until, why), keys in found.items()
    ]


def _rename_keys(
    scope: Dict[str, Any], prefix: str, get: Any, notes: List[str], problems: List[str]
) -> None:
    for old_pattern, renamed in RENAMED.items():
        for old, new in zip(expand(old_pattern), expand(renamed.new), strict=True):
            for path, bound in list(find(scope, old)):
                _rename_one(scope, prefix, path, _bind(new, bound), renamed, get, notes, problems)


def _rename_one(
    scope: Dict[str, Any],
    prefix: str,
    path: Tuple[Key, ...],
    target: Tuple[Key, ...],
    renamed: Renamed,
    get: Any,
    notes: List[str],
    problems: List[str],
) -> None:
    value = _pop(scope, path)
    old_text, new_text = show_path(prefix, path), show_path(prefix, target)
    new_value = renamed.convert(value, get) if renamed.convert else value
    present = _get(scope, ".".join(str(p) for p in target))
    if present is not _ABSENT and present != new_value and not _same(present, new_value):
        if renamed.new_wins:
            notes.append(
                f"{old_text} = {_show(value)} is not read: {new_text} = {_show(present)} is "
                f"set, which replaced it after Trinity-RFT {renamed.until}"
            )
        else:
            problems.append(
                f"{old_text} = {_show(value)} (the Trinity-RFT {renamed.until} name of "
                f"{new_text}) and {new_text} = {_show(present)} disagree; set only {new_text}"
            )
        return
    _put(scope, target, new_value)
    how = f" ({renamed.how})" if renamed.how else ""
    notes.append(
        f"{old_text} = {_show(value)} (Trinity-RFT {renamed.until} and earlier) is read as "
        f"{new_text} = {_show(new_value)}{how}"
    )


def _same(a: Any, b: Any) -> bool:
    """Equal as YAML reads them (a tuple of betas and the list a file writes)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return False


def _sft_warmup(scope: Dict[str, Any], prefix: str, notes: List[str], problems: List[str]) -> None:
    """SFT warm-up (0.1.1 .. 0.3.1): ``sft_warmup_steps`` steps of SFT on
    ``sft_warmup_dataset`` before RL became a first ``mode: train`` stage; the dataset alone
    (no steps) was the mix algorithms' expert data, now an auxiliary buffer."""
    written, dataset = _get(scope, _WARMUP_STEPS), _get(scope, _WARMUP)
    if written is _ABSENT and dataset is _ABSENT:
        return
    trainer_input = scope["buffer"]["trainer_input"]
    trainer_input.pop("sft_warmup_steps", None)
    trainer_input.pop("sft_warmup_dataset", None)
    steps = 0 if written in (_ABSENT, None) else written
    warm_key = show_path(prefix, tuple(_WARMUP.split(".")))
    steps_key = show_path(prefix, tuple(_WARMUP_STEPS.split(".")))
    if dataset in (_ABSENT, None):
        if steps:
            problems.append(f"{steps_key} = {steps} needs {warm_key}, the data to warm up on")
        else:
            notes.append(f"{steps_key} = {_show(written)} (Trinity-RFT 0.3.1) is not read: off")
        return
    if not steps:
        _expert_data(scope, dataset, warm_key, notes, problems)
        return
    if prefix or scope.get("stages"):
        problems.append(
            f"{steps_key} = {steps}: an SFT warm-up is a stage since Trinity-RFT 0.4.0; with "
            "stages, put it first: {stage_name: sft_warmup, mode: train, algorithm: "
            "{algorithm_type: sft}, buffer: {total_steps: N, trainer_input: "
            "{experience_buffer: <the dataset>}}}"
        )
        return
    scope["stages"] = [_warmup_stage(scope, steps, dataset), {"stage_name": "rft"}]
    notes.append(
        f"{steps_key} = {steps} with {warm_key} (Trinity-RFT 0.3.1 and earlier) is read as "
        f"stages: sft_warmup (mode train, algorithm sft, {steps} steps on that dataset), then "
        "rft (the rest of this config)"
    )


def _expert_data(
    scope: Dict[str, Any], dataset: Any, warm_key: str, notes: List[str], problems: List[str]
) -> None:
    trainer_input = scope["buffer"]["trainer_input"]
    auxiliary = trainer_input.setdefault("auxiliary_buffers", {})
    target = f"{warm_key.rsplit('.', 1)[0]}.auxiliary_buffers.{_EXPERT}"
    if _EXPERT in auxiliary:
        problems.append(f"{warm_key} and {target} are both set; set only {target}")
        return
    auxiliary[_EXPERT] = dataset
    notes.append(
        f"{warm_key} (Trinity-RFT 0.3.1 and earlier, without sft_warmup_steps: the expert data "
        f"of the mix algorithms) is read as {target}"
    )


def _warmup_stage(scope: Dict[str, Any], steps: int, dataset: Any) -> Dict[str, Any]:
    """The first stage the warm-up was: SFT on the dataset with the run's optimizer, reading
    ``batch_size * repeat_times`` rows a step as the original did."""
    buffer, algorithm = scope.get("buffer", {}), scope.get("algorithm", {})
    rows = buffer.get("train_batch_size") or (
        (buffer.get("batch_size") or 1) * (algorithm.get("repeat_times") or 1)
    )
    stage: Dict[str, Any] = {
        "stage_name": "sft_warmup",
        "mode": "train",
        "algorithm": {"algorithm_type": "sft"},
        "buffer": {
            "total_steps": steps,
            "train_batch_size": rows,
            "trainer_input": {"experience_buffer": dataset},
        },
    }
    if "optimizer" in algorithm:
        stage["algorithm"]["optimizer"] = copy.deepcopy(algorithm["optimizer"])
    return stage


def _drop(scope: Dict[str, Any], prefix: str) -> List[str]:
    """Remove the keys that mean nothing here; one line per reason."""
    found: Dict[Tuple[str, str, str], List[str]] = {}
    for pattern, dropped in DROPPED.items():
        for concrete in expand(pattern):
            for path, _ in list(find(scope, concrete)):
                value = _pop(scope, path)
                text = f"{show_path(prefix, path)} = {_show(value)}"
                found.setdefault((dropped.until, dropped.did, dropped.why), []).append(text)
    return [
        f"{', '.join(keys)} (Trinity-RFT {until} and earlier: {did}) is not read here: {why}"
        for (until, did, why), keys in found.items()
    ]


def _rename_values(scope: Dict[str, Any], prefix: str) -> List[str]:
    notes = []
    for pattern, renames in RENAMED_VALUES.items():
        for concrete in expand(pattern):
            for path, _ in list(find(scope, concrete)):
                value = _at(scope, path)
                if not isinstance(value, str):
                    continue
                lower = value.lower()
                new = renames.get(lower, lower)
                if new == value:
                    continue
                _put(scope, path, new)
                if lower in renames:
                    why = f"Trinity-RFT {VALUES_UNTIL.get(lower, '0.5.2')} and earlier"
                else:
                    why = "the original read these names in any case"
                notes.append(f"{show_path(prefix, path)} = {value} ({why}) is read as {new}")
    return notes
