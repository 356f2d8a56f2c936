"""Dr. GRPO's advantage is GRPO with ``norm_adv_by_std_in_grpo=False``.

Dr. GRPO (Liu et al., "Understanding R1-Zero-Like Training", 2025) drops two GRPO terms:
the division by the group's reward std (question-difficulty bias; here
``norm_adv_by_std_in_grpo=False``) and the ``1 / |o_i|`` length normalisation (a loss-side
change: ``loss_agg_mode: seq-mean-token-sum-norm``). Its advantage is therefore
``A_i = R_i - mean_j R_j`` on every token of response ``i``, whatever the response length.
"""

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.common.experience import Experience, ExperienceBatch


def make_batch(rewards, lengths, group="q"):
    """One group of responses with all tokens generated, ``lengths[i]`` tokens each."""
    exps = [
        Experience(tokens=[1, 2] + [3] * n, prompt_length=2, reward=r, group_id=group)
        for r, n in zip(rewards, lengths, strict=True)
    ]
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


def dr_grpo():
    return ADVANTAGE_FN.get("grpo")(norm_adv_by_std_in_grpo=False)


def test_mean_centred_and_independent_of_response_length():
    # Rewards 1, 0, 0, 0 (mean 0.25) -> A = 0.75, -0.25, -0.25, -0.25, on each of the 1, 2, 3, 4
    # tokens of the responses (no 1 / |o_i| factor), 0 on padding.
    exps, _ = dr_grpo()(make_batch([1.0, 0.0, 0.0, 0.0], [1, 2, 3, 4]))
    m = -0.25
    expected = torch.tensor(
        [[0.75, 0, 0, 0], [m, m, 0, 0], [m, m, m, 0], [m, m, m, m]], dtype=torch.float
    )
    assert torch.allclose(exps.advantages, expected)
    assert torch.equal(exps.returns, exps.advantages)


def test_no_std_normalisation_so_no_difficulty_bias():
    # Rewards 0.5, 0.5, 0.5, 0.6: mean 0.525 -> Dr. GRPO A = -0.025 (x3), 0.075.
    # GRPO divides by the unbiased std sqrt((3 * 0.025^2 + 0.075^2) / 3) = sqrt(0.0025) = 0.05,
    # inflating this near-constant group to -0.5 (x3), 1.5.
    rewards, lengths = [0.5, 0.5, 0.5, 0.6], [1, 1, 1, 1]
    dr, _ = dr_grpo()(make_batch(rewards, lengths))
    assert torch.allclose(dr.advantages.squeeze(-1), torch.tensor([-0.025] * 3 + [0.075]))
    grpo, _ = ADVANTAGE_FN.get("grpo")()(make_batch(rewards, lengths))
    assert grpo.advantages.squeeze(-1).tolist() == pytest.approx([-0.5] * 3 + [1.5], abs=1e-4)
    # Scaling every reward by 10 scales Dr. GRPO's advantages by 10 (GRPO's would not move).
    dr10, _ = dr_grpo()(make_batch([10 * r for r in rewards], lengths))
    assert torch.allclose(dr10.advantages, 10 * dr.advantages, atol=1e-5)


def test_single_response_group_gets_zero():
    # A group of one: R - mean(R) = 0.
    exps, _ = dr_grpo()(make_batch([3.0], [2]))
    assert torch.equal(exps.advantages, torch.zeros(1, 2))
