"""``diff_based`` (also ``difficulty_based``): batches of the tasks whose estimated success
rate is nearest a target, estimated from the rewards the explorer feeds back.

Each row keeps discounted counts of successes ``s`` and failures ``f``. The explorer's
feedback for a row (mean reward ``r``, clipped to [0, 1], over ``c`` rollouts) updates them as

    s <- (1 - lamb) * s + c * r        f <- (1 - lamb) * f + c * (1 - r)

so older evidence fades (``lamb``), and the row's success rate is estimated as the mean of
Beta(1 + s, 1 + f): ``p = (1 + s) / (2 + s + f)`` (a draw from it with ``do_sample``). A row
never fed back starts from its prior: ``s = prior_rollouts * q`` and ``f = prior_rollouts *
(1 - q)`` for the success rate ``q`` in its ``feature_keys`` column (for example a prior run's
accuracy), else ``s = f = 0`` (p = 0.5). Each batch takes the rows of highest score
``-|target_reward - p|``: the best ones with ``tau = 0``, else a draw without replacement
with probabilities ``softmax(score / tau)``.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Any, Dict, List, Optional, Sequence, Tuple

from trinity.buffer.selector.base import TASK_SELECTORS, BatchSelector


@TASK_SELECTORS.register_module("difficulty_based")
@TASK_SELECTORS.register_module("diff_based")
class DiffBasedSelector(BatchSelector):
    """Adaptive: tasks nearest ``target_reward`` first (module docstring for the estimate)."""

    feature_kind = "rate"  # a prior success rate per row, in [0, 1]
    learns = True

    def __init__(
        self,
        seed: int = 42,
        feature_keys: Sequence[str] = (),
        target_reward: float = 0.5,
        tau: float = 0.1,
        do_sample: bool = False,
        lamb: float = 0.2,
        prior_rollouts: float = 8.0,
    ) -> None:
        """``target_reward``: the success rate sought (0.5 by default: GRPO learns nothing
        from a task whose rollouts all score alike, and most from an even split). ``tau``:
        softmax temperature of the draw, 0 for the best rows. ``do_sample``: score a draw
        from each row's Beta instead of its mean. ``lamb``: the share of a row's counts each
        new feedback forgets. ``prior_rollouts``: how many rollouts the prior column counts as.
        """
        super().__init__(seed, feature_keys)
        if len(self.feature_keys) > 1:
            raise ValueError(
                f"diff_based reads at most one feature key, a prior success rate per row; got "
                f"{self.feature_keys}: interpolating between two reference columns (upstream's "
                "estimator) is not supported yet"
            )
        for name, value, low, high in (
            ("target_reward", target_reward, 0.0, 1.0),
            ("tau", tau, 0.0, math.inf),
            ("lamb", lamb, 0.0, 1.0),
            ("prior_rollouts", prior_rollouts, 0.0, math.inf),
        ):
            if not low <= value <= high:
                raise ValueError(f"kwargs.{name} = {value} must be in [{low}, {high}]")
        self.target_reward, self.tau, self.do_sample = target_reward, tau, do_sample
        self.lamb, self.prior_rollouts = lamb, prior_rollouts
        self.prior: Optional[List[float]] = None
        self.counts: Dict[int, Tuple[float, float]] = {}  # row -> (s, f), rows fed back only

    def bind(self, num_rows: int, features: Dict[str, List[float]]) -> None:
        self.prior = features[self.feature_keys[0]] if self.feature_keys else None

    def successes_failures(self, index: int) -> Tuple[float, float]:
        """``(s, f)`` of row ``index``: fed back, else its prior."""
        if index in self.counts:
            return self.counts[index]
        if self.prior is None:
            return 0.0, 0.0
        q = self.prior[index]
        return self.prior_rollouts * q, self.prior_rollouts * (1.0 - q)

    def estimate(self, index: int, rng: Optional[random.Random] = None) -> float:
        """Row ``index``'s success rate: the Beta mean, or a draw with ``rng``."""
        s, f = self.successes_failures(index)
        if rng is not None:
            return rng.betavariate(1.0 + s, 1.0 + f)
        return (1.0 + s) / (2.0 + s + f)

    def feedback(
        self, indices: List[int], values: List[float], counts: Optional[List[int]] = None
    ) -> None:
        keep = 1.0 - self.lamb
        for k, (index, value) in enumerate(zip(indices, values, strict=True)):
            rollouts = 1 if counts is None else counts[k]
            r = min(1.0, max(0.0, float(value)))
            s, f = self.successes_failures(index)
            self.counts[index] = (keep * s + rollouts * r, keep * f + rollouts * (1.0 - r))

    def pick(self, num_rows: int, n: int, drawn: int) -> List[int]:
        rng = random.Random(self.seed + drawn)
        draw = rng if self.do_sample else None
        scores = [-abs(self.target_reward - self.estimate(i, draw)) for i in range(num_rows)]
        if self.tau > 0:  # Gumbel-top-n: n draws without replacement from softmax(score / tau)
            scores = [score / self.tau + _gumbel(rng) for score in scores]
        return heapq.nlargest(n, range(num_rows), key=lambda i: (scores[i], -i))

    def state_dict(self) -> Dict[str, Any]:
        rows = sorted(self.counts)
        return {
            "indices": rows,
            "successes": [self.counts[i][0] for i in rows],
            "failures": [self.counts[i][1] for i in rows],
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.counts = {
            int(i): (float(s), float(f))
            for i, s, f in zip(
                state.get("indices", []),
                state.get("successes", []),
                state.get("failures", []),
                strict=True,
            )
        }


def _gumbel(rng: random.Random) -> float:
    """A standard Gumbel draw; ``u`` lies strictly inside (0, 1), so both logs are finite."""
    u = (rng.getrandbits(53) + 0.5) / 2.0**53
    return -math.log(-math.log(u))
