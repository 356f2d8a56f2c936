"""Keys that set one setting, and which of them a run reads when the command line sets one.

Some settings can be written under two keys: ``buffer.total_steps`` and
``trainer.total_steps``, a veRL key under ``trainer.trainer_config`` and the algorithm key it
is carried to, an earlier release's name and the current one (``legacy.py``). Written twice
in one file with different values, they are an error naming both. But a command-line
override is the most recent statement of intent (DESIGN decision 20): when it sets one key of
such a pair and the file the other, ``prefer_command_line`` removes the file's key before the
overrides apply, with one line saying which value won.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, List, Sequence, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf

from trinity.common.config.legacy import RENAMED
from trinity.common.config.legacy_read import expand
from trinity.common.config.schema_algorithm import OptimizerConfig
from trinity.common.config.verl_mapping import (
    ACTOR_LOSS_KEYS,
    ACTOR_TO_TRAINER,
    VERL_ALGORITHM_KEYS,
)

logger = logging.getLogger("trinity.config")

_ACTOR = "trainer.trainer_config.actor_rollout_ref.actor"
_VERL_ALGORITHM = "trainer.trainer_config.algorithm"
_TASKSETS = "buffer.explorer_input.tasksets"


def _pairs() -> List[Tuple[str, str]]:
    """Every pair of keys (patterns; ``*`` is any list item or mapping entry) that set one
    setting, from the tables that define them."""
    pairs = [
        ("buffer.total_steps", "trainer.total_steps"),
        ("model.external_model.enable", "explorer.rollout_model.engine_type"),
        (f"{_ACTOR}.use_kl_loss", "algorithm.kl_loss_fn"),
        (f"{_ACTOR}.kl_loss_type", "algorithm.kl_loss_fn"),
        (f"{_ACTOR}.loss_agg_mode", "algorithm.loss_agg_mode"),
        (f"{_VERL_ALGORITHM}.use_kl_in_reward", "algorithm.kl_penalty_fn"),
        (f"{_VERL_ALGORITHM}.kl_penalty", "algorithm.kl_penalty_fn"),
        (f"{_VERL_ALGORITHM}.rollout_correction.*", "algorithm.rollout_correction.*"),
    ]
    pairs += [(f"{_ACTOR}.{src}", f"trainer.{dst}") for src, dst in ACTOR_TO_TRAINER.items()]
    pairs += [
        (f"{_ACTOR}.optim.{key}", f"algorithm.optimizer.{key}")
        for key in OptimizerConfig.model_fields
    ]
    for prefix, table in ((_ACTOR, ACTOR_LOSS_KEYS), (_VERL_ALGORITHM, VERL_ALGORITHM_KEYS)):
        for key, targets in table.items():
            pairs += [(f"{prefix}.{key}", f"algorithm.{part}_args.{arg}") for part, arg in targets]
    for old, renamed in RENAMED.items():
        pairs += list(zip(expand(old), expand(renamed.new), strict=True))
    return pairs


PAIRS: List[Tuple[str, str]] = _pairs()

# Two spellings of one section: an override written in one form reaches a file written in
# the other (`buffer.explorer_input.taskset.path=x` and a file with `tasksets:`).
SPELLINGS: List[Tuple[str, str]] = [
    ("buffer.explorer_input.taskset", f"{_TASKSETS}.0"),
    *zip(expand("<storage>.data_selector"), expand("<storage>.task_selector"), strict=True),
]


def prefer_command_line(
    raw: DictConfig, overrides: Sequence[Tuple[str, Any]]
) -> List[Tuple[str, Any]]:
    """Drop from ``raw`` (the file) every key that sets the same setting as an override;
    returns the overrides with each key in the spelling the file uses. Logs one line per
    dropped key whose value differs from the override's."""
    keys = [key for key, _ in overrides]
    respelled = [(_respell(raw, key), value) for key, value in overrides]
    for key, value in respelled:
        for scope in _scopes(raw, key, [k for k, _ in respelled]):
            for partner in _partners(_local(key)):
                _drop_partner(raw, scope, partner, key, value, [_local(k) for k in keys])
    return respelled


def _respell(raw: DictConfig, key: str) -> str:
    """``key`` written as the file writes that section, when the file uses the other form."""
    local = _local(key)
    scope = key[: len(key) - len(local)]  # "stages.N." or ""
    for one, other in SPELLINGS:
        for a, b in ((one, other), (other, one)):
            inside = local == a or local.startswith(a + ".")
            if inside and _has(raw, scope + b) and not _has(raw, scope + a):
                return scope + b + local[len(a) :]
    return key


def _local(key: str) -> str:
    """``stages.N.a.b`` -> ``a.b``; a global key as it is."""
    parts = key.split(".")
    return ".".join(parts[2:]) if parts[0] == "stages" and len(parts) > 2 else key


def _scopes(raw: DictConfig, key: str, keys: List[str]) -> Iterator[str]:
    """Where an override of ``key`` applies: its stage, or the top and every stage that does
    not set the key on the command line too."""
    parts = key.split(".")
    if parts[0] == "stages":
        yield ".".join(parts[:2])
        return
    yield ""
    stages = raw.get("stages")
    if isinstance(stages, ListConfig):
        for index in range(len(stages)):
            if f"stages.{index}.{key}" not in keys:
                yield f"stages.{index}"


def _partners(key: str) -> Iterator[str]:
    """The keys that set the same setting as ``key``."""
    for a, b in PAIRS:
        for this, other in ((a, b), (b, a)):
            bound = _match(this, key)
            if bound is not None:
                values = iter(bound)
                yield ".".join(next(values) if p == "*" else p for p in other.split("."))


def _match(pattern: str, key: str) -> Any:
    parts, pat = key.split("."), pattern.split(".")
    if len(parts) != len(pat):
        return None
    bound = []
    for part, want in zip(parts, pat, strict=True):
        if want == "*":
            bound.append(part)
        elif want != part:
            return None
    return bound


def _drop_partner(
    raw: DictConfig, scope: str, partner: str, key: str, value: Any, overridden: List[str]
) -> None:
    if partner in overridden:  # both set on the command line: validation reports a clash
        return
    path = f"{scope}.{partner}" if scope else partner
    if not _has(raw, path):
        return
    parent_path, _, leaf = path.rpartition(".")
    parent = OmegaConf.select(raw, parent_path) if parent_path else raw
    written = OmegaConf.select(raw, path, throw_on_resolution_failure=False)
    if isinstance(written, (DictConfig, ListConfig)):
        written = OmegaConf.to_container(written)
    if isinstance(parent, ListConfig):
        del parent[int(leaf)]
    else:
        del parent[leaf]
    if written != value:
        shown = f"{scope}.{key}" if scope and not key.startswith("stages.") else key
        logger.warning(
            "%s=%s (command line) is used, not %s: %s from the file: the two keys set one setting",
            shown,
            _show(value),
            path,
            _show(written),
        )


def _has(raw: DictConfig, path: str) -> bool:
    missing = object()
    found = OmegaConf.select(raw, path, default=missing, throw_on_resolution_failure=False)
    return found is not missing


def _show(value: Any) -> str:
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)
