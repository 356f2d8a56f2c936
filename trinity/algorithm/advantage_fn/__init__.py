"""Advantage functions (``algorithm.advantage_fn``).

To add one: subclass ``AdvantageFn`` in a new file of this package, implement
``__call__(exps, **kwargs) -> (exps, metrics)`` setting ``exps.advantages`` and
``exps.returns``, give ``default_args()``, decorate the class with
``@ADVANTAGE_FN.register_module("name")`` and import the file below. A class defined
elsewhere (a plugin) registers the same way, or is named by its dotted path.
"""

from trinity.algorithm.advantage_fn.base import ADVANTAGE_FN, AdvantageFn
from trinity.algorithm.advantage_fn.grpo import GRPOAdvantageFn

__all__ = ["ADVANTAGE_FN", "AdvantageFn", "GRPOAdvantageFn"]
