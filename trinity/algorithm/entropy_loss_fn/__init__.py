"""Entropy loss functions (``algorithm.entropy_loss_fn``).

To add one: subclass ``EntropyLossFn``, implement
``__call__(entropy, action_mask, loss_agg_mode, **kwargs) -> (loss, metrics)`` (keep
``**kwargs``: the trainer also passes ``expert_mask``), give ``default_args()``, decorate it
with ``@ENTROPY_LOSS_FN.register_module("name")`` and import the file below. A plugin (a
``--plugin-dir`` file) registers the same way; see docs/extending.md.
"""

from trinity.algorithm.entropy_loss_fn.base import ENTROPY_LOSS_FN, EntropyLossFn
from trinity.algorithm.entropy_loss_fn.default import DefaultEntropyLossFn, NoEntropyLossFn
from trinity.algorithm.entropy_loss_fn.mix import MixEntropyLossFn

__all__ = [
    "ENTROPY_LOSS_FN",
    "EntropyLossFn",
    "DefaultEntropyLossFn",
    "MixEntropyLossFn",
    "NoEntropyLossFn",
]
