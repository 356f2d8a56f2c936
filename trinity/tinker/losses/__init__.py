"""The built-in losses of the Tinker API, one file each, as pure functions of tensors.

Every loss takes the target tokens' logprobs under the model being trained (``(N,)``, or
``(N, K)`` for cross-entropy over K candidates) and the datum's other ``loss_fn_inputs``
(same shape), and returns the datum's loss as a sum over its tokens: the API's losses are
sums, never means, so gradients accumulate across ``forward_backward`` calls until an
``optim_step``. ``LOSSES`` maps the SDK's loss names to their ``LossSpec``; a name the SDK
lists but that is not here (``gspo``, ``stable_reinforce``, ``custom``) is refused by name
(``trinity/tinker/errors.py``).
"""

from __future__ import annotations

from typing import Dict

from trinity.tinker.losses.base import LossSpec
from trinity.tinker.losses.cispo import CISPO
from trinity.tinker.losses.cross_entropy import CROSS_ENTROPY
from trinity.tinker.losses.dro import DRO
from trinity.tinker.losses.importance_sampling import IMPORTANCE_SAMPLING
from trinity.tinker.losses.ppo import PPO

LOSSES: Dict[str, LossSpec] = {
    spec.name: spec for spec in (CROSS_ENTROPY, IMPORTANCE_SAMPLING, PPO, CISPO, DRO)
}

__all__ = ["LOSSES", "LossSpec"]
