"""Controllers of the in-reward KL coefficient (veRL's ``algorithm.kl_ctrl``).

The trainer sets ``kl_penalty_fn.kl_coef = controller.value`` before applying the penalty
and calls ``controller.update(current_kl, n_steps)`` after it, with the batch's mean token
KL (the ``actor/reward_kl_penalty`` metric) and the batch size.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

# veRL's documented defaults of ``algorithm.kl_ctrl``.
DEFAULT_HORIZON = 10000
DEFAULT_TARGET_KL = 0.1


class FixedKLController:
    """A constant coefficient; ``update`` does nothing."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep the coefficient (same interface as the adaptive controller)."""

    def state_dict(self) -> Dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: Dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Moves the coefficient towards the value at which the KL equals ``target_kl``
    (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences").

    Each update: ``error = clip(current_kl / target_kl - 1, -0.2, 0.2)`` and
    ``value *= 1 + error * n_steps / horizon``, so over ``horizon`` samples a persistent
    error changes the coefficient by at most about 20%.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0:
            raise ValueError(f"the adaptive KL controller needs target_kl > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"the adaptive KL controller needs horizon > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adjust ``value`` after ``n_steps`` samples (veRL passes the batch size)."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> Dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: Dict[str, float]) -> None:
        self.value = float(state["value"])


KLController = Union[FixedKLController, AdaptiveKLController]


def build_kl_controller(kl_ctrl: Optional[Dict[str, Any]], kl_coef: float) -> KLController:
    """The controller a veRL-style ``kl_ctrl`` dict describes.

    Args:
        kl_ctrl: ``{type: fixed | adaptive, kl_coef, horizon, target_kl}``; every key is
            optional. None or ``{}`` gives a fixed controller.
        kl_coef: the (initial) coefficient used when ``kl_ctrl`` has no ``kl_coef``
            (Trinity keeps it in ``kl_penalty_fn_args.kl_coef``).

    Raises:
        ValueError: an unknown ``type``.
    """
    cfg = dict(kl_ctrl or {})
    kind = cfg.get("type", "fixed")
    coef = cfg.get("kl_coef")
    coef = kl_coef if coef is None else coef
    if kind == "fixed":
        return FixedKLController(coef)
    if kind == "adaptive":
        return AdaptiveKLController(
            init_kl_coef=coef,
            target_kl=cfg.get("target_kl", DEFAULT_TARGET_KL),
            horizon=cfg.get("horizon", DEFAULT_HORIZON),
        )
    raise ValueError(f"unknown kl_ctrl type '{kind}'; supported: fixed, adaptive")
