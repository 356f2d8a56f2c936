"""Checks of the synchronisation keys that need the whole config: ``synchronizer.sync_style``,
``explorer.over_rollout`` and ``explorer.dynamic_timeout`` (design-notes, "Dynamic sync")."""

from __future__ import annotations

from typing import Any, List

# ``synchronizer.sync_style`` values where neither side waits for a particular version.
DYNAMIC_STYLES = ("explorer_driven", "trainer_driven", "fully_async")
# Styles whose explore steps wait for all their tasks (over_rollout cuts that wait short).
STEPPED_DYNAMIC_STYLES = ("explorer_driven", "trainer_driven")


def sync_problems(config: Any) -> List[str]:
    """One line per impossible or unsupported combination of the synchronisation keys."""
    sync, explorer, problems = config.synchronizer, config.explorer, []
    style = sync.sync_style
    # train, explore and bench reset the style to fixed (derive.py); serve keeps it
    if style in DYNAMIC_STYLES and config.mode not in ("both", "colocate"):
        problems.append(
            f"synchronizer.sync_style = {style} needs mode both (a trainer and an explorer in "
            f"one run); mode {config.mode} uses fixed"
        )
    if style == "explorer_driven" and config.trainer.cpu_ranks > 1:
        problems.append(
            f"synchronizer.sync_style = explorer_driven with trainer.cpu_ranks = "
            f"{config.trainer.cpu_ranks} is not supported yet (every rank would have to learn "
            "of each request to publish); use trainer_driven or trainer.cpu_ranks: 1"
        )
    problems += _staleness_problems(sync)
    over = explorer.over_rollout
    if not 0.0 <= over.ratio < 1.0:
        problems.append(
            f"explorer.over_rollout.ratio = {over.ratio} must be in [0, 1) (the fraction of a "
            "step's tasks not waited for)"
        )
    elif over.ratio > 0 and style not in STEPPED_DYNAMIC_STYLES:
        problems.append(
            f"explorer.over_rollout.ratio = {over.ratio} applies only with "
            f"synchronizer.sync_style explorer_driven or trainer_driven, not {style}"
            + (" (its steps never wait for their last tasks)" if style == "fully_async" else "")
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


def _staleness_problems(sync: Any) -> List[str]:
    """``synchronizer.max_staleness`` below what the schedule itself produces would drop
    data every step: the first ``sync_offset`` steps run on the starting weights (staleness
    up to ``sync_offset - 1``), and ``fixed`` reaches ``sync_interval + sync_offset - 1``.
    In the dynamic styles the explorer waits for weights within the bound, which the trainer
    publishes every ``sync_interval`` steps (but explorer_driven, where it asks for them)."""
    bound = sync.max_staleness
    if bound is None:
        return []
    if sync.sync_style == "fixed":
        floor, why = sync.sync_interval + sync.sync_offset - 1, "sync_interval + sync_offset - 1"
        if bound < floor:
            return [
                f"synchronizer.max_staleness = {bound} is below what sync_style fixed produces "
                f"with synchronizer.sync_interval = {sync.sync_interval} and "
                f"synchronizer.sync_offset = {sync.sync_offset} ({why} = {floor}): every such "
                f"step would be dropped; raise it to {floor} or leave it unset"
            ]
    elif bound < sync.sync_offset:
        return [
            f"synchronizer.max_staleness = {bound} is below synchronizer.sync_offset = "
            f"{sync.sync_offset}: the steps explored on the starting weights could never be "
            f"trained on; raise it to at least {sync.sync_offset} or lower sync_offset"
        ]
    elif sync.sync_style != "explorer_driven" and bound < sync.sync_interval - 1:
        # the explorer waits for weights within the bound (sync_schedule.staleness_floor)
        floor = sync.sync_interval - 1
        return [
            f"synchronizer.max_staleness = {bound} is below synchronizer.sync_interval - 1 = "
            f"{floor}: with sync_style {sync.sync_style} the trainer publishes every "
            "sync_interval steps, and the explorer would wait for weights the trainer can "
            f"publish only after steps not explored yet; raise it to {floor} or leave it unset"
        ]
    return []
