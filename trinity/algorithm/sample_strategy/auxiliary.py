"""Helpers for strategies that read from auxiliary buffers (SFT/expert data) besides the main one.

The trainer builds one reader per ``buffer.trainer_input.auxiliary_buffers.<name>`` and passes
them as ``auxiliary_readers={name: reader}``. File readers keep a position, so a strategy that
owns them saves and restores it with its own state.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from trinity.algorithm.sample_strategy.base import ExperienceReader
from trinity.algorithm.sample_strategy.default import batch_metrics
from trinity.common.experience import Experience


def auxiliary_reader(
    readers: Optional[Mapping[str, ExperienceReader]], name: str, strategy: str
) -> ExperienceReader:
    """The auxiliary reader called ``name``; a clear error when the config lacks it."""
    if not readers or name not in readers:
        configured = ", ".join(sorted(readers or {})) or "(none)"
        raise ValueError(
            f"sample_strategy '{strategy}' reads the auxiliary buffer '{name}', which is not "
            f"configured: add buffer.trainer_input.auxiliary_buffers.{name} (configured: "
            f"{configured})"
        )
    return readers[name]


def reader_states(readers: Mapping[str, Any]) -> Dict[str, Any]:
    """``{name: reader.state_dict()}`` for each reader that has a position to save."""
    return {
        name: reader.state_dict()
        for name, reader in readers.items()
        if callable(getattr(reader, "state_dict", None))
    }


def load_reader_states(readers: Mapping[str, Any], states: Mapping[str, Any]) -> None:
    """Restore what ``reader_states`` saved; a saved reader that is gone is an error."""
    for name, state in states.items():
        reader = readers.get(name)
        if reader is None or not callable(getattr(reader, "load_state_dict", None)):
            raise ValueError(
                f"the checkpoint holds the position of auxiliary reader '{name}', which this "
                "run does not have: was it saved with another sample_strategy config?"
            )
        reader.load_state_dict(state)


def mark_expert(exps: List[Experience]) -> List[Experience]:
    """Set ``info["is_expert"] = True``: what mixed losses use to tell SFT rows from RL rows.

    An expert row answers no sampled group, so one without a group id gets its own group
    (a group of one, hence a zero group-relative advantage).
    """
    for exp in exps:
        exp.info["is_expert"] = True
        exp.group_id = exp.group_id or f"expert-{exp.eid}"
    return exps


def count_metrics(exps: List[Experience], num_expert: int) -> Dict[str, float]:
    """Experience counts plus model-version stats of the RL rows only: expert data was not
    produced by any policy version, so its ``model_version`` (0) would skew the staleness."""
    rl = [e for e in exps if not e.info.get("is_expert", False)]
    metrics = batch_metrics(rl)
    metrics["sample/experience_count"] = float(len(exps))
    metrics["sample/expert_count"] = float(num_expert)
    return metrics
