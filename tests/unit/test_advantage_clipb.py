"""Clip_B (``advantage_fn: clipb``): GRPO advantages and the entropy-signal token filter on
hand-made batches, and the trainer handing it the policy's scores."""

import math

import pytest
import torch

from tests.unit.test_advantage_rloo import make_batch
from tests.unit.test_dataproto_view import group_experiences, make_trainer
from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.advantage_fn import ClipBAdvantageFn, GRPOAdvantageFn
from trinity.algorithm.advantage_fn.base import (
    ACTOR_MASK_KEY,
    POLICY_ENTROPY_KEY,
    POLICY_LOGPROB_KEY,
)
from trinity.trainer.actor_batch import actor_batch
from trinity.trainer.policy_step import response_logprobs

# Two groups: a (rows 0, 1; rewards 1, 0) and b (rows 2, 3; rewards 1, 1). Rows 0 and 1
# have 3 response tokens, rows 2 and 3 have 2 (column 2 is padding).
REWARDS = [1.0, 0.0, 1.0, 1.0]
GROUPS = ["a", "a", "b", "b"]
MASKS = [[1, 1, 1], [1, 1, 1], [1, 1], [1, 1]]
LN2, LN4 = math.log(2.0), math.log(4.0)
# Logprob LP and entropy H per token; S = exp(LP) * (H + LP). Most tokens have LP = 0
# (p = 1), so S = H. Two use the formula: LP = ln 1/2 with H = ln 2 + 2 gives
# S = 1/2 * 2 = 1, and LP = ln 1/4 with H = ln 4 gives S = 1/4 * 0 = 0 (S = H would be
# 1.39 there and keep the token). The padding's huge values must not count.
LP = [[0.0, -LN2, 0.0], [-LN4, 0.0, -LN2], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
H = [[0.0, LN2 + 2, 1.0], [LN4, 1.0, LN2 + 2], [0.0, 1.0, 100.0], [1.0, 1.0, 100.0]]
# S on the 10 valid tokens: row 0: 0, 1, 1; row 1: 0, 1, 1; row 2: 0, 1; row 3: 1, 1.
# ES = 7 / 10 = 0.7; varS = (3 * 0.7^2 + 7 * 0.3^2) / 10 = (1.47 + 0.63) / 10 = 0.21;
# stdS = 0.458. With mu = 1 the bound is S >= 0.7 - 0.458 = 0.242: the three tokens with
# S = 0 are below it, rows 0 (advantage > 0), 1 (< 0) and 2 (= 0) at column 0; only
# row 1's goes. With mu = 2.5 the bound is -0.446: nothing goes.
ES, VAR_S = 0.7, 0.21
ADV = 0.5 / (math.sqrt(0.5) + 1e-6)  # group a: mean 0.5, unbiased std sqrt(0.5)


def scored_batch(lp=LP, h=H):
    batch = make_batch(REWARDS, GROUPS, MASKS)
    batch.extra[POLICY_LOGPROB_KEY] = torch.tensor(lp)
    batch.extra[POLICY_ENTROPY_KEY] = torch.tensor(h)
    return batch


def test_advantages_are_grpos_by_hand():
    exps, _ = ClipBAdvantageFn()(scored_batch())
    expected = torch.tensor([[ADV, ADV, ADV], [-ADV, -ADV, -ADV], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert ADV == pytest.approx(0.70711, abs=1e-5)
    assert torch.allclose(exps.advantages, expected, atol=1e-6)
    assert torch.equal(exps.returns, exps.advantages)
    grpo, _ = GRPOAdvantageFn(**GRPOAdvantageFn.default_args())(scored_batch())
    assert torch.allclose(exps.advantages, grpo.advantages, atol=0)


def test_a_group_of_one_keeps_its_raw_score():
    # veRL's (and the original's) mean 0, std 1 for a lone row: 3 / (1 + 1e-6).
    batch = make_batch([3.0, 1.0, 0.0], ["solo", "g", "g"], [[1, 1], [1], [1]])
    batch.extra[POLICY_LOGPROB_KEY] = torch.zeros(3, 2)
    batch.extra[POLICY_ENTROPY_KEY] = torch.zeros(3, 2)
    exps, _ = ClipBAdvantageFn()(batch)
    assert exps.advantages[0].tolist() == pytest.approx([3.0 / (1 + 1e-6)] * 2)
    assert exps.advantages[1, 0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6))


def test_negative_outlier_removed_positive_and_zero_kept():
    exps, metrics = ClipBAdvantageFn(mu=1.0)(scored_batch())
    kept = exps.extra[ACTOR_MASK_KEY]
    assert kept.tolist() == [
        [1.0, 1.0, 1.0],  # advantage > 0: its S = 0 token stays
        [0.0, 1.0, 1.0],  # advantage < 0: S = 0 is 1.53 std below ES, removed
        [1.0, 1.0, 0.0],  # advantage 0: its S = 0 token stays; padding stays 0
        [1.0, 1.0, 0.0],
    ]
    assert exps.action_mask.tolist() == [[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 0]]
    assert metrics["clipb/ES"] == pytest.approx(ES, abs=1e-6)
    assert metrics["clipb/varS"] == pytest.approx(VAR_S, abs=1e-6)
    assert metrics["clipb/frac_clipped"] == pytest.approx(1 / 10)
    assert metrics["clipb/frac_clipped_pos"] == 0.0
    assert metrics["clipb/frac_clipped_neg"] == pytest.approx(1 / 3)
    # the advantage statistics are over every valid token (the removed one too)
    assert metrics["critic/advantages/min"] == pytest.approx(-ADV, abs=1e-6)


def test_default_mu_keeps_a_token_within_2_5_std():
    exps, metrics = ClipBAdvantageFn(**ClipBAdvantageFn.default_args())(scored_batch())
    assert torch.equal(exps.extra[ACTOR_MASK_KEY], exps.action_mask)
    assert metrics["clipb/frac_clipped"] == 0.0 and metrics["clipb/frac_clipped_neg"] == 0.0


def test_constant_signal_keeps_every_token():
    # S = 1 * (0.5 + 0) everywhere: varS = 0 < 1e-12, so even mu = 0 removes nothing.
    batch = scored_batch([[0.0] * 3] * 4, [[0.5] * 3] * 4)
    exps, metrics = ClipBAdvantageFn(mu=0.0)(batch)
    assert torch.equal(exps.extra[ACTOR_MASK_KEY], exps.action_mask)
    assert metrics["clipb/ES"] == pytest.approx(0.5)
    assert metrics["clipb/varS"] == 0.0
    assert metrics["clipb/frac_clipped"] == 0.0


def test_registered_and_refuses_a_batch_without_policy_scores():
    assert ADVANTAGE_FN.get("clipb") is ClipBAdvantageFn
    assert ClipBAdvantageFn.needs_groups and ClipBAdvantageFn.needs_policy_scores
    with pytest.raises(KeyError, match="needs_policy_scores"):
        ClipBAdvantageFn()(make_batch(REWARDS, GROUPS, MASKS))


def test_the_mask_reaches_the_actor_batch_only():
    exps, _ = ClipBAdvantageFn(mu=1.0)(scored_batch())
    trained, metrics = actor_batch(exps, None)
    assert metrics == {}
    assert trained.action_mask[1].tolist() == [0.0, 1.0, 1.0]
    assert exps.action_mask[1].tolist() == [1.0, 1.0, 1.0]  # the step's batch: every token
    assert ACTOR_MASK_KEY not in trained.extra
    plain = make_batch(REWARDS, GROUPS, MASKS)
    assert actor_batch(plain, None)[0] is plain


@pytest.fixture
def clipb_trainer(tmp_path, micro_model, arithmetic_data):
    algorithm = {
        "algorithm_type": "grpo",
        "repeat_times": 4,
        "advantage_fn": "clipb",
        "advantage_fn_args": {"mu": 0.0},
    }
    return make_trainer(tmp_path, micro_model, arithmetic_data, algorithm)


def test_the_trainer_hands_the_policy_scores_to_the_fn(clipb_trainer):
    trainer = clipb_trainer
    seen = {}

    class Recording(ClipBAdvantageFn):
        def __call__(self, exps, **kwargs):
            seen.update(
                {k: exps.extra[k].clone() for k in (POLICY_LOGPROB_KEY, POLICY_ENTROPY_KEY)}
            )
            return super().__call__(exps, **kwargs)

    trainer.advantage_fn = Recording(mu=0.0)
    exps = group_experiences(trainer.tokenizer)
    batch, metrics = trainer._prepare_batch(trainer._batch(exps))
    with torch.no_grad():
        logprob, entropy = response_logprobs(
            trainer.model, trainer._batch(exps), trainer.fns.temperature
        )
    assert torch.allclose(seen[POLICY_LOGPROB_KEY], logprob, atol=1e-5)
    assert torch.allclose(seen[POLICY_ENTROPY_KEY], entropy, atol=1e-5)
    assert not seen[POLICY_LOGPROB_KEY].requires_grad
    assert {"clipb/frac_clipped", "clipb/ES", "clipb/varS"} <= set(metrics)
    # GRPO does not ask: no extra forward pass, no keys
    trainer.advantage_fn = GRPOAdvantageFn(**GRPOAdvantageFn.default_args())
    batch, _ = trainer._prepare_batch(trainer._batch(exps))
    assert POLICY_LOGPROB_KEY not in batch.extra and POLICY_ENTROPY_KEY not in batch.extra


def test_a_step_trains_the_actor_on_the_kept_tokens(clipb_trainer, monkeypatch):
    trainer = clipb_trainer
    update_actor, masks = trainer._update_actor, []

    def recording(batch):
        masks.append(batch.action_mask.clone())
        return update_actor(batch)

    monkeypatch.setattr(trainer, "_update_actor", recording)
    exps = group_experiences(trainer.tokenizer)
    full = trainer._batch(exps).action_mask
    metrics = trainer.train_step(exps)
    assert math.isfinite(metrics["actor/grad_norm"])
    removed = int(full.sum() - masks[0].sum())
    assert removed == round(metrics["clipb/frac_clipped"] * float(full.sum()))
    assert removed > 0  # mu = 0: some negative-advantage tokens lie below the mean
    assert torch.equal(masks[0] * full, masks[0])  # only tokens removed, none added
    # the batch metrics keep every token
    assert metrics["response_length/mean"] == pytest.approx(float(full.sum(-1).mean()))
