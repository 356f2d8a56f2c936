"""KL functions (``algorithm.kl_loss_fn`` and ``algorithm.kl_penalty_fn``).

To add an estimator: subclass ``KLFn``, implement ``calculate_kl(logprob, ref_logprob)``
returning the ``(B, R)`` per-token estimate (the loss and reward-penalty methods build on
it), decorate it with ``@KL_FN.register_module("name")`` and import the file below. A plugin
(a ``--plugin-dir`` file) registers the same way; see docs/extending.md.
"""

from trinity.algorithm.kl_fn.base import KL_FN, KLFn
from trinity.algorithm.kl_fn.controller import (
    AdaptiveKLController,
    FixedKLController,
    build_kl_controller,
)
from trinity.algorithm.kl_fn.estimators import AbsFn, K1Fn, K2Fn, K3Fn, NoKLFn

__all__ = [
    "KL_FN",
    "KLFn",
    "K1Fn",
    "K2Fn",
    "K3Fn",
    "AbsFn",
    "NoKLFn",
    "AdaptiveKLController",
    "FixedKLController",
    "build_kl_controller",
]
