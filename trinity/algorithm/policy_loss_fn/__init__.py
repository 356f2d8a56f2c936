"""Policy loss functions (``algorithm.policy_loss_fn``).

To add one: subclass ``PolicyLossFn`` in a new file of this package, write
``__call__`` with one parameter per tensor it needs (they become ``select_keys``; keep
``**kwargs``) returning ``(loss, metrics)``, give ``default_args()``, decorate it with
``@POLICY_LOSS_FN.register_module("name")`` and import the file below. A plugin (a
``--plugin-dir`` file) registers the same way; see docs/extending.md.
"""

from trinity.algorithm.policy_loss_fn.base import POLICY_LOSS_FN, PolicyLossFn, build_policy_loss
from trinity.algorithm.policy_loss_fn.cispo import CISPOPolicyLossFn
from trinity.algorithm.policy_loss_fn.dpo import DPOLossFn
from trinity.algorithm.policy_loss_fn.gspo import GSPOPolicyLossFn
from trinity.algorithm.policy_loss_fn.m2po import M2POPolicyLossFn
from trinity.algorithm.policy_loss_fn.mix import MIXPolicyLossFn
from trinity.algorithm.policy_loss_fn.mix_chord import MIXCHORDPolicyLossFn
from trinity.algorithm.policy_loss_fn.opmd import OPMDPolicyLossFn
from trinity.algorithm.policy_loss_fn.ppo import PPOPolicyLossFn
from trinity.algorithm.policy_loss_fn.rec import RECPolicyLossFn
from trinity.algorithm.policy_loss_fn.sapo import SAPOPolicyLossFn
from trinity.algorithm.policy_loss_fn.sft import SFTLossFn
from trinity.algorithm.policy_loss_fn.sft_phi import SFTPhiLossFn
from trinity.algorithm.policy_loss_fn.sppo import SPPOPolicyLossFn
from trinity.algorithm.policy_loss_fn.topr import TOPRPolicyLossFn

__all__ = [
    "POLICY_LOSS_FN",
    "build_policy_loss",
    "PolicyLossFn",
    "CISPOPolicyLossFn",
    "DPOLossFn",
    "GSPOPolicyLossFn",
    "M2POPolicyLossFn",
    "MIXCHORDPolicyLossFn",
    "MIXPolicyLossFn",
    "OPMDPolicyLossFn",
    "PPOPolicyLossFn",
    "RECPolicyLossFn",
    "SAPOPolicyLossFn",
    "SFTLossFn",
    "SFTPhiLossFn",
    "SPPOPolicyLossFn",
    "TOPRPolicyLossFn",
]
