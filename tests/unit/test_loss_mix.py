"""Mixed PPO + SFT loss: RL rows and expert rows of one batch, worked by hand."""

import pytest
import torch

import trinity.algorithm.policy_loss_fn.mix  # noqa: F401  (registers "mix")
from trinity.algorithm import POLICY_LOSS_FN

# Rows [RL 0, expert, RL 1]; old_logprob = 0, so ratio = exp(logprob), clip range 0.2.
# RL 0: A = +1, ratios [1.5, 0.7, 1.1]: -A*r = [-1.5, -0.7, -1.1], -A*clip(r) = [-1.2, -0.8,
#       -1.1]; max = [-1.2, -0.7, -1.1] (sum -3.0), clipped: token 0.
# RL 1: A = -2, ratios [1.5, 0.7, 1.0], last token padding: -A*r = [3.0, 1.4],
#       -A*clip(r) = [2.4, 1.6]; max = [3.0, 1.6] (sum 4.6), clipped: token 1.
#   PPO token-mean = (-3.0 + 4.6) / 5 = 0.32, seq-mean-token-mean = (-1.0 + 2.3) / 2 = 0.65,
#   pg_clipfrac = 2/5.
# Expert: logprob [-1, -2, (-3 padding)]: SFT = mean(1, 2) = 1.5 in both modes. Its advantages
#   (100) and old_logprob (-50) are nonsense on purpose: the expert row must ignore them.
RL_RATIOS = torch.tensor([[1.5, 0.7, 1.1], [1.5, 0.7, 1.0]])
LOGPROB = torch.stack([RL_RATIOS[0].log(), torch.tensor([-1.0, -2.0, -3.0]), RL_RATIOS[1].log()])
OLD = torch.tensor([[0.0, 0.0, 0.0], [-50.0, -50.0, -50.0], [0.0, 0.0, 0.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [100.0, 100.0, 100.0], [-2.0, -2.0, -2.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
EXPERT = torch.tensor([0.0, 1.0, 0.0])


def mix(**kwargs):
    return POLICY_LOSS_FN.get("mix")(**kwargs)


def call(fn, rows=slice(None), logprob=LOGPROB):
    return fn(
        logprob=logprob[rows],
        old_logprob=OLD[rows],
        action_mask=MASK[rows],
        advantages=ADV[rows],
        expert_mask=EXPERT[rows],
    )


@pytest.mark.parametrize("mode, ppo_loss", [("token-mean", 0.32), ("seq-mean-token-mean", 0.65)])
def test_mix_weights_ppo_and_sft(mode, ppo_loss):
    loss, metrics = call(mix(mu=0.1, loss_agg_mode=mode))
    assert loss.item() == pytest.approx(0.9 * ppo_loss + 0.1 * 1.5, abs=1e-6)
    assert metrics["usual/pg_loss"] == pytest.approx(ppo_loss, abs=1e-6)
    assert metrics["usual/pg_clipfrac"] == pytest.approx(2 / 5)
    assert "usual/ppo_kl" in metrics
    assert metrics["expert/sft_loss"] == pytest.approx(1.5, abs=1e-6)


def test_mix_gradient_of_expert_row():
    logprob = LOGPROB.clone().requires_grad_()
    loss, _ = call(mix(mu=0.1), logprob=logprob)
    loss.backward()
    # Expert row: d(mu * mean(-logprob over 2 tokens)) = -0.1 / 2 on its valid tokens.
    assert torch.allclose(logprob.grad[1], torch.tensor([-0.05, -0.05, 0.0]), atol=1e-6)
    # RL 1 token 0 (unclipped): 0.9 * (-A * r) / 5 tokens = 0.9 * 3.0 / 5.
    assert logprob.grad[2, 0].item() == pytest.approx(0.9 * 3.0 / 5, abs=1e-6)


def test_mix_side_without_rows_contributes_zero():
    only_expert, m1 = call(mix(mu=0.1), rows=[1])
    assert only_expert.item() == pytest.approx(0.1 * 1.5, abs=1e-6)
    assert set(m1) == {"expert/sft_loss", "mu"}
    only_rl, m2 = call(mix(mu=0.1), rows=[0, 2])
    assert only_rl.item() == pytest.approx(0.9 * 0.32, abs=1e-6)
    assert "expert/sft_loss" not in m2


def test_mix_checks():
    fn = mix()
    with pytest.raises(ValueError, match="expert_mask"):
        fn(logprob=LOGPROB, old_logprob=OLD, action_mask=MASK, advantages=ADV, expert_mask=None)
    with pytest.raises(ValueError, match="shape"):
        fn(
            logprob=LOGPROB,
            old_logprob=OLD,
            action_mask=MASK,
            advantages=ADV,
            expert_mask=EXPERT[:2],
        )
    with pytest.raises(ValueError, match="mu"):
        mix(mu=1.5)
    cls = POLICY_LOSS_FN.get("mix")
    assert cls.select_keys == (
        "logprob",
        "old_logprob",
        "action_mask",
        "advantages",
        "expert_mask",
        "step",
        "rollout_is_weights",
    )
    assert cls.default_args() == {
        "mu": 0.1,
        "clip_range": 0.2,
        "clip_ratio_c": None,
        "loss_agg_mode": "token-mean",
    }


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        # SFT summed over its row's 2 tokens (1 + 2 = 3), PPO token-mean 0.32
        ({"sft_loss_agg_mode": "seq-mean-token-sum"}, 0.5 * 0.32 + 0.5 * 3.0),
        # PPO seq-mean-token-mean 0.65, SFT token-mean 1.5
        ({"grpo_loss_agg_mode": "seq-mean-token-mean"}, 0.5 * 0.65 + 0.5 * 1.5),
    ],
)
def test_each_term_may_aggregate_its_own_way(kwargs, expected):
    loss, _ = call(mix(mu=0.5, loss_agg_mode="token-mean", **kwargs))
    assert loss.item() == pytest.approx(expected)


def test_the_originals_batch_sizes_are_accepted_and_not_read():
    from trinity.algorithm.policy_loss_fn import build_policy_loss

    sizes = {"ngpus_trainer": 4, "ppo_mini_batch_size": 320, "use_dynamic_bsz": True}
    for name in ("mix", "mix_chord"):
        fn = build_policy_loss(name, {"clip_range": 0.2, **sizes})
        assert set(sizes) <= set(type(fn).inert_args)
    with_sizes, _ = call(build_policy_loss("mix", {"mu": 0.5, **sizes}))
    without, _ = call(mix(mu=0.5))
    assert with_sizes.item() == pytest.approx(without.item())
