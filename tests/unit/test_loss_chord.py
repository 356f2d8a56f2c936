"""CHORD: the mu schedule, the phi-weighted SFT term and the mixed loss, worked by hand."""

import math

import pytest
import torch

from tests.unit.test_loss_mix import ADV, EXPERT, LOGPROB, MASK, OLD
from trinity.algorithm import ALGORITHM_TYPE, POLICY_LOSS_FN
from trinity.algorithm.policy_loss_fn.mix_chord import mu_schedule


@pytest.mark.parametrize(
    "updates, mu",
    [
        (0, 0.0),  # warm-up starts at 0
        (2, 0.45),  # halfway up to the peak 0.9
        (4, 0.9),  # the peak: cos(0) = 1
        (6, 0.5),  # halfway down: 0.1 + 0.8 * (1 + cos(pi / 2)) / 2
        (8, 0.1),  # the valley, and it stays there
        (100, 0.1),
    ],
)
def test_mu_warms_up_then_decays_by_a_half_cosine(updates, mu):
    assert mu_schedule(updates, 4, 4, 0.9, 0.1) == pytest.approx(mu)


def test_without_warm_up_or_decay_mu_is_the_valley():
    assert [mu_schedule(n, 0, 0, 0.9, 0.1) for n in (0, 1, 50)] == [0.1, 0.1, 0.1]


def test_sft_phi_weighs_each_token_by_p_one_minus_p():
    logprob = torch.tensor([[0.5, 0.9, 0.2]]).log().requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = POLICY_LOSS_FN.get("sft_phi")()(logprob=logprob, action_mask=mask)
    # phi = 0.5 * 0.5 = 0.25 and 0.9 * 0.1 = 0.09; -phi * log p, mean of the two valid tokens
    expected = (0.25 * -math.log(0.5) + 0.09 * -math.log(0.9)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["sft_phi_loss"] == pytest.approx(expected, abs=1e-6)
    loss.backward()  # the weight is a coefficient: d/dlogprob = -phi / 2
    assert torch.allclose(logprob.grad, torch.tensor([[-0.125, -0.045, 0.0]]), atol=1e-6)


def _phi(lp: float) -> float:
    return math.exp(lp) * (1 - math.exp(lp))


# The expert row of test_loss_mix has logprobs [-1, -2] on its valid tokens.
SFT_PHI = (_phi(-1.0) * 1.0 + _phi(-2.0) * 2.0) / 2
PPO_TOKEN_MEAN = 0.32  # test_loss_mix's hand-worked PPO term of its two RL rows


def chord(step: int, **kwargs):
    fn = POLICY_LOSS_FN.get("mix_chord")(mu_decay_steps=4, mu_peak=0.9, mu_valley=0.1, **kwargs)
    return fn(
        logprob=LOGPROB,
        old_logprob=OLD,
        action_mask=MASK,
        advantages=ADV,
        expert_mask=EXPERT,
        step=torch.full((3,), float(step)),
    )


def test_chord_mixes_ppo_and_phi_sft_with_the_scheduled_mu():
    loss, metrics = chord(step=3)  # 2 updates done: mu = 0.5
    assert metrics["mu"] == pytest.approx(0.5)
    assert loss.item() == pytest.approx(0.5 * PPO_TOKEN_MEAN + 0.5 * SFT_PHI, abs=1e-6)
    assert metrics["expert/sft_phi_loss"] == pytest.approx(SFT_PHI, abs=1e-6)
    assert metrics["usual/pg_loss"] == pytest.approx(PPO_TOKEN_MEAN, abs=1e-6)
    first, first_metrics = chord(step=1)  # no update done: mu is the peak
    assert first_metrics["mu"] == pytest.approx(0.9)
    assert first.item() == pytest.approx(0.1 * PPO_TOKEN_MEAN + 0.9 * SFT_PHI, abs=1e-6)


def test_chord_without_phi_is_plain_sft_on_expert_rows():
    loss, metrics = chord(step=3, enable_phi_function=False)
    assert metrics["expert/sft_loss"] == pytest.approx(1.5)  # mean(1, 2)
    assert loss.item() == pytest.approx(0.5 * PPO_TOKEN_MEAN + 0.5 * 1.5, abs=1e-6)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"mu_valley": 1.5}, "mu_valley"),
        ({"mu_peak": -0.1}, "mu"),
        ({"mu_decay_steps": -1}, "mu_decay_steps"),
    ],
)
def test_chord_rejects_bad_schedules(bad, match):
    with pytest.raises(ValueError, match=match):
        POLICY_LOSS_FN.get("mix_chord")(**bad)


def test_mix_chord_algorithm_reads_expert_data_with_chord_phi():
    config = ALGORITHM_TYPE.get("mix_chord").default_config()
    assert (config["sample_strategy"], config["policy_loss_fn"]) == ("mix", "mix_chord")
    assert POLICY_LOSS_FN.get("mix_chord").default_args()["enable_phi_function"] is True
