"""PPO and SFT losses against hand-computed 2x3 examples; select_keys of guide-style fns."""

import math
from typing import Dict, Tuple

import pytest
import torch

from trinity.algorithm import POLICY_LOSS_FN, PolicyLossFn
from trinity.algorithm.utils import masked_mean

# old_logprob = 0, so ratio = exp(logprob). Clip range 0.2 -> ratios clipped to [0.8, 1.2].
# Row 0, A = +1, ratios [1.5, 0.7, 1.1]:
#   -A*r = [-1.5, -0.7, -1.1]; -A*clip(r) = [-1.2, -0.8, -1.1]; max = [-1.2, -0.7, -1.1]
#   clipped (second term larger): token 0 only.
# Row 1, A = -2, ratios [1.5, 0.7, 1.0], last token masked out:
#   -A*r = [3.0, 1.4, 2.0]; -A*clip(r) = [2.4, 1.6, 2.0]; max = [3.0, 1.6, 2.0]
#   clipped: token 1 only.
RATIOS = torch.tensor([[1.5, 0.7, 1.1], [1.5, 0.7, 1.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD = torch.zeros(2, 3)
# Valid per-token losses: row 0 [-1.2, -0.7, -1.1] (sum -3.0), row 1 [3.0, 1.6] (sum 4.6).
PPO_EXPECTED = {
    "token-mean": 1.6 / 5,  # (-3.0 + 4.6) / 5 tokens
    "seq-mean-token-sum": 0.8,  # (-3.0 + 4.6) / 2 rows
    "seq-mean-token-mean": 0.65,  # (-3.0/3 + 4.6/2) / 2 rows
    "seq-mean-token-sum-norm": (1.6 / 3) / 2,  # (-3.0/3 + 4.6/3) / 2 rows
}


def ppo(**kwargs):
    return POLICY_LOSS_FN.get("ppo")(**kwargs)


@pytest.mark.parametrize("mode", list(PPO_EXPECTED))
def test_ppo_clipped_surrogate_each_mode(mode):
    loss, metrics = ppo(clip_range=0.2, loss_agg_mode=mode)(
        logprob=RATIOS.log(), old_logprob=OLD, action_mask=MASK, advantages=ADV
    )
    assert loss.item() == pytest.approx(PPO_EXPECTED[mode], abs=1e-6)
    assert metrics["pg_loss"] == pytest.approx(PPO_EXPECTED[mode], abs=1e-6)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 5)  # one clipped token per row
    # ppo_kl = mean(old - logprob) over the 5 valid tokens
    logs = [math.log(r) for r in (1.5, 0.7, 1.1, 1.5, 0.7)]
    assert metrics["ppo_kl"] == pytest.approx(-sum(logs) / 5, abs=1e-6)
    assert "pg_clipfrac_lower" not in metrics


def test_ppo_gradient_flows_only_through_unclipped_tokens():
    logprob = RATIOS.log().requires_grad_()
    loss, _ = ppo()(logprob=logprob, old_logprob=OLD, action_mask=MASK, advantages=ADV)
    loss.backward()
    # token-mean over 5 tokens: d(-A r)/d logprob = -A r / 5 on unclipped valid tokens.
    expected = torch.tensor([[0.0, -0.7 / 5, -1.1 / 5], [3.0 / 5, 0.0, 0.0]])
    assert torch.allclose(logprob.grad, expected, atol=1e-6)


def test_rollout_is_weights_scale_each_token_term_not_the_normaliser():
    # weights (2, 0.5, 1) and (1, 3, -): token terms row 0 [-2.4, -0.35, -1.1] (sum -3.85),
    # row 1 [3.0, 4.8] (sum 7.8); token-mean still divides by the 5 valid tokens
    weights = torch.tensor([[2.0, 0.5, 1.0], [1.0, 3.0, 1.0]])
    logprob = RATIOS.log().requires_grad_()
    loss, metrics = ppo()(
        logprob=logprob,
        old_logprob=OLD,
        action_mask=MASK,
        advantages=ADV,
        rollout_is_weights=weights,
    )
    assert loss.item() == pytest.approx((-3.85 + 7.8) / 5, abs=1e-6)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 5)  # clipping ignores the weights
    loss.backward()  # the weights are constants: each token's gradient is scaled by its own
    plain = torch.tensor([[0.0, -0.7 / 5, -1.1 / 5], [3.0 / 5, 0.0, 0.0]])
    assert torch.allclose(logprob.grad, plain * weights, atol=1e-6)


def test_ppo_asymmetric_clip():
    # clip_range_high 0.28: row 0 token 0 is clipped at 1.28 instead of 1.2 -> -1.28.
    loss, _ = ppo(clip_range=0.2, clip_range_high=0.28)(
        logprob=RATIOS.log(), old_logprob=OLD, action_mask=MASK, advantages=ADV
    )
    assert loss.item() == pytest.approx((-1.28 - 0.7 - 1.1 + 3.0 + 1.6) / 5, abs=1e-6)


def test_ppo_dual_clip():
    # Row 1 token 0 now has ratio 4: -A*r = 8.0, -A*clip(r) = 2.4, max = 8.0; with
    # clip_ratio_c = 3 the loss of a negative-advantage token is capped at -A*3 = 6.0.
    ratios = torch.tensor([[1.5, 0.7, 1.1], [4.0, 0.7, 1.0]])
    args = dict(logprob=ratios.log(), old_logprob=OLD, action_mask=MASK, advantages=ADV)
    plain, plain_metrics = ppo()(**args)
    dual, metrics = ppo(clip_ratio_c=3.0)(**args)
    assert plain.item() == pytest.approx((-3.0 + 8.0 + 1.6) / 5, abs=1e-6)
    assert dual.item() == pytest.approx((-3.0 + 6.0 + 1.6) / 5, abs=1e-6)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 5)
    # Row 0 token 0 and row 1 token 1 are still the (ordinarily) clipped ones.
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 5)
    assert "pg_clipfrac_lower" not in plain_metrics


def test_ppo_rejects_bad_args():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo(clip_ratio_c=0.5)
    with pytest.raises(ValueError, match="token-mean"):
        ppo(loss_agg_mode="mean")


def test_sft_loss():
    # Valid tokens: row 0 -> -1, -2; row 1 -> -0.5, -1.5 (last column masked out).
    logprob = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    loss, metrics = POLICY_LOSS_FN.get("sft")()(logprob=logprob, action_mask=mask)
    assert loss.item() == pytest.approx((1 + 2 + 0.5 + 1.5) / 4)  # 1.25
    assert metrics == {"sft_loss": pytest.approx(1.25)}
    loss, _ = POLICY_LOSS_FN.get("sft")(loss_agg_mode="seq-mean-token-sum")(logprob, mask)
    assert loss.item() == pytest.approx((3.0 + 2.0) / 2)


def test_select_keys_and_defaults():
    assert POLICY_LOSS_FN.get("ppo").select_keys == (
        "logprob",
        "old_logprob",
        "action_mask",
        "advantages",
        "rollout_is_weights",  # optional: only with algorithm.rollout_correction.rollout_is
    )
    assert POLICY_LOSS_FN.get("sft").select_keys == ("logprob", "action_mask")
    assert ppo().select_keys == POLICY_LOSS_FN.get("ppo").select_keys  # on instances too
    assert POLICY_LOSS_FN.get("ppo").default_args()["clip_range"] == 0.2
    assert ppo().loss_agg_mode == "token-mean"


def test_guide_style_custom_loss_reports_its_select_keys():
    # The developer guide's OPMD policy loss: no super().__init__, (logprob, action_mask,
    # advantages, **kwargs).
    class OPMDPolicyLossFn(PolicyLossFn):
        def __init__(self, tau: float = 1.0) -> None:
            self.tau = tau

        def __call__(  # type: ignore
            self,
            logprob: torch.Tensor,
            action_mask: torch.Tensor,
            advantages: torch.Tensor,
            **kwargs,
        ) -> Tuple[torch.Tensor, Dict]:
            pg_losses = -advantages * logprob
            opmd_loss = masked_mean(pg_losses, action_mask)
            opmd_loss = opmd_loss / (1.0 + self.tau)  # for regularization (w.r.t. current pi_theta)
            return opmd_loss, {"opmd_loss": opmd_loss.detach().item()}

        @classmethod
        def default_args(cls) -> Dict:
            return {"tau": 1.0}

    fn = OPMDPolicyLossFn(**OPMDPolicyLossFn.default_args())
    assert fn.select_keys == ("logprob", "action_mask", "advantages")
    assert fn.loss_agg_mode == "token-mean"  # class-level fallback without super().__init__
    # -A * logprob = [[1, 2]] masked to [1]; mean 1; / (1 + tau) = 0.5
    loss, metrics = fn(
        logprob=torch.tensor([[-1.0, -2.0]]),
        action_mask=torch.tensor([[1.0, 0.0]]),
        advantages=torch.tensor([[1.0, 1.0]]),
    )
    assert loss.item() == pytest.approx(0.5)
    assert metrics == {"opmd_loss": pytest.approx(0.5)}
