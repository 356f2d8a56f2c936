"""A training step as Tinker API calls (trinity/trainer/tinker_mapping.py), without a service:
which loss, its config, the per-token scale, the datums, the optimizer's parameters."""

import math

import pytest
import torch

from trinity.algorithm.entropy_loss_fn.default import DefaultEntropyLossFn, NoEntropyLossFn
from trinity.algorithm.kl_fn.estimators import K2Fn, NoKLFn
from trinity.algorithm.optimizer import lr_factor_fn
from trinity.algorithm.policy_loss_fn.cispo import CISPOPolicyLossFn
from trinity.algorithm.policy_loss_fn.opmd import OPMDPolicyLossFn
from trinity.algorithm.policy_loss_fn.ppo import PPOPolicyLossFn
from trinity.algorithm.policy_loss_fn.sft import SFTLossFn
from trinity.common.config.schema_algorithm import OptimizerConfig
from trinity.common.experience import Experience, ExperienceBatch
from trinity.trainer import tinker_mapping as mapping

pytest.importorskip("tinker")


def test_grpo_defaults_go_custom_because_of_the_kl_loss():
    plan = mapping.loss_plan(PPOPolicyLossFn(), K2Fn(kl_coef=0.001), has_reference=True)
    assert plan.loss_fn is None and "KL loss" in plan.why


@pytest.mark.parametrize(
    "kl_loss, has_reference",
    [(NoKLFn(), False), (K2Fn(kl_coef=0.0), True), (K2Fn(kl_coef=0.1), False)],
)
def test_ppo_without_a_kl_term_is_the_builtin_ppo_with_its_clip_range(kl_loss, has_reference):
    plan = mapping.loss_plan(PPOPolicyLossFn(clip_range=0.2), kl_loss, has_reference)
    assert plan.loss_fn == "ppo"
    assert plan.config == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    assert plan.inputs == ("logprobs", "advantages")


def test_asymmetric_clip_maps_to_both_thresholds_and_dual_clip_goes_custom():
    dapo = PPOPolicyLossFn(clip_range_low=0.2, clip_range_high=0.28)
    plan = mapping.loss_plan(dapo, NoKLFn(), False)
    assert plan.config == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
    dual = PPOPolicyLossFn(clip_ratio_c=3.0)
    assert mapping.loss_plan(dual, NoKLFn(), False).loss_fn is None


def test_cispo_sft_and_the_rest():
    cispo = mapping.loss_plan(CISPOPolicyLossFn(), NoKLFn(), False)
    assert (cispo.loss_fn, cispo.config) == (
        "cispo",
        pytest.approx({"clip_low_threshold": 0.0, "clip_high_threshold": 1.28}),
    )
    low = mapping.loss_plan(CISPOPolicyLossFn(clip_range_low=0.5), NoKLFn(), False)
    assert low.config["clip_low_threshold"] == pytest.approx(0.5)
    sft = mapping.loss_plan(SFTLossFn(), NoKLFn(), False)
    assert (sft.loss_fn, sft.inputs) == ("cross_entropy", ("weights",))
    opmd = mapping.loss_plan(OPMDPolicyLossFn(), NoKLFn(), False)
    assert opmd.loss_fn is None and "OPMDPolicyLossFn" in opmd.why


def test_only_a_zero_entropy_term_goes_with_tinker():
    assert mapping.entropy_term_is_zero(NoEntropyLossFn())
    assert mapping.entropy_term_is_zero(DefaultEntropyLossFn(entropy_coef=0.0))
    assert not mapping.entropy_term_is_zero(DefaultEntropyLossFn(entropy_coef=0.01))


MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        # 3 tokens in the batch: each weighs 1/3
        ("token-mean", [[1 / 3, 1 / 3, 0], [1 / 3, 0, 0]]),
        # 2 rows, token sums: each token 1/2
        ("seq-mean-token-sum", [[1 / 2, 1 / 2, 0], [1 / 2, 0, 0]]),
        # row means (2 and 1 tokens) averaged over 2 rows
        ("seq-mean-token-mean", [[1 / 4, 1 / 4, 0], [1 / 2, 0, 0]]),
        # row sums over R = 3 columns, averaged over 2 rows
        ("seq-mean-token-sum-norm", [[1 / 6, 1 / 6, 0], [1 / 6, 0, 0]]),
    ],
)
def test_token_scale_by_hand(mode, expected):
    assert torch.allclose(mapping.token_scale(MASK, mode), torch.tensor(expected))


def test_importance_weights_multiply_the_scale():
    weights = torch.tensor([[2.0, 0.5, 9.0], [1.0, 9.0, 9.0]])
    scale = mapping.token_scale(MASK, "token-mean", weights)
    assert torch.allclose(scale, torch.tensor([[2 / 3, 0.5 / 3, 0.0], [1 / 3, 0.0, 0.0]]))


def _tinker_ppo(logprob, old, advantages, low, high):
    """Tinker's ppo: -sum(min(r A, clip(r, low, high) A)) over tokens."""
    ratio = torch.exp(logprob - old)
    return -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages).sum()


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_builtin_ppo_on_scaled_advantages_is_the_aggregated_loss_and_gradient(mode):
    generator = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    old = -torch.rand(3, 4, generator=generator)
    advantages = torch.randn(3, 4, generator=generator)
    weights = torch.rand(3, 4, generator=generator) + 0.5
    ours = PPOPolicyLossFn(clip_range_low=0.2, clip_range_high=0.28, loss_agg_mode=mode)
    logprob = (old + 0.4 * torch.randn(3, 4, generator=generator)).requires_grad_(True)
    expected, _ = ours(logprob, old, mask, advantages, rollout_is_weights=weights)
    (expected_grad,) = torch.autograd.grad(expected, logprob)
    plan = mapping.loss_plan(ours, NoKLFn(), False)
    scaled = advantages * mapping.token_scale(mask, mode, weights)
    got = _tinker_ppo(logprob, old, scaled, **_bounds(plan))
    (got_grad,) = torch.autograd.grad(got, logprob)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    assert torch.allclose(got_grad, expected_grad, atol=1e-7)


def _bounds(plan):
    return {"low": plan.config["clip_low_threshold"], "high": plan.config["clip_high_threshold"]}


def test_ppo_by_hand():
    """One token: r = e^0.5 = 1.6487 > 1.2 with A = 2 is clipped: loss -1.2 * 2 / 1 token."""
    logprob, old = torch.tensor([[-0.5]]), torch.tensor([[-1.0]])
    mask, advantages = torch.ones(1, 1), torch.tensor([[2.0]])
    plan = mapping.loss_plan(PPOPolicyLossFn(), NoKLFn(), False)
    scaled = advantages * mapping.token_scale(mask, "token-mean")
    assert _tinker_ppo(logprob, old, scaled, **_bounds(plan)).item() == pytest.approx(-2.4)


def _batch():
    """Two rows: prompt [5, 6] + response [7, 8, 9], and prompt [3] + response [10]."""
    rows = [
        Experience(
            tokens=torch.tensor([5, 6, 7, 8, 9]),
            prompt_length=2,
            logprobs=torch.tensor([-0.1, -0.2, -0.3]),
        ),
        Experience(tokens=torch.tensor([3, 10]), prompt_length=1, logprobs=torch.tensor([-0.4])),
    ]
    return ExperienceBatch.from_experiences(rows, pad_token_id=0)


def test_datums_shift_tokens_and_place_response_values_at_their_targets():
    batch = _batch()
    advantages = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    first, second = mapping.datums(batch, {"advantages": advantages, "logprobs": batch.old_logprob})
    assert first.model_input.to_ints() == [5, 6, 7, 8]
    assert first.loss_fn_inputs["target_tokens"].tolist() == [6, 7, 8, 9]
    # target 0 (token 6) is prompt: no advantage; tokens 7, 8, 9 are the response
    assert first.loss_fn_inputs["advantages"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert first.loss_fn_inputs["logprobs"].tolist() == pytest.approx([0.0, -0.1, -0.2, -0.3])
    assert second.model_input.to_ints() == [3]
    assert second.loss_fn_inputs["target_tokens"].tolist() == [10]
    assert second.loss_fn_inputs["advantages"].tolist() == [4.0]
    assert second.loss_fn_inputs["logprobs"].tolist() == pytest.approx([-0.4])
    assert first.loss_fn_inputs["target_tokens"].dtype == "int64"


def test_response_columns_reverse_the_placement_and_keep_gradients():
    batch = _batch()
    per_datum = [
        torch.tensor([-9.0, -1.0, -2.0, -3.0], requires_grad=True),
        torch.tensor([-4.0], requires_grad=True),
    ]
    columns = mapping.response_columns(per_datum, batch)
    assert columns.tolist() == [[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0]]
    columns.sum().backward()
    assert per_datum[0].grad.tolist() == [0.0, 1.0, 1.0, 1.0]
    assert per_datum[1].grad.tolist() == [1.0]


def test_adam_params_carry_the_optimizer_the_clip_and_this_steps_lr():
    optimizer = OptimizerConfig(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    params = mapping.adam_params(optimizer, grad_clip=0.5, lr=2.5e-4)
    assert (params.learning_rate, params.beta1, params.beta2) == (2.5e-4, 0.9, 0.95)
    assert (params.weight_decay, params.grad_clip_norm, params.eps) == (0.1, 0.5, 1e-8)


def test_the_lr_of_each_step_follows_the_schedule():
    """Warm-up over 2 steps then a cosine to 0 over the remaining 2 of 4 (num_cycles 0.5):
    factors 0, 1/2, 1, cos^2(pi/4) = 1/2."""
    cfg = OptimizerConfig(lr=1e-3, lr_warmup_steps=2, lr_scheduler_type="cosine")
    factor = lr_factor_fn(cfg, 4)
    lrs = [cfg.lr * factor(step) for step in range(4)]
    assert lrs == pytest.approx([0.0, 5e-4, 1e-3, 0.5e-3])
    assert math.isclose(factor(10), 0.0, abs_tol=1e-12)
