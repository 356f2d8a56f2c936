"""GiGPO: episode-level plus anchor-state step-level advantages, worked by hand."""

import pytest
import torch

from tests.unit.test_advantage_rloo import make_batch
from trinity.algorithm import ADVANTAGE_FN, ALGORITHM_TYPE
from trinity.common.experience import Experience, ExperienceBatch


def episodes(rows, group="g"):
    """One experience per (reward, mask, turn_starts, turn_states) row of one task group."""
    return [
        Experience(
            tokens=[1, 2] + [3] * len(mask),
            prompt_length=2,
            reward=reward,
            action_mask=mask,
            group_id=group,
            turn_starts=starts,
            turn_states=states,
        )
        for reward, mask, starts, states in rows
    ]


def advantages(exps, **args):
    batch = ExperienceBatch.from_experiences(exps, pad_token_id=0)
    out, metrics = ADVANTAGE_FN.get("gigpo")(**args)(batch)
    return out.advantages, metrics


def test_episode_and_step_groups_by_hand():
    # Three episodes of one game, gamma 0.5, F_norm = 1, omega 1. Turn rewards: the episode's
    # reward lands on its last turn, so R_t = gamma^(T - t) * R.
    #   e0: states s0, s1, reward 1 -> R_t = 0.5, 1
    #   e1: states s0, s1, s2, reward 0 -> R_t = 0, 0, 0
    #   e2: states s0, s3, reward 1 -> R_t = 0.5, 1
    # Episode level (Eq. 3): rewards 1, 0, 1, mean 2/3 -> A^E = 1/3, -2/3, 1/3.
    # Step level (Eq. 7): s0 holds 0.5, 0, 0.5 (mean 1/3) -> 1/6, -1/3, 1/6;
    #   s1 holds 1 (e0), 0 (e1) -> 0.5, -0.5; s2 and s3 are seen once -> 0.
    # Combined (Eq. 8): e0 1/2, 5/6; e1 -1, -7/6, -2/3; e2 1/2, 1/3.
    # Replies: e0 "aa" + env token + "a"; e1 "a" + env + "a" + env + "a"; e2 "a" + env + "aa".
    exps = episodes(
        [
            (1.0, [1, 1, 0, 1], [0, 3], ["s0", "s1"]),
            (0.0, [1, 0, 1, 0, 1], [0, 2, 4], ["s0", "s1", "s2"]),
            (1.0, [1, 0, 1, 1], [0, 2], ["s0", "s3"]),
        ]
    )
    adv, metrics = advantages(exps, gamma=0.5, fnorm="none")
    expected = torch.tensor(
        [
            [1 / 2, 1 / 2, 0.0, 5 / 6, 0.0],
            [-1.0, 0.0, -7 / 6, 0.0, -2 / 3],
            [1 / 2, 0.0, 1 / 3, 1 / 3, 0.0],
        ]
    )
    assert torch.allclose(adv, expected, atol=1e-6)
    # four anchor states, two of them (s0, s1) shared by more than one turn
    assert metrics["gigpo/anchor_groups_total"] == 4
    assert metrics["gigpo/anchor_groups_size_gt1"] == 2
    assert metrics["gigpo/anchor_group_hit_ratio"] == pytest.approx(0.5)
    assert metrics["gigpo/mean_abs_A_E"] == pytest.approx((1 / 3 + 2 / 3 + 1 / 3) / 3)


def test_std_normalisation_divides_each_group_by_its_std():
    # Two episodes, rewards 1 and 0, both start in s0 and then part (s1, s2).
    # Episode: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / 0.70711 = +-0.70711.
    # Step, gamma 1: s0 holds R = 1, 0 -> +-0.70711 as well; s1, s2 alone -> 0.
    exps = episodes([(1.0, [1, 1], [0, 1], ["s0", "s1"]), (0.0, [1, 1], [0, 1], ["s0", "s2"])])
    adv, _ = advantages(exps, gamma=1.0, fnorm="std")
    a = 0.5 / 0.5**0.5
    assert torch.allclose(adv, torch.tensor([[2 * a, a], [-2 * a, -a]]), atol=1e-5)


def test_all_equal_rewards_give_zero_at_both_levels():
    exps = episodes([(1.0, [1, 1], [0, 1], ["s0", "s1"])] * 3)
    for fnorm in ("std", "none"):
        adv, metrics = advantages(exps, fnorm=fnorm)
        assert torch.equal(adv, torch.zeros_like(adv))
        assert metrics["gigpo/mean_abs_A_S"] == 0.0


def test_states_seen_once_leave_only_the_episode_advantage():
    # No state repeats: every step group holds one turn, whose A^S is 0 (its own mean).
    exps = episodes([(1.0, [1, 1], [0, 1], ["a", "b"]), (0.0, [1, 1], [0, 1], ["c", "d"])])
    adv, metrics = advantages(exps, fnorm="none")
    assert torch.allclose(adv, torch.tensor([[0.5, 0.5], [-0.5, -0.5]]))
    assert metrics["gigpo/anchor_groups_size_gt1"] == 0
    assert metrics["gigpo/anchor_group_hit_ratio"] == 0.0


def test_a_state_revisited_within_one_episode_compares_the_visits():
    # One episode alone (A^E = 0) loops: s0, s0, then wins. gamma 0.5: R_t = 0.25, 0.5, 1.
    # s0 holds 0.25 and 0.5 (mean 0.375) -> -0.125, +0.125; s1 alone -> 0.
    exps = episodes([(1.0, [1, 1, 1], [0, 1, 2], ["s0", "s0", "s1"])])
    adv, _ = advantages(exps, gamma=0.5, fnorm="none")
    assert torch.allclose(adv, torch.tensor([[-0.125, 0.125, 0.0]]))


def test_groups_are_per_task_and_omega_zero_is_grpo():
    rows = [(1.0, [1, 1], [0, 1], ["s0", "s1"]), (0.0, [1, 1], [0, 1], ["s0", "s2"])]
    exps = episodes(rows, "a") + episodes(rows[::-1], "b")
    adv, metrics = advantages(exps, fnorm="std", omega=0.0)
    batch = ExperienceBatch.from_experiences(exps, pad_token_id=0)
    grpo, _ = ADVANTAGE_FN.get("grpo")()(batch)
    assert torch.allclose(adv, grpo.advantages)
    # s0 of task a and s0 of task b are different anchor groups
    assert metrics["gigpo/anchor_groups_total"] == 6


def test_turn_rewards_come_from_the_token_rewards_inside_each_turn():
    # An in-reward KL penalty of -0.1 on the first turn's token, reward 1 on the last token:
    # r = (-0.1, 1), gamma 1 -> R_t = 0.9, 1; the other episode has 0 everywhere.
    # Episode (F_norm 1): scores 0.9 and 0 -> +-0.45. s0: 0.9 vs 0 -> +-0.45.
    exps = episodes([(1.0, [1, 1], [0, 1], ["s0", "s1"]), (0.0, [1, 1], [0, 1], ["s0", "s2"])])
    batch = ExperienceBatch.from_experiences(exps, pad_token_id=0)
    batch.token_level_rewards = torch.tensor([[-0.1, 1.0], [0.0, 0.0]])
    out, _ = ADVANTAGE_FN.get("gigpo")(gamma=1.0, fnorm="none")(batch)
    assert torch.allclose(out.advantages, torch.tensor([[0.9, 0.45], [-0.9, -0.45]]))


def test_an_experience_without_turn_states_names_its_task():
    batch = make_batch([1.0, 0.0], ["explore-1-gsm8k-3"] * 2, [[1], [1]])
    with pytest.raises(ValueError, match=r"turn_states.*task 'explore-1-gsm8k-3'"):
        ADVANTAGE_FN.get("gigpo")()(batch)


def test_an_experience_needs_one_state_per_turn():
    with pytest.raises(ValueError, match="turn_states has 2 entries and turn_starts 1"):
        Experience(tokens=[1, 2, 3], prompt_length=1, turn_starts=[0], turn_states=["a", "b"])


@pytest.mark.parametrize(
    "args, match",
    [({"fnorm": "mad"}, "fnorm must be 'std' or 'none'"), ({"gamma": 1.5}, r"gamma .*\[0, 1\]")],
)
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        ADVANTAGE_FN.get("gigpo")(**args)


def test_algorithm_type_defaults():
    config = ALGORITHM_TYPE.get("gigpo").default_config()
    assert config["advantage_fn"] == "gigpo"
    assert config["policy_loss_fn"] == "ppo"
    assert ADVANTAGE_FN.get("gigpo").default_args() == {
        "omega": 1.0,
        "gamma": 0.95,
        "fnorm": "std",
        "epsilon": 1e-6,
    }
