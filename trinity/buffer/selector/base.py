"""What every task selector is: the two kinds, their registry, and how one is built.

A ``TaskSelector`` walks one permutation of the rows per epoch (``order``); a
``BatchSelector`` picks each batch afresh (``pick``). Both may read numeric columns of the
rows (``task_selector.feature_keys``, handed over once by ``bind``), may learn from the
explorer's per-task rewards (``feedback``), and keep what they learned in ``state_dict``,
which is saved after every explore step so a resumed run goes on with it
(``buffer/selector_state.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Dict, List, Optional, Sequence

from trinity.common.registry import Registry

TASK_SELECTORS: Registry = Registry("task_selectors", base=lambda: Selector)


class Selector:
    """Base of both kinds: a seed, the feature columns read, feedback and saved state.

    Constructed as ``cls(seed=..., feature_keys=[...], **task_selector.kwargs)``.
    """

    # The row check every ``feature_keys`` column gets at load (``row_checks.CHECKS``).
    feature_kind: ClassVar[str] = "number"
    # Whether feedback changes what it picks: a resume is then exact only from saved state.
    learns: ClassVar[bool] = False

    def __init__(self, seed: int = 42, feature_keys: Sequence[str] = ()) -> None:
        self.seed = seed
        self.feature_keys = list(feature_keys)

    def bind(self, num_rows: int, features: Dict[str, List[float]]) -> None:
        """Called once before the first batch: the row count and, per feature key, the
        column's values row by row (already checked to be numbers). Default: nothing."""

    def feedback(
        self, indices: List[int], values: List[float], counts: Optional[List[int]] = None
    ) -> None:
        """Rows just explored, each with its mean reward over ``counts`` rollouts (the
        explorer calls this after every step). Default: ignored (a fixed order)."""

    def state_dict(self) -> Dict[str, Any]:
        """What the selector learned, as JSON-able values (saved after every explore step).
        ``pick`` and ``order`` must not change it: a resume replays them to find its place."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore ``state_dict()``."""


class TaskSelector(Selector, ABC):
    """Visits the rows in one permutation per epoch."""

    @abstractmethod
    def order(self, num_rows: int, epoch: int) -> List[int]:
        """A permutation of ``range(num_rows)``; must depend only on (seed, epoch) and the
        selector's state, so a resumed run rebuilds the order."""


class BatchSelector(Selector, ABC):
    """Picks each batch afresh instead of walking a permutation (an epoch is then just
    ``num_rows`` rows handed out, and a row may come up twice in one)."""

    @abstractmethod
    def pick(self, num_rows: int, n: int, drawn: int) -> List[int]:
        """``n`` distinct row indices (``n <= num_rows``). ``drawn`` counts the rows handed
        out before; seeding the draw with it lets a resumed run draw the same rows."""


def selector_class(task_selector: Any) -> type:
    """The registered class ``task_selector.selector_type`` names (``ValueError`` if none)."""
    name = task_selector.selector_type
    try:
        return TASK_SELECTORS.get(name)
    except KeyError as exc:
        raise ValueError(f"task_selector.selector_type = {name!r}: {exc.args[0]}") from None


def build_selector(task_selector: Any) -> Selector:
    """The selector a storage's ``task_selector`` config (or None) asks for, unbound."""
    if task_selector is None:
        return TASK_SELECTORS.get("sequential")()
    cls = selector_class(task_selector)
    seed = task_selector.seed if task_selector.seed is not None else 42
    keys = list(getattr(task_selector, "feature_keys", None) or [])
    return cls(seed=seed, feature_keys=keys, **dict(getattr(task_selector, "kwargs", None) or {}))


def feature_schema(task_selector: Any) -> Dict[str, str]:
    """Column -> row check of each ``feature_keys`` column, for a reader's row schema."""
    keys = list(getattr(task_selector, "feature_keys", None) or [])
    if not keys:
        return {}
    try:
        kind = selector_class(task_selector).feature_kind
    except ValueError:  # an unknown selector is reported on its own; check plain numbers
        kind = "number"
    return {key: kind for key in keys}
