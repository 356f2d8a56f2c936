"""GRPO's ``std_threshold``: groups whose scores barely differ leave the batch (by hand)."""

import math

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.common.experience import Experience, ExperienceBatch


def make_batch(rewards, groups):
    exps = [
        Experience(tokens=[1, 2, 3], prompt_length=2, reward=r, group_id=g)
        for r, g in zip(rewards, groups, strict=True)
    ]
    return ExperienceBatch.from_experiences(exps, pad_token_id=0)


def grpo(**kwargs):
    return ADVANTAGE_FN.get("grpo")(**kwargs)


def test_constant_and_single_groups_leave_the_batch():
    # a: [1, 0], mean 0.5, unbiased std sqrt(0.5); b: [1, 1], std 0; c: a group of one.
    batch = make_batch([1.0, 0.0, 1.0, 1.0, 0.5], ["a", "a", "b", "b", "c"])
    exps, metrics = grpo(std_threshold=1e-4)(batch)
    assert exps.group_ids == ["a", "a"]
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert torch.allclose(exps.advantages, torch.tensor([[a], [-a]]))
    assert metrics["critic/filtered_count"] == 3.0


def test_a_threshold_above_a_groups_std_drops_it_too():
    # a's std is sqrt(0.5) ~ 0.707; d: [1, 0, 0, 0] has std 0.5 -> only a stays at 0.6
    batch = make_batch([1.0, 0.0, 1.0, 0.0, 0.0, 0.0], ["a", "a", "d", "d", "d", "d"])
    exps, metrics = grpo(std_threshold=0.6)(batch)
    assert exps.group_ids == ["a", "a"]
    assert metrics["critic/filtered_count"] == 4.0


def test_nothing_left_trains_the_batch_as_it_is():
    batch = make_batch([1.0, 1.0, 0.0, 0.0], ["b", "b", "e", "e"])
    exps, metrics = grpo(std_threshold=1e-4)(batch)
    assert len(exps) == 4
    assert torch.allclose(exps.advantages, torch.zeros(4, 1))
    assert metrics["critic/filtered_count"] == 0.0


def test_without_a_threshold_every_row_stays():
    exps, metrics = grpo()(make_batch([1.0, 1.0, 0.5], ["b", "b", "c"]))
    assert len(exps) == 3
    assert "critic/filtered_count" not in metrics


@pytest.mark.parametrize("threshold", [0.0, 1e-4])
def test_differing_groups_are_kept_whatever_the_small_threshold(threshold):
    exps, _ = grpo(std_threshold=threshold)(make_batch([1.0, 0.0], ["a", "a"]))
    assert len(exps) == 2
