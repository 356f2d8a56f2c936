"""Algorithms: the components the trainer composes into one RL (or SFT) update.

Each component kind has a base class and a registry; the config names components by
their registered name (``algorithm.advantage_fn: grpo``) or by a dotted class path:

| config key | registry | base class |
| --- | --- | --- |
| ``algorithm_type`` | ``ALGORITHM_TYPE`` | ``AlgorithmType`` |
| ``sample_strategy`` | ``SAMPLE_STRATEGY`` | ``SampleStrategy`` |
| ``advantage_fn`` | ``ADVANTAGE_FN`` | ``AdvantageFn`` |
| ``policy_loss_fn`` | ``POLICY_LOSS_FN`` | ``PolicyLossFn`` |
| ``kl_loss_fn`` / ``kl_penalty_fn`` | ``KL_FN`` | ``KLFn`` |
| ``entropy_loss_fn`` | ``ENTROPY_LOSS_FN`` | ``EntropyLossFn`` |

To add a component: subclass the base, register it with ``@REGISTRY.register_module("name")``
and give ``default_args()`` (its constructor defaults, which ``<key>_args`` in the config
override). A built-in is one short file in the matching subpackage, imported by its
``__init__``; a plugin is the same code in a ``--plugin-dir`` file. To add an algorithm,
register an ``AlgorithmType`` (every attribute has a default) whose ``default_config()``
names its components; a built-in one is a row of ``BUILTIN_ALGORITHMS`` in
``algorithm.py`` (its defaults and the flags it changes). Interfaces and a tested example
of each: docs/extending.md.
"""

from trinity.algorithm.advantage_fn import ADVANTAGE_FN, AdvantageFn
from trinity.algorithm.algorithm import (
    ALGORITHM_TYPE,
    AlgorithmType,
    ExperienceModel,
    advantage_fn_class,
    needs_groups,
    needs_reference,
)
from trinity.algorithm.entropy_loss_fn import ENTROPY_LOSS_FN, EntropyLossFn
from trinity.algorithm.kl_fn import KL_FN, KLFn
from trinity.algorithm.policy_loss_fn import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.sample_strategy import SAMPLE_STRATEGY, SampleStrategy

__all__ = [
    "ADVANTAGE_FN",
    "ALGORITHM_TYPE",
    "ENTROPY_LOSS_FN",
    "KL_FN",
    "POLICY_LOSS_FN",
    "SAMPLE_STRATEGY",
    "AdvantageFn",
    "AlgorithmType",
    "EntropyLossFn",
    "ExperienceModel",
    "KLFn",
    "PolicyLossFn",
    "SampleStrategy",
    "advantage_fn_class",
    "needs_groups",
    "needs_reference",
]
