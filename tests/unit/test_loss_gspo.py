"""GSPO: sequence-level ratio, token-form gradient, clipping, worked by hand."""

import pytest
import torch

import trinity.algorithm.policy_loss_fn.gspo  # noqa: F401  (registers "gspo")
from trinity.algorithm import POLICY_LOSS_FN

# old_logprob = 0 so log-ratios = logprob. Clip to [0.8, 1.2] in these tests.
# Row 0: A = +1, log-ratios [0.6, 0.0, 0.3], all valid: mean 0.3, s0 = e^0.3 = 1.35 > 1.2.
#   per token max(-1.35, -1.2) = -1.2 (clipped) on all 3 tokens.
# Row 1: A = -2, log-ratios [0.1, -0.1, 5.0], last token padding (its 5.0 must not count):
#   mean 0, s1 = 1: per token max(2.0, 2.0) = 2.0, unclipped.
LOGPROB = torch.tensor([[0.6, 0.0, 0.3], [0.1, -0.1, 5.0]])
OLD = torch.zeros(2, 3)
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
EXPECTED = {
    "seq-mean-token-mean": 0.4,  # (-1.2 + 2.0) / 2 rows
    "token-mean": 0.08,  # (3 * -1.2 + 2 * 2.0) / 5 tokens
}


def gspo(**kwargs):
    return POLICY_LOSS_FN.get("gspo")(**kwargs)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_gspo_sequence_ratio_and_clipping(mode):
    fn = gspo(clip_range_low=0.2, clip_range_high=0.2, loss_agg_mode=mode)
    loss, metrics = fn(logprob=LOGPROB, old_logprob=OLD, action_mask=MASK, advantages=ADV)
    assert loss.item() == pytest.approx(EXPECTED[mode], abs=1e-6)
    assert metrics["pg_loss"] == pytest.approx(EXPECTED[mode], abs=1e-6)
    assert metrics["pg_clipfrac"] == pytest.approx(3 / 5)  # all of row 0
    # token-level ppo_kl = mean(old - logprob) = -(0.6 + 0 + 0.3 + 0.1 - 0.1) / 5
    assert metrics["ppo_kl"] == pytest.approx(-0.18, abs=1e-6)


def test_gspo_token_form_gradient():
    logprob = LOGPROB.clone().requires_grad_()
    fn = gspo(clip_range_low=0.2, clip_range_high=0.2)
    loss, _ = fn(logprob=logprob, old_logprob=OLD, action_mask=MASK, advantages=ADV)
    loss.backward()
    # Row 0 is clipped: no gradient. Row 1: d(-A * s1 * exp(lp - sg(lp))) = -A * s1 = 2 on each
    # valid token (not -A * exp(0.1) as PPO's token ratio would give), times the
    # seq-mean-token-mean weight 1/2 rows * 1/2 tokens.
    expected = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    assert torch.allclose(logprob.grad, expected, atol=1e-6)


def test_gspo_defaults():
    cls = POLICY_LOSS_FN.get("gspo")
    assert cls.default_args() == {
        "clip_range_low": 3e-4,
        "clip_range_high": 4e-4,
        "loss_agg_mode": "seq-mean-token-mean",
    }
    assert cls.select_keys == POLICY_LOSS_FN.get("ppo").select_keys  # rollout_is_weights too
    # With the paper's tiny clip range, row 0 (s0 = 1.35) is clipped at 1.0004:
    # loss = (-1.0004 + 2.0) / 2.
    loss, _ = cls()(logprob=LOGPROB, old_logprob=OLD, action_mask=MASK, advantages=ADV)
    assert loss.item() == pytest.approx((-1.0004 + 2.0) / 2, abs=1e-6)
