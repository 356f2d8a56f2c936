"""REC: which tokens each clip mode keeps, with and without importance weights, by hand."""

import math

import pytest
import torch

from trinity.algorithm import ALGORITHM_TYPE, POLICY_LOSS_FN

# old_logprob = 0, so logprob = ln r. epsilon 0.2 -> [0.8, 1.2]; ring's 0.6 / 2.0 -> 0.4 / 3.0.
RATIOS = torch.tensor([[0.5, 1.1, 1.5, 0.3], [0.5, 0.9, 1.5, 3.5]])
ADV = torch.tensor([[1.0] * 4, [-1.0] * 4])
MASK = torch.ones(2, 4)
KEPT = {
    "none": [[1, 1, 1, 1], [1, 1, 1, 1]],
    "two-side": [[0, 1, 0, 0], [0, 1, 0, 0]],  # only 1.1 and 0.9 lie in [0.8, 1.2]
    # A > 0 loses r > 1.2 (1.5); A < 0 loses r < 0.8 (0.5)
    "one-side": [[1, 1, 0, 1], [0, 1, 1, 1]],
    # two-side, plus A > 0 with r <= 0.4 (0.3) and A < 0 with r >= 3.0 (3.5)
    "ring": [[0, 1, 0, 1], [0, 1, 0, 1]],
}


def _expected(mode: str, importance_sampling: bool) -> float:
    total = 0.0
    for row in range(2):
        for t in range(4):
            r, a = RATIOS[row, t].item(), ADV[row, t].item()
            w = r if importance_sampling else 1.0
            total += KEPT[mode][row][t] * -a * w * math.log(r)
    return total / 8  # token-mean over the 8 valid tokens


def rec(logprob=None, **kwargs):
    fn = POLICY_LOSS_FN.get("rec")(**kwargs)
    logprob = RATIOS.log() if logprob is None else logprob
    return fn(logprob=logprob, old_logprob=torch.zeros(2, 4), action_mask=MASK, advantages=ADV)


@pytest.mark.parametrize("mode", list(KEPT))
@pytest.mark.parametrize("weight", ["none", "importance_sampling"])
def test_rec_variants_by_hand(mode, weight):
    loss, metrics = rec(clip_mode=mode, weight=weight)
    assert loss.item() == pytest.approx(_expected(mode, weight != "none"), abs=1e-6)
    dropped = 8 - sum(map(sum, KEPT[mode]))
    assert metrics["pg_clipfrac"] == pytest.approx(dropped / 8)


def test_rec_gradient_is_reinforce_on_kept_tokens():
    logprob = RATIOS.log().requires_grad_()
    loss, _ = rec(logprob=logprob)  # the default: REC-OneSide-NoIS
    loss.backward()
    expected = -ADV * torch.tensor(KEPT["one-side"], dtype=torch.float) / 8
    assert torch.allclose(logprob.grad, expected, atol=1e-6)


def test_rec_with_importance_weights_has_ppos_unclipped_gradient():
    logprob = RATIOS.log().requires_grad_()
    loss, _ = rec(logprob=logprob, clip_mode="none", weight="importance_sampling")
    loss.backward()
    assert torch.allclose(logprob.grad, -ADV * RATIOS / 8, atol=1e-6)  # d(-A r)/d log pi


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"clip_mode": "both"}, "clip_mode"),
        ({"weight": "is"}, "weight"),
        ({"epsilon_low": 0.0}, "epsilon_low"),
        ({"epsilon_low_prime": 0.1}, "ring"),  # inside the clipping range
    ],
)
def test_rec_rejects_bad_arguments(bad, match):
    with pytest.raises(ValueError, match=match):
        POLICY_LOSS_FN.get("rec")(**bad)


def test_rec_algorithm_defaults_to_one_side_no_is():
    config = ALGORITHM_TYPE.get("rec").default_config()
    assert (config["advantage_fn"], config["policy_loss_fn"]) == ("rec", "rec")
    args = POLICY_LOSS_FN.get("rec").default_args()
    assert (args["clip_mode"], args["weight"]) == ("one-side", "none")


# One row, old_logprob 0: tokens with ratio 2 (logprob ln 2) and 1 (logprob 0), A = 2.
ONE_LOGPROB = torch.tensor([[math.log(2.0), 0.0]])


def rec_one(**kwargs) -> float:
    fn = POLICY_LOSS_FN.get("rec")(clip_mode="none", **kwargs)
    loss, _ = fn(
        logprob=ONE_LOGPROB,
        old_logprob=torch.zeros(1, 2),
        action_mask=torch.ones(1, 2),
        advantages=torch.full((1, 2), 2.0),
    )
    return loss.item()


def test_advantage_weight_is_exp_of_advantage_over_temp():
    # temp 2: w = exp(2 / 2) = e; token-mean of (-2 * e * ln 2, 0)
    assert rec_one(weight="advantage", temp=2.0) == pytest.approx(-math.e * math.log(2.0))


@pytest.mark.parametrize(
    "regularizer, added",
    [
        ("none", 0.0),
        # k2: 0.5 * (ln 2 - 0)^2 on the first token, 0 on the second; token-mean
        ("k2", 0.5 * math.log(2.0) ** 2 / 2),
        # forward-kl: -0.5 * logprob; token-mean of (-0.5 ln 2, 0)
        ("forward-kl", -0.5 * math.log(2.0) / 2),
    ],
)
def test_regularizer_adds_its_term_to_the_reinforce_loss(regularizer, added):
    base = -2.0 * math.log(2.0) / 2  # token-mean of (-A ln 2, -A * 0)
    got = rec_one(regularizer=regularizer, regularizer_coef=0.5)
    assert got == pytest.approx(base + added)


def test_unknown_regularizer_is_refused_by_name():
    with pytest.raises(ValueError, match="regularizer must be one of none, k2, forward-kl"):
        POLICY_LOSS_FN.get("rec")(regularizer="l2")
