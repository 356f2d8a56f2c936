"""OPMD advantages (mean and logavgexp baselines), worked by hand."""

import math

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.common.experience import Experience, ExperienceBatch


@pytest.fixture(scope="module")
def opmd_cls():
    """The "opmd" advantage class. If the package did not already register it, the
    registration is undone after this module, so a later test that registers the developer
    guide's own "opmd" (tests/unit/test_algorithm_types.py) finds the name free."""
    registered_before = "opmd" in ADVANTAGE_FN
    from trinity.algorithm.advantage_fn.opmd import OPMDAdvantageFn

    ADVANTAGE_FN.register_module("opmd", OPMDAdvantageFn)  # no-op when the import did it
    yield OPMDAdvantageFn
    if not registered_before:
        ADVANTAGE_FN._modules.pop("opmd", None)


def make_batch(rewards, group_ids, masks):
    """One row per reward: a 2-token prompt and a response as long as its mask."""
    exps = [
        Experience(
            tokens=[1, 2] + [3] * len(m), prompt_length=2, reward=r, action_mask=m, group_id=g
        )
        for r, g, m in zip(rewards, group_ids, masks, strict=True)
    ]
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


def test_mean_baseline_with_padding_and_a_single_row(opmd_cls):
    # Group a = rows 0, 2, 3: rewards 1, 2, 3, mean 2 -> -1, 0, 1.
    # Group b = row 1 alone: its own mean is its reward -> 0.
    # Row 0 has an environment token (mask 0) in the middle; rows 1 and 3 are padded.
    batch = make_batch([1.0, 5.0, 2.0, 3.0], ["a", "b", "a", "a"], [[1, 0, 1], [1], [1, 1, 1], [1]])
    exps, metrics = ADVANTAGE_FN.get("opmd")(**opmd_cls.default_args())(batch)
    expected = torch.tensor([[-1.0, 0.0, -1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0, 0]])
    assert torch.allclose(exps.advantages, expected)
    assert torch.equal(exps.returns, exps.advantages)
    # 7 valid tokens summing to -2 + 0 + 0 + 1 = -1.
    assert metrics["critic/advantages/mean"] == pytest.approx(-1 / 7)


def test_logavgexp_baseline_two_temperatures(opmd_cls):
    # Rewards 0 and ln 3 in one group.
    # tau = 1:   mean(exp(r)) = (1 + 3) / 2 = 2 -> baseline ln 2 -> A = -ln 2, ln 3 - ln 2
    # tau = 0.5: mean(exp(2 r)) = (1 + 9) / 2 = 5 -> baseline 0.5 ln 5
    #            -> A = -0.5 ln 5, ln 3 - 0.5 ln 5
    rewards = [0.0, math.log(3.0)]
    for tau, base in ((1.0, math.log(2.0)), (0.5, 0.5 * math.log(5.0))):
        batch = make_batch(rewards, ["g", "g"], [[1, 1], [1]])
        exps, _ = opmd_cls(opmd_baseline="logavgexp", tau=tau)(batch)
        a0, a1 = -base, math.log(3.0) - base
        assert torch.allclose(exps.advantages, torch.tensor([[a0, a0], [a1, 0.0]]), atol=1e-6)


def test_logavgexp_is_stable_for_large_rewards_and_zero_for_single_rows(opmd_cls):
    # exp(1000) overflows float32; the shifted form gives baseline 1000 exactly -> A = 0, 0.
    # Group h has one row: baseline = tau * log(exp(s / tau)) = s -> A = 0.
    batch = make_batch([1000.0, 1000.0, 4.0], ["g", "g", "h"], [[1], [1], [1]])
    exps, _ = opmd_cls(opmd_baseline="logavgexp", tau=0.1)(batch)
    assert torch.allclose(exps.advantages, torch.zeros(3, 1), atol=1e-4)


def test_rejects_bad_arguments_and_missing_group_ids(opmd_cls):
    with pytest.raises(ValueError, match="opmd_baseline"):
        opmd_cls(opmd_baseline="median")
    with pytest.raises(ValueError, match="tau"):
        opmd_cls(tau=0.0)
    with pytest.raises(ValueError, match="group_id"):
        opmd_cls()(make_batch([1.0, 0.0], ["", ""], [[1], [1]]))


def test_defaults_match_the_developer_guide(opmd_cls):
    assert opmd_cls.default_args() == {"opmd_baseline": "mean", "tau": 1.0}
    fn = opmd_cls(**opmd_cls.default_args())
    assert (fn.opmd_baseline, fn.tau) == ("mean", 1.0)
