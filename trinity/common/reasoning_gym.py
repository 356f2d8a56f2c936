"""reasoning-gym's procedural datasets as task rows, and their own scoring.

A ``storage_type: reasoning_gym`` taskset (``ReasoningGymConfig``) names reasoning-gym
datasets; ``generate_rows`` draws its rows as reasoning-gym does: one dataset is
``reasoning_gym.create_dataset(name, seed=seed, size=size, **config)``, several are
reasoning-gym's weighted ``CompositeDataset`` (row i from the dataset the weights pick with
``Random(seed + i)``, that dataset's own seed being ``seed`` + its position + 1). Each row
holds the question and the answer, under the taskset's ``format.prompt_key`` and
``response_key``, and in its ``reasoning_gym`` column what scoring needs: the dataset's name,
the arguments that rebuild it (seed and size included, JSON) and the row's index in it, with
the entry's metadata (JSON, for reading).

``score`` rebuilds the entry from that column and calls its dataset's own ``score_answer`` on
the answer reasoning-gym's ``extract_answer`` reads from a reply (the last
``<answer>...</answer>``). The entry is rebuilt, not read back from the row: Arrow and JSON
turn tuples into lists, and arc_agi's ``score_answer`` scores its own answer 0.05 against an
entry whose grid became lists.

The package is optional (the ``reasoning_gym`` extra) and imported only when called.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
from typing import Any, Dict, List, Optional, Tuple

from trinity.utils.suggest import did_you_mean

logger = logging.getLogger(__name__)

# The row column holding what scoring needs.
COLUMN = "reasoning_gym"
# A dataset's seed and size are the taskset's (a mix derives each dataset's seed from it).
TASKSET_KEYS = ("seed", "size")
# reasoning-gym registers its mix as a dataset too; here a mix is several names instead.
COMPOSITE = "composite"


class ReasoningGymError(ValueError):
    """A reasoning_gym taskset reasoning-gym cannot generate; the message names the key."""


def _registry() -> Dict[str, Tuple[type, type]]:
    from reasoning_gym.factory import DATASETS

    return {name: classes for name, classes in DATASETS.items() if name != COMPOSITE}


def _unknown_name(name: str, label: str, names: List[str]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f"closest: {', '.join(close)}" if close else f"{len(names)} of them, e.g. {names[0]}"
    if name == COMPOSITE:
        hint = "a mix is several names under reasoning_gym.datasets, each with its weight"
    return f"{label}: reasoning-gym has no dataset '{name}' ({hint})"


def _checked_args(name: str, args: Dict[str, Any], label: str, config_cls: type) -> Dict[str, Any]:
    """``args`` as JSON gives them back (what ``score`` rebuilds the dataset with), each a
    field of the dataset's config class and neither seed nor size."""
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in TASKSET_KEYS]
    for key in args:
        if key in TASKSET_KEYS:
            raise ReasoningGymError(
                f"{label}.config.{key}: the {key} is the taskset's: set reasoning_gym.{key}"
            )
        if key not in fields:
            raise ReasoningGymError(
                f"{label}.config.{key}: {name}'s config ({config_cls.__name__}) has no field "
                f"'{key}'{did_you_mean(key, fields)} (fields: {', '.join(fields)})"
            )
    try:
        return json.loads(json.dumps(args))
    except (TypeError, ValueError) as exc:
        raise ReasoningGymError(f"{label}.config: not JSON data ({exc})") from None


def _create(name: str, args: Dict[str, Any], label: str, seed: int, size: int) -> Any:
    """The dataset ``name`` built with ``args``; what its config rejects, named."""
    from reasoning_gym import create_dataset

    try:
        return create_dataset(name, seed=seed, size=size, **args)
    except Exception as exc:  # its config's validate() asserts; a bad type raises anything
        reason = str(exc) or type(exc).__name__
        raise ReasoningGymError(f"{label}.config: {name} rejects {args}: {reason}") from None


def build_dataset(spec: Any, label: str) -> Tuple[Any, Dict[str, str]]:
    """(the reasoning-gym dataset ``spec`` names, dataset name -> the JSON arguments that
    rebuild it); a ``ReasoningGymError`` naming the key under ``label`` it cannot build."""
    if not spec.datasets:
        raise ReasoningGymError(
            f"{label}.datasets is empty: name a reasoning-gym dataset, e.g. basic_arithmetic"
        )
    registry = _registry()
    built, args = {}, {}
    for name, dataset in spec.datasets.items():
        key = f"{label}.datasets.{name}"
        if name not in registry:
            raise ReasoningGymError(_unknown_name(name, key, sorted(registry)))
        args[name] = _checked_args(name, dataset.config, key, registry[name][1])
        built[name] = _create(name, args[name], key, spec.seed, spec.size)
    if len(built) == 1:
        ((name, dataset),) = built.items()
    else:
        from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

        specs = [DatasetSpec(n, d.weight, dict(args[n])) for n, d in spec.datasets.items()]
        dataset = CompositeDataset(CompositeConfig(size=spec.size, seed=spec.seed, datasets=specs))
        built = dataset.datasets
    rebuild = {
        name: json.dumps({**args[name], "seed": built[name].seed, "size": built[name].size})
        for name in built
    }
    return dataset, rebuild


def generate_rows(spec: Any, label: str, prompt_key: str, response_key: str) -> List[Dict]:
    """The ``spec.size`` rows of a reasoning_gym taskset, in order (module docstring)."""
    dataset, rebuild = build_dataset(spec, label)
    rows = []
    for index in range(spec.size):
        try:
            entry = dataset[index]
        except Exception as exc:
            raise ReasoningGymError(
                f"{label}: reasoning-gym raised generating row {index}: {exc!r}"
            ) from exc
        name = entry["metadata"]["source_dataset"]
        column = {
            "dataset": name,
            "index": index,  # a mix's row i is its dataset's row i (CompositeDataset)
            "config": rebuild[name],
            "metadata": json.dumps(entry["metadata"], default=str),
        }
        rows.append({prompt_key: entry["question"], response_key: entry["answer"], COLUMN: column})
    return rows


def seed_ranges(spec: Any) -> Dict[Tuple[str, str], Tuple[int, int]]:
    """(dataset name, its arguments but seed and size, JSON) -> (first, last + 1) of the seeds
    its rows are drawn from: two tasksets whose ranges of the same key meet share rows."""
    _, rebuild = build_dataset(spec, "reasoning_gym")
    ranges = {}
    for name, text in rebuild.items():
        args = json.loads(text)
        seed, size = args.pop("seed"), args.pop("size")
        ranges[(name, json.dumps(args, sort_keys=True))] = (seed, seed + size)
    return ranges


@functools.lru_cache(maxsize=64)
def _rebuilt(name: str, config: str) -> Any:
    from reasoning_gym import create_dataset

    return create_dataset(name, **json.loads(config))


@functools.lru_cache(maxsize=4096)  # a task's n replies are scored against one entry
def _entry(name: str, config: str, index: int) -> Dict[str, Any]:
    return _rebuilt(name, config)[index]


def extract(reply: str) -> Optional[str]:
    """The answer reasoning-gym reads from ``reply``: the last <answer>...</answer>, stripped."""
    from reasoning_gym.utils import extract_answer

    return extract_answer(reply)


def score(reply: str, column: Dict[str, Any]) -> float:
    """The dataset's own ``score_answer`` of ``reply``'s answer against the entry the row's
    ``reasoning_gym`` column rebuilds. A ``score_answer`` that raises on an answer it cannot
    read (prime_factorization on a word) scores it 0, reasoning-gym's score for such answers."""
    name, config, index = column["dataset"], column["config"], int(column["index"])
    dataset, entry = _rebuilt(name, config), _entry(name, config, index)
    answer = extract(reply)
    try:
        return float(dataset.score_answer(answer, entry))
    except Exception as exc:
        logger.warning("%s.score_answer raised on the answer %r (scored 0): %r", name, answer, exc)
        return 0.0
