"""``reward_shaping_mapper``: combines each experience's reward with statistics it carries."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

from trinity.buffer.operators.base import OPERATORS, Metrics, Operator
from trinity.common.experience import Experience

logger = logging.getLogger(__name__)

OP_TYPES = ("ADD", "SUB", "MUL", "DIV")
CONFIG_KEYS = ("stats_key", "op_type", "weight")


@OPERATORS.register_module("reward_shaping_mapper")
class RewardShapingMapper(Operator):
    """Reshapes rewards with the statistics named in ``reward_shaping_configs``, in order.

    Each entry ``{stats_key, op_type, weight}`` reads ``s = info[stats_key]`` (else
    ``metrics[stats_key]``: the reward function's components) and sets the reward to
    ``reward + weight * s`` (``ADD``), ``reward - weight * s`` (``SUB``),
    ``reward * weight * s`` (``MUL``) or ``reward / (weight * s)`` (``DIV``; left as it is
    where ``weight * s`` is 0). Experiences without a reward, or without the statistic, keep
    their reward; how many is reported (``missing_stats``). ``op_type`` defaults to ``ADD``
    and ``weight`` to 1.0. Data-Juicer's scores (the ``data_juicer`` operator) land in
    ``info``, so ``stats_key: llm_quality_score`` adds the quality score it computed.
    """

    kinds = ("experience",)

    def __init__(self, reward_shaping_configs: Optional[List[Dict[str, Any]]] = None) -> None:
        self.configs = [_checked(i, c) for i, c in enumerate(reward_shaping_configs or [])]
        if not self.configs:
            raise ValueError("reward_shaping_configs is empty: list at least one stats_key")
        self.warned = False

    def process_experiences(
        self, exps: List[Experience], whole_groups: bool
    ) -> Tuple[List[Experience], Metrics]:
        diffs, missing = [], 0
        for exp in exps:
            if exp.reward is None:
                missing += 1
                continue
            before = float(exp.reward)
            for key, op_type, weight in self.configs:
                value = exp.info.get(key, exp.metrics.get(key))
                if value is None:
                    missing += 1
                    continue
                exp.reward = _apply(float(exp.reward), op_type, weight * float(value))
            diffs.append(float(exp.reward) - before)
        if missing and not self.warned:  # once: the metric counts it every step
            self.warned = True
            names = ", ".join(key for key, _, _ in self.configs)
            logger.warning(
                "reward_shaping_mapper: %d reward(s) of this step lack a reward or a statistic "
                "(%s); they are left as they are (metric missing_stats)",
                missing,
                names,
            )
        metrics: Metrics = {"missing_stats": float(missing)}
        if diffs:
            metrics["reward_diff/mean"] = sum(diffs) / len(diffs)
            metrics["reward_diff/min"], metrics["reward_diff/max"] = min(diffs), max(diffs)
        return exps, metrics


def _apply(reward: float, op_type: str, term: float) -> float:
    if op_type == "ADD":
        return reward + term
    if op_type == "SUB":
        return reward - term
    if op_type == "MUL":
        return reward * term
    return reward / term if term != 0 else reward


def _checked(index: int, entry: Any) -> Tuple[str, str, float]:
    """(stats_key, op_type, weight) of one entry, or a ValueError naming it."""
    where = f"reward_shaping_configs[{index}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} = {entry!r}: expected a mapping with stats_key, op_type, weight")
    unknown = [k for k in entry if k not in CONFIG_KEYS]
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown key (keys: {', '.join(CONFIG_KEYS)})")
    if not isinstance(entry.get("stats_key"), str):
        raise ValueError(f"{where}.stats_key is missing: name the statistic to shape with")
    op_type = str(entry.get("op_type", "ADD")).upper()
    if op_type not in OP_TYPES:
        raise ValueError(f"{where}.op_type = {entry['op_type']}: expected {', '.join(OP_TYPES)}")
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise ValueError(f"{where}.weight = {weight!r}: expected a number")
    return entry["stats_key"], op_type, float(weight)
