"""Rollout correction (trinity/algorithm/rollout_correction.py) on small tensors, by hand.

Every case uses the same batch: the engine's logprob is -1 on every token and the trainer's
is ``-1 + log(ratio)``, so each token's ratio pi_old / pi_rollout is a chosen number:

    row 0: 2, 0.5, 3   (3 valid tokens; product 3, geometric mean 3^(1/3) = 1.442)
    row 1: 1, 4, (9)   (2 valid tokens; product 4, geometric mean 2; the 9 is padding)
    row 2: (7, 7, 7)   (no valid token: a row without engine logprobs)
"""

import math

import pytest
import torch

from trinity.algorithm import POLICY_LOSS_FN
from trinity.algorithm.rollout_correction import (
    aggregate_log_ratio,
    correct_rollout,
    mismatch_metrics,
    rejection_mask,
    truncated_is_weights,
    veto_mask,
)

RATIOS = torch.tensor([[2.0, 0.5, 3.0], [1.0, 4.0, 9.0], [7.0, 7.0, 7.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
ROLLOUT = torch.full((3, 3), -1.0)
TRAINER = ROLLOUT + RATIOS.log()
LOG_RATIO = TRAINER - ROLLOUT
approx = pytest.approx


def test_aggregation_levels():
    assert torch.equal(aggregate_log_ratio(LOG_RATIO, MASK, "token"), LOG_RATIO)
    seq = aggregate_log_ratio(LOG_RATIO, MASK, "sequence").exp().squeeze(-1)
    assert seq.tolist() == approx([3.0, 4.0, 1.0], rel=1e-6)  # products; an empty row: 1
    geo = aggregate_log_ratio(LOG_RATIO, MASK, "geometric").exp().squeeze(-1)
    assert geo.tolist() == approx([3 ** (1 / 3), 2.0, 1.0], rel=1e-6)
    with pytest.raises(ValueError, match="unknown aggregation level 'tokens'"):
        aggregate_log_ratio(LOG_RATIO, MASK, "tokens")


def test_token_level_truncation_and_its_statistics():
    weights, metrics = truncated_is_weights(LOG_RATIO, MASK, "token", threshold=2.5)
    # min(ratio, 2.5) on valid tokens; 1.0 where nothing is judged
    expected = [[2.0, 0.5, 2.5], [1.0, 2.5, 1.0], [1.0, 1.0, 1.0]]
    assert weights.tolist() == [approx(row, rel=1e-6) for row in expected]
    assert not weights.requires_grad
    # raw ratios of the 5 valid tokens: 2, 0.5, 3, 1, 4
    assert metrics["rollout_is_mean"] == approx(10.5 / 5, rel=1e-6)
    assert metrics["rollout_is_max"] == approx(4.0, rel=1e-6)
    assert metrics["rollout_is_min"] == approx(0.5, rel=1e-6)
    assert metrics["rollout_is_ratio_fraction_high"] == approx(2 / 5)  # 3 and 4 > 2.5
    assert metrics["rollout_is_ratio_fraction_low"] == 0.0  # none < 1 / 2.5
    # std and ESS of the ratios clamped to [0.4, 2.5]: 2, 0.5, 2.5, 1, 2.5
    mean, mean_sq = 8.5 / 5, (4 + 0.25 + 6.25 + 1 + 6.25) / 5
    assert metrics["rollout_is_std"] == approx(math.sqrt(mean_sq - mean**2), rel=1e-5)
    assert metrics["rollout_is_eff_sample_size"] == approx(mean**2 / mean_sq, rel=1e-5)


def test_sequence_level_truncation_is_the_capped_product_on_every_token():
    weights, metrics = truncated_is_weights(LOG_RATIO, MASK, "sequence", threshold=3.5)
    # row 0: product 3 (under the cap), row 1: product 4 -> 3.5
    assert weights[0].tolist() == approx([3.0] * 3, rel=1e-6)
    assert weights[1, :2].tolist() == approx([3.5] * 2, rel=1e-6)
    assert weights[1, 2].item() == 1.0 and weights[2].tolist() == [1.0] * 3
    assert metrics["rollout_is_mean"] == approx((3 * 3 + 4 * 2) / 5, rel=1e-6)  # per token
    assert metrics["rollout_is_ratio_fraction_high"] == approx(1 / 2)  # rows: 4 > 3.5
    assert metrics["rollout_is_max"] == approx(4.0, rel=1e-6)


def test_batch_normalization_divides_by_the_mean_weight():
    token, metrics = truncated_is_weights(LOG_RATIO, MASK, "token", 2.5, batch_normalize=True)
    assert metrics["rollout_is_batch_norm_factor"] == approx(8.5 / 5, rel=1e-6)
    assert token[0].tolist() == approx([2.0 / 1.7, 0.5 / 1.7, 2.5 / 1.7], rel=1e-6)
    seq, metrics = truncated_is_weights(LOG_RATIO, MASK, "sequence", 3.5, batch_normalize=True)
    # one weight per row: (3 + 3.5) / 2; the empty row does not count
    assert metrics["rollout_is_batch_norm_factor"] == approx(3.25, rel=1e-6)
    assert seq[1, 0].item() == approx(3.5 / 3.25, rel=1e-6)


def test_token_rejection_band():
    keep, metrics = rejection_mask(LOG_RATIO, MASK, "token", upper=2.5, lower=0.6)
    # rejected: 0.5 (< 0.6), 3 and 4 (> 2.5); padding and the empty row are never rejected
    assert keep.tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    assert metrics["rollout_rs_masked_fraction"] == approx(3 / 5)
    assert metrics["rollout_rs_seq_masked_fraction"] == 1.0  # both rows lose a token


def test_sequence_and_geometric_rejection_take_whole_rows():
    keep, metrics = rejection_mask(LOG_RATIO, MASK, "sequence", upper=3.5, lower=0.5)
    assert keep.tolist() == [[1.0] * 3, [0.0, 0.0, 1.0], [1.0] * 3]  # product 4 > 3.5
    assert metrics["rollout_rs_masked_fraction"] == approx(2 / 5)
    assert metrics["rollout_rs_seq_masked_fraction"] == approx(1 / 2)
    # geometric means 1.442 and 2 against [1 / 1.5, 1.5]: row 1 goes
    keep, _ = rejection_mask(LOG_RATIO, MASK, "geometric", upper=1.5)
    assert keep[:, 0].tolist() == [1.0, 0.0, 1.0]
    # the default lower end is 1 / upper: a geometric mean of 1 / 1.6 = 0.625 < 1 / 1.5
    low = torch.log(torch.tensor([[1 / 1.6]]))
    assert rejection_mask(low, torch.ones(1, 1), "geometric", upper=1.5)[0].item() == 0.0
    # lower 0: no lower end at all
    assert rejection_mask(low, torch.ones(1, 1), "geometric", 1.5, lower=0.0)[0].item() == 1.0


def test_veto_drops_rows_holding_a_catastrophic_token():
    keep, metrics = veto_mask(LOG_RATIO, MASK, threshold=0.6)
    assert keep.tolist() == [[0.0] * 3, [1.0] * 3, [1.0] * 3]  # row 0 holds 0.5 < 0.6
    assert metrics["rollout_is_veto_fraction"] == approx(1 / 2)
    assert metrics["rollout_is_catastrophic_token_fraction"] == approx(1 / 5)


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(TRAINER, ROLLOUT, MASK)
    ln2, ln3, ln4 = math.log(2), math.log(3), math.log(4)
    assert m["rollout_corr/kl"] == approx(-(ln3 + ln4) / 5, rel=1e-5)  # mean(-log ratio)
    # k3: mean(r - log r - 1) = ((1 - ln2) + (ln2 - 0.5) + (2 - ln3) + 0 + (3 - ln4)) / 5
    assert m["rollout_corr/k3_kl"] == approx((5.5 - ln3 - ln4) / 5, rel=1e-5)
    # per row means: rollout -1, -1; trainer -1 + ln3 / 3, -1 + ln2 (row 2 left out)
    assert m["rollout_corr/rollout_ppl"] == approx(math.e, rel=1e-5)
    assert m["rollout_corr/rollout_log_ppl"] == approx(1.0, rel=1e-6)
    assert m["rollout_corr/training_log_ppl"] == approx((2 - ln3 / 3 - ln2) / 2, rel=1e-5)
    training_ppl = (math.e / 3 ** (1 / 3) + math.e / 2) / 2
    assert m["rollout_corr/training_ppl"] == approx(training_ppl, rel=1e-5)
    assert m["rollout_corr/log_ppl_diff"] == approx(-(ln3 / 3 + ln2) / 2, rel=1e-5)
    assert m["rollout_corr/log_ppl_abs_diff"] == approx((ln3 / 3 + ln2) / 2, rel=1e-5)
    assert m["rollout_corr/log_ppl_diff_max"] == approx(-ln3 / 3, rel=1e-5)
    assert m["rollout_corr/log_ppl_diff_min"] == approx(-ln2, rel=1e-5)
    assert m["rollout_corr/ppl_ratio"] == approx((3 ** (-1 / 3) + 0.5) / 2, rel=1e-5)
    assert m["rollout_corr/chi2_token"] == approx((4 + 0.25 + 9 + 1 + 16) / 5 - 1, rel=1e-5)
    assert m["rollout_corr/chi2_seq"] == approx((9 + 16) / 2 - 1, rel=1e-5)
    assert m["rollout_corr/logprob_abs_diff_mean"] == approx((4 * ln2 + ln3) / 5, rel=1e-5)
    assert m["rollout_corr/logprob_abs_diff_max"] == approx(ln4, rel=1e-5)
    # |exp(trainer) - exp(rollout)| = |r - 1| / e: 1, 0.5, 2, 0, 3 over e
    diffs = torch.tensor([1.0, 0.5, 2.0, 0.0, 3.0]) / math.e
    assert m["training/rollout_probs_diff_mean"] == approx(1.3 / math.e, rel=1e-5)
    assert m["training/rollout_probs_diff_max"] == approx(3 / math.e, rel=1e-5)
    assert m["training/rollout_probs_diff_std"] == approx(diffs.std().item(), rel=1e-5)


def test_identical_logprobs_show_no_mismatch():
    m = mismatch_metrics(ROLLOUT, ROLLOUT, MASK)
    for name in ("kl", "k3_kl", "log_ppl_abs_diff", "chi2_token", "chi2_seq"):
        assert m[f"rollout_corr/{name}"] == approx(0.0, abs=1e-7), name
    assert m["rollout_corr/ppl_ratio"] == approx(1.0)
    assert m["rollout_corr/logprob_abs_diff_max"] == 0.0
    assert mismatch_metrics(TRAINER, ROLLOUT, torch.zeros(3, 3)) == {}


def test_correct_rollout_combines_weights_rejection_and_veto():
    weights, keep, metrics = correct_rollout(
        TRAINER,
        ROLLOUT,
        MASK,
        rollout_is="token",
        rollout_is_threshold=2.5,
        rollout_rs="sequence",
        rollout_rs_threshold=3.5,
        rollout_rs_threshold_lower=0.5,
        rollout_token_veto_threshold=0.6,
    )
    assert weights[1].tolist() == approx([1.0, 2.5, 1.0], rel=1e-6)
    # row 0 vetoed (0.5 < 0.6), row 1 rejected (product 4 > 3.5); padding and row 2 are
    # never judged
    assert keep.tolist() == [[0.0] * 3, [0.0, 0.0, 1.0], [1.0] * 3]
    for name in ("rollout_is_mean", "rollout_rs_masked_fraction", "rollout_is_veto_fraction"):
        assert f"rollout_corr/{name}" in metrics
    assert (
        metrics["rollout_corr/k3_kl"]
        == mismatch_metrics(TRAINER, ROLLOUT, MASK)["rollout_corr/k3_kl"]
    )
    # nothing switched on: no weights, nothing rejected, only the mismatch metrics
    weights, keep, metrics = correct_rollout(TRAINER, ROLLOUT, MASK)
    assert weights is None and torch.equal(keep, torch.ones(3, 3))
    assert "rollout_corr/rollout_is_mean" not in metrics and "rollout_corr/kl" in metrics
    # no sampled token at all: nothing to judge
    assert correct_rollout(TRAINER, ROLLOUT, torch.zeros(3, 3), rollout_is="token")[2] == {}


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo", "topr", "opmd"])
def test_every_rl_loss_multiplies_its_token_terms_by_the_weights(name):
    cls = POLICY_LOSS_FN.get(name)
    logprob, mask = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -9.0]]), MASK[:2]
    inputs = {
        "logprob": logprob,
        "old_logprob": logprob - 0.05,
        "action_mask": mask,
        "advantages": torch.tensor([[1.0] * 3, [-0.5] * 3]),
    }
    inputs = {k: v for k, v in inputs.items() if k in cls.select_keys}
    plain, _ = cls()(**inputs)
    doubled, _ = cls()(**inputs, rollout_is_weights=torch.full((2, 3), 2.0))
    assert doubled.item() == approx(2 * plain.item(), rel=1e-6)


def test_mix_weighs_only_the_policy_term():
    mix = POLICY_LOSS_FN.get("mix")(mu=0.5)
    logprob = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -9.0]])
    inputs = dict(
        logprob=logprob,
        old_logprob=logprob - 0.05,
        action_mask=MASK[:2],
        advantages=torch.ones(2, 3),
        expert_mask=torch.tensor([0.0, 1.0]),  # row 1 is an expert demonstration
    )
    plain, metrics = mix(**inputs)
    doubled, _ = mix(**inputs, rollout_is_weights=torch.full((2, 3), 2.0))
    pg, sft = metrics["usual/pg_loss"], metrics["expert/sft_loss"]
    assert plain.item() == approx(0.5 * pg + 0.5 * sft, rel=1e-6)
    assert doubled.item() == approx(0.5 * 2 * pg + 0.5 * sft, rel=1e-6)


def test_only_action_tokens_with_engine_logprobs_are_judged():
    from trinity.common.experience import Experience, ExperienceBatch
    from trinity.trainer.trainer import sampled_tokens

    sampled = Experience([1, 2, 3, 4], 2, logprobs=[-0.1, -0.2], action_mask=[1, 0])
    demonstration = Experience([1, 2, 3], 2)  # no logprobs, e.g. an expert row
    batch = ExperienceBatch.from_experiences([sampled, demonstration], pad_token_id=0)
    assert sampled_tokens(batch).tolist() == [[1.0, 0.0], [0.0, 0.0]]
