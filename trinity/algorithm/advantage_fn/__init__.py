"""Advantage functions (``algorithm.advantage_fn``).

To add one: subclass ``AdvantageFn`` in a new file of this package, implement
``__call__(exps, **kwargs) -> (exps, metrics)`` setting ``exps.advantages`` and
``exps.returns``, give ``default_args()``, set ``needs_groups = True`` if it compares the
rollouts of one task, ``needs_turn_states = True`` if it reads ``Experience.turn_states`` and
``needs_policy_scores = True`` if it reads the current policy's per-token logprobs and
entropies (``exps.extra[POLICY_LOGPROB_KEY]``, ``[POLICY_ENTROPY_KEY]``, ``base.py``; the
trainer computes them only then); to leave tokens out of the actor's loss alone, set
``exps.extra[ACTOR_MASK_KEY]`` (``clipb.py``). Decorate the class with
``@ADVANTAGE_FN.register_module("name")`` and import the file below.
``exps`` also reads as veRL's ``DataProto`` (``exps.batch[...]``,
``exps.non_tensor_batch["uid"]``). A plugin (a ``--plugin-dir`` file) registers the same way;
see docs/extending.md.
"""

from trinity.algorithm.advantage_fn.asymre import AsymREAdvantageFn
from trinity.algorithm.advantage_fn.base import ADVANTAGE_FN, AdvantageFn
from trinity.algorithm.advantage_fn.clipb import ClipBAdvantageFn
from trinity.algorithm.advantage_fn.gigpo import GiGPOAdvantageFn
from trinity.algorithm.advantage_fn.grpo import GRPOAdvantageFn
from trinity.algorithm.advantage_fn.jsd import JSDAdvantageFn
from trinity.algorithm.advantage_fn.on_policy_distill import OnPolicyDistillAdvantageFn
from trinity.algorithm.advantage_fn.opmd import OPMDAdvantageFn
from trinity.algorithm.advantage_fn.ppo import PPOAdvantageFn
from trinity.algorithm.advantage_fn.rec import RECAdvantageFn
from trinity.algorithm.advantage_fn.reinforce_plus_plus import REINFORCEPlusPlusAdvantageFn
from trinity.algorithm.advantage_fn.reinforce_plus_plus_baseline import (
    REINFORCEPlusPlusBaselineAdvantageFn,
)
from trinity.algorithm.advantage_fn.remax import REMAXAdvantageFn
from trinity.algorithm.advantage_fn.rloo import RLOOAdvantageFn

__all__ = [
    "ADVANTAGE_FN",
    "AdvantageFn",
    "AsymREAdvantageFn",
    "ClipBAdvantageFn",
    "GiGPOAdvantageFn",
    "GRPOAdvantageFn",
    "JSDAdvantageFn",
    "OnPolicyDistillAdvantageFn",
    "OPMDAdvantageFn",
    "PPOAdvantageFn",
    "RECAdvantageFn",
    "REINFORCEPlusPlusAdvantageFn",
    "REINFORCEPlusPlusBaselineAdvantageFn",
    "REMAXAdvantageFn",
    "RLOOAdvantageFn",
]
