"""Checks of the synchronisation keys that need the whole config: ``synchronizer.sync_style``,
``explorer.over_rollout`` and ``explorer.dynamic_timeout`` (design-notes, "Dynamic sync")."""

from __future__ import annotations

from typing import Any, List

# ``synchronizer.sync_style`` values where neither side waits for a particular version.
DYNAMIC_STYLES = ("explorer_driven", "trainer_driven")


def sync_problems(config: Any) -> List[str]:
    """One line per impossible or unsupported combination of the synchronisation keys."""
    sync, explorer, problems = config.synchronizer, config.explorer, []
    style = sync.sync_style
    if style in DYNAMIC_STYLES and config.mode not in ("both", "colocate"):
        problems.append(
            f"synchronizer.sync_style = {style} needs mode both (a trainer and an explorer in "
            f"one run); mode {config.mode} uses fixed (mode explore always loads the newest "
            "checkpoint on disk)"
        )
    if style == "explorer_driven" and config.trainer.cpu_ranks > 1:
        problems.append(
            f"synchronizer.sync_style = explorer_driven with trainer.cpu_ranks = "
            f"{config.trainer.cpu_ranks} is not supported yet (every rank would have to learn "
            "of each request to publish); use trainer_driven or trainer.cpu_ranks: 1"
        )
    over = explorer.over_rollout
    if not 0.0 <= over.ratio < 1.0:
        problems.append(
            f"explorer.over_rollout.ratio = {over.ratio} must be in [0, 1) (the fraction of a "
            "step's tasks not waited for)"
        )
    elif over.ratio > 0 and style not in DYNAMIC_STYLES:
        problems.append(
            f"explorer.over_rollout.ratio = {over.ratio} applies only with a dynamic "
            f"synchronizer.sync_style (explorer_driven or trainer_driven), not {style}"
        )
    if over.wait_after_min < 0:
        problems.append(
            f"explorer.over_rollout.wait_after_min = {over.wait_after_min} must be >= 0"
        )
    if explorer.dynamic_timeout.ratio <= 0:
        problems.append(
            f"explorer.dynamic_timeout.ratio = {explorer.dynamic_timeout.ratio} must be > 0"
        )
    return problems
