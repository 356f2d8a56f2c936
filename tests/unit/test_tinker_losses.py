"""The Tinker API's built-in losses (``trinity/tinker/losses``) against values worked out by
hand from their definitions, and their gradients where the definition says what carries it."""

import math

import pytest
import torch

from trinity.tinker.losses import LOSSES

LP = [-1.0, -2.0, -0.5, -3.0]  # the trained policy's logprobs of four target tokens
Q = [-1.5, -1.5, -0.45, -3.0]  # the sampler's: ratios e^0.5, e^-0.5, e^-0.05, 1
ADV = [1.0, -2.0, 0.5, 0.0]


def _call(name, lp=LP, config=None, **inputs):
    spec = LOSSES[name]
    logprobs = torch.tensor(lp, requires_grad=True)
    tensors = {k: torch.tensor(v) for k, v in inputs.items()}
    settings = {k: v for k, v in spec.config.items() if v is not None}
    settings.update(config or {})
    loss = spec.fn(logprobs, tensors, settings)
    loss.backward()
    return float(loss.detach()), logprobs.grad.tolist()


def test_cross_entropy_is_the_weighted_negative_log_likelihood():
    loss, grad = _call("cross_entropy", weights=[1.0, 0.0, 2.0, 1.0])
    assert loss == pytest.approx(1.0 + 0 + 1.0 + 3.0)  # -(-1*1 - 0.5*2 - 3*1)
    assert grad == pytest.approx([-1.0, 0.0, -2.0, -1.0])
    # no weights: every token weighs 1; (N, K) candidates weighted one by one
    assert _call("cross_entropy")[0] == pytest.approx(6.5)
    loss, _ = _call("cross_entropy", lp=[[-1.0, -2.0]], weights=[[0.25, 0.75]])
    assert loss == pytest.approx(0.25 + 1.5)


def test_importance_sampling_weights_advantages_by_the_ratio():
    loss, grad = _call("importance_sampling", logprobs=Q, advantages=ADV)
    ratios = [math.exp(0.5), math.exp(-0.5), math.exp(-0.05), 1.0]
    assert loss == pytest.approx(-sum(r * a for r, a in zip(ratios, ADV, strict=False)))
    # d/dlp of -r*A is -r*A: the ratio carries the gradient
    assert grad == pytest.approx([-r * a for r, a in zip(ratios, ADV, strict=False)])


def test_ppo_takes_the_pessimistic_of_clipped_and_unclipped_terms():
    loss, grad = _call("ppo", logprobs=Q, advantages=ADV)
    # token 0: r = 1.6487 > 1.2 with A > 0 -> clipped term 1.2 * 1 (no gradient)
    # token 1: r = 0.6065 < 0.8 with A < 0 -> clipped term 0.8 * -2 = -1.6 (no gradient)
    # token 2: r = 0.9512 inside the range -> r * 0.5 (gradient r * 0.5)
    # token 3: A = 0
    r2 = math.exp(-0.05)
    assert loss == pytest.approx(-(1.2 - 1.6 + 0.5 * r2))
    assert grad == pytest.approx([0.0, 0.0, -0.5 * r2, 0.0])
    # a wider range from the config: token 0 and 1 unclipped
    loss, _ = _call(
        "ppo",
        config={"clip_low_threshold": 0.5, "clip_high_threshold": 2.0},
        logprobs=Q,
        advantages=ADV,
    )
    assert loss == pytest.approx(-(math.exp(0.5) - 2 * math.exp(-0.5) + 0.5 * r2))
    # per-token thresholds in the datum win over the config
    loss, _ = _call(
        "ppo",
        logprobs=Q,
        advantages=ADV,
        clip_low_threshold=[0.9] * 4,
        clip_high_threshold=[1.1] * 4,
    )
    assert loss == pytest.approx(-(1.1 - 2 * 0.9 + 0.5 * r2))


def test_cispo_clips_the_weight_and_keeps_every_tokens_gradient():
    loss, grad = _call("cispo", logprobs=Q, advantages=ADV)
    w = [1.2, 0.8, math.exp(-0.05), 1.0]  # the clipped ratios
    assert loss == pytest.approx(-sum(wi * lp * a for wi, lp, a in zip(w, LP, ADV, strict=False)))
    assert grad == pytest.approx([-wi * a for wi, a in zip(w, ADV, strict=False)])


def test_dro_penalises_the_squared_log_ratio():
    loss, grad = _call("dro", config={"beta": 0.5}, logprobs=Q, advantages=ADV)
    d = [lp - q for lp, q in zip(LP, Q, strict=False)]
    assert loss == pytest.approx(
        -sum(lp * a - 0.25 * x * x for lp, a, x in zip(LP, ADV, d, strict=False))
    )
    assert grad == pytest.approx([-a + 0.5 * x for a, x in zip(ADV, d, strict=False)])
    assert LOSSES["dro"].config == {"beta": None}  # no default: the caller must say


def test_the_losses_are_the_sdks_built_in_names():
    LossFnType = pytest.importorskip("tinker.types").LossFnType

    listed = set(LossFnType.__args__)
    assert set(LOSSES) <= listed
    from trinity.tinker.training import UNSUPPORTED_LOSSES

    assert set(LOSSES) | set(UNSUPPORTED_LOSSES) == listed  # each one computed or refused
