"""An advantage function that fails, to test what clients of a serve run see when its trainer
fails (tests/integration/test_serve.py)."""

from trinity.algorithm.advantage_fn.base import ADVANTAGE_FN
from trinity.algorithm.advantage_fn.grpo import GRPOAdvantageFn


@ADVANTAGE_FN.register_module("failing_advantage")
class FailingAdvantageFn(GRPOAdvantageFn):
    """GRPO's arguments and grouping; raises when the trainer computes advantages."""

    def __call__(self, exps, **kwargs):
        raise RuntimeError("injected trainer failure")
